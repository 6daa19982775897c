// A 1x1 convolution's weight gradient as one GEMM (contract in cpu_pointwise_wgrad.h; the rule
// that takes it, and its measurements, in cpu_conv_algorithm.h).
#include "cpu_pointwise_wgrad.h"

#include <cstdint>
#include <cstring>

#include "cpu_access.h"
#include "cpu_activation_kernels.h"
#include "cpu_gemm.h"

namespace mixtrain::backend_cpu {

namespace {

bool strided(const sdk::Conv2dGeometry& g) {
  return g.stride_h != 1 || g.stride_w != 1;
}

// x̂ [N, OH, OW, C] = x [N, H, W, C] at rows and columns 0, s, 2s, ..., bytes as stored.
void gather_pixels(const sdk::Conv2dGeometry& g, const sdk::TensorView& x, void* out) {
  const std::int64_t oh = g.out_height(), ow = g.out_width();
  const std::size_t pixel = static_cast<std::size_t>(g.in_channels) * sdk::dtype_size(x.dtype);
  const auto* src = static_cast<const char*>(x.data);
  auto* dst = static_cast<char*>(out);
  // One output row of pixels per iteration: OW copies of C channels.
#pragma omp parallel for schedule(static) if (parallel_worth(g.batch * oh * ow * g.in_channels))
  for (std::int64_t row = 0; row < g.batch * oh; ++row) {
    const std::int64_t n = row / oh, i = row % oh;
    const char* from =
        src + static_cast<std::size_t>((n * g.height + i * g.stride_h) * g.width) * pixel;
    char* to = dst + static_cast<std::size_t>(row * ow) * pixel;
    for (std::int64_t j = 0; j < ow; ++j)
      std::memcpy(to + static_cast<std::size_t>(j) * pixel,
                  from + static_cast<std::size_t>(j * g.stride_w) * pixel, pixel);
  }
}

}  // namespace

std::size_t pointwise_gather_bytes(const sdk::Conv2dGeometry& g, sdk::DType x) {
  if (!strided(g)) return 0;
  return static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.in_channels) *
         sdk::dtype_size(x);
}

void pointwise_weight_gradient(CpuContext& context, const sdk::Conv2dBackwardWeightsArgs& args,
                               void* gathered) {
  const sdk::Conv2dGeometry& g = args.geometry;
  const std::int64_t pixels = g.batch * g.out_height() * g.out_width();  // M
  // dy is [M, O]; x̂ [M, C]; dw [O, C].
  sdk::GemmArgs gemm;
  gemm.a = args.dy;
  gemm.a.view.shape = sdk::Shape{pixels, g.out_channels};
  gemm.a.transpose = true;
  gemm.b = args.x;
  if (strided(g)) {
    gather_pixels(g, args.x.view, gathered);
    gemm.b.view.data = gathered;
  }
  gemm.b.view.shape = sdk::Shape{pixels, g.in_channels};
  gemm.c = {args.dw.data, sdk::DType::fp32, sdk::Shape{g.out_channels, g.in_channels}};
  gemm.beta = args.accumulate ? 1.0f : 0.0f;
  gemm.compute = args.compute;
  context.gemm().run(gemm);
  if (!args.dbias.empty())
    sum_columns(context, args.dy.view, pixels, g.out_channels, args.dbias.as<float>(),
                args.accumulate);
}

}  // namespace mixtrain::backend_cpu
