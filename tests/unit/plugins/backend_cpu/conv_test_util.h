// What the convolution facet's tests share (test_backend_cpu_convolution.cpp,
// test_backend_cpu_conv_gemm.cpp): a geometry from its numbers, the channels-last shapes of x, y
// and OIHW w, and the accumulating data gradient's check against the overwriting one.
#pragma once

#include <cstdint>
#include <string>

#include "backend_test_util.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu::testing {

// [N, H, W, C] = [n, h, w, c] convolved by o kernels of kh x kw, square stride and padding.
inline sdk::Conv2dGeometry geometry(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                                    std::int64_t o, std::int64_t kh, std::int64_t kw,
                                    std::int64_t stride, std::int64_t pad,
                                    std::int64_t groups = 1) {
  sdk::Conv2dGeometry g;
  g.batch = n;
  g.in_channels = c;
  g.height = h;
  g.width = w;
  g.out_channels = o;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = pad;
  g.groups = groups;
  return g;
}

inline Shape x_shape(const sdk::Conv2dGeometry& g) {
  return Shape{g.batch, g.height, g.width, g.in_channels};
}
inline Shape y_shape(const sdk::Conv2dGeometry& g) {
  return Shape{g.batch, g.out_height(), g.out_width(), g.out_channels};
}
inline Shape w_shape(const sdk::Conv2dGeometry& g) {
  return Shape{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
}

// conv2d_backward_data_accumulate into an fp32 dx0 gives dx0 + what conv2d_backward_data writes
// into fp32, bit for bit (dy, w and dx0 random from seed, seed + 1, seed + 2); returns the
// implementation the accumulating call ran.
inline std::string expect_accumulate_adds_the_overwritten(CpuBackend& be,
                                                          const sdk::Conv2dGeometry& g, DType t,
                                                          std::uint32_t seed) {
  auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
  DeviceTensor dy(be, t, y_shape(g), random_values(y_shape(g).numel(), seed));
  DeviceTensor w(be, t, w_shape(g), random_values(w_shape(g).numel(), seed + 1));
  const auto dx0 = random_values(x_shape(g).numel(), seed + 2);
  DeviceTensor apart(be, DType::fp32, x_shape(g)), sum(be, DType::fp32, x_shape(g), dx0);
  sdk::Conv2dBackwardDataArgs bd;
  bd.geometry = g;
  bd.dy.view = dy;
  bd.w.view = w;
  bd.dx = apart;
  conv.conv2d_backward_data(bd);
  bd.dx = sum;
  conv.conv2d_backward_data_accumulate(bd);
  const auto a = apart.get(), got = sum.get();
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != dx0[i] + a[i]) {
      ADD_FAILURE() << sdk::dtype_name(t) << " element " << i << ": " << got[i] << " against "
                    << dx0[i] + a[i];
      break;
    }
  return be.last_conv_implementation();
}

}  // namespace mixtrain::backend_cpu::testing
