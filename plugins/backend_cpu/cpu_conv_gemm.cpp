// Convolutions as one GEMM (contract in cpu_conv_gemm.h; the rule that takes them, and its
// measurements, in cpu_conv_gemm_rule.h).
#include "cpu_conv_gemm.h"

#include <cstdint>
#include <cstring>
#include <string>

#include <oneapi/dnnl/dnnl.hpp>

#include "cpu_access.h"
#include "cpu_activation_kernels.h"
#include "cpu_conv_gemm_rule.h"
#include "cpu_gemm.h"
#include "cpu_primitive_cache.h"

namespace mixtrain::backend_cpu {

namespace {

using dnnl::memory;

// Calls tap(m, t, from) for every output pixel m = (n, i, j) of x [N, H, W, C] and every kernel
// tap t = (kh, kw) in order, `from` being the input pixel (i·s − p + kh·d, j·s − p + kw·d)'s
// first byte, or nullptr where the tap falls outside the image: the walk both column orders of
// im2col share. One row of output pixels per iteration, rows split between the threads.
template <class Tap>
void for_each_tap(const sdk::Conv2dGeometry& g, const sdk::TensorView& x, const Tap& tap) {
  const std::int64_t oh = g.out_height(), ow = g.out_width();
  const std::size_t pixel = static_cast<std::size_t>(g.in_channels) * sdk::dtype_size(x.dtype);
  const auto* src = static_cast<const char*>(x.data);
  const std::int64_t elements = g.batch * oh * ow * g.kernel_h * g.kernel_w * g.in_channels;
#pragma omp parallel for schedule(static) if (parallel_worth(elements))
  for (std::int64_t r = 0; r < g.batch * oh; ++r) {
    const std::int64_t n = r / oh, i = r % oh;
    for (std::int64_t j = 0; j < ow; ++j) {
      for (std::int64_t kh = 0, t = 0; kh < g.kernel_h; ++kh) {
        const std::int64_t h = i * g.stride_h - g.pad_h + kh * g.dilation_h;
        for (std::int64_t kw = 0; kw < g.kernel_w; ++kw, ++t) {
          const std::int64_t w = j * g.stride_w - g.pad_w + kw * g.dilation_w;
          const bool inside = h >= 0 && h < g.height && w >= 0 && w < g.width;
          tap(r * ow + j, t,
              inside ? src + static_cast<std::size_t>((n * g.height + h) * g.width + w) * pixel
                     : nullptr);
        }
      }
    }
  }
}

// cols [M, KH·KW·C] from x [N, H, W, C], bytes as stored: output pixel m's row holds its taps'
// input pixels in (kh, kw) order, zeros outside the image.
void gather_columns(const sdk::Conv2dGeometry& g, const sdk::TensorView& x, void* out) {
  const std::size_t pixel = static_cast<std::size_t>(g.in_channels) * sdk::dtype_size(x.dtype);
  const std::size_t row_bytes = pixel * static_cast<std::size_t>(g.kernel_h * g.kernel_w);
  auto* dst = static_cast<char*>(out);
  for_each_tap(g, x, [&](std::int64_t m, std::int64_t t, const char* from) {
    char* to = dst + static_cast<std::size_t>(m) * row_bytes + static_cast<std::size_t>(t) * pixel;
    if (from == nullptr)
      std::memset(to, 0, pixel);
    else
      std::memcpy(to, from, pixel);
  });
}

// cols [M, C·KH·KW] in OIHW's order, elements of type T (x's bytes as stored): output pixel m's
// row holds, for each channel c, its KH·KW taps in (kh, kw) order, zeros outside the image. The
// product dyᵀ · cols is then dw itself.
template <class T>
void gather_channel_major(const sdk::Conv2dGeometry& g, const sdk::TensorView& x, T* dst) {
  const std::int64_t c = g.in_channels, taps = g.kernel_h * g.kernel_w;
  for_each_tap(g, x, [&](std::int64_t m, std::int64_t t, const char* bytes) {
    T* to = dst + m * c * taps + t;
    if (bytes == nullptr) {
      for (std::int64_t k = 0; k < c; ++k) to[k * taps] = T{};
    } else {
      const T* from = reinterpret_cast<const T*>(bytes);
      for (std::int64_t k = 0; k < c; ++k) to[k * taps] = from[k];
    }
  });
}

// The same for x's dtype, by its element size (1, 2 or 4 bytes: the operands a convolution takes).
void gather_columns_channel_major(const sdk::Conv2dGeometry& g, const sdk::TensorView& x,
                                  void* out) {
  switch (sdk::dtype_size(x.dtype)) {
    case 1:
      gather_channel_major(g, x, static_cast<std::uint8_t*>(out));
      break;
    case 2:
      gather_channel_major(g, x, static_cast<std::uint16_t*>(out));
      break;
    default:
      gather_channel_major(g, x, static_cast<std::uint32_t*>(out));
      break;
  }
}

// The cached reorders of an fp32 [O, C, KH, KW] weight gradient from OHWI into OIHW, overwriting
// or adding (a sum post-op).
struct ProductReorder {
  memory::desc ohwi, oihw;
  dnnl::reorder overwrite, add;
  std::string implementation;
};

ProductReorder& product_reorder(PrimitiveCache& cache, const sdk::Conv2dGeometry& g) {
  const memory::dims dims{g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
  return cache.get<ProductReorder>(
      {0x57475247 /* "WGRG" */, g.out_channels, g.in_channels, g.kernel_h, g.kernel_w},
      [&] {
        ProductReorder r;
        r.ohwi = memory::desc(dims, memory::data_type::f32, memory::format_tag::ohwi);
        r.oihw = memory::desc(dims, memory::data_type::f32, memory::format_tag::oihw);
        const dnnl::reorder::primitive_desc plain(cache.engine(), r.ohwi, cache.engine(), r.oihw);
        dnnl::post_ops sum;
        sum.append_sum(1.0f);
        dnnl::primitive_attr attr;
        attr.set_post_ops(sum);
        const dnnl::reorder::primitive_desc adding(cache.engine(), r.ohwi, cache.engine(), r.oihw,
                                                   attr);
        r.overwrite = dnnl::reorder(plain);
        r.add = dnnl::reorder(adding);
        r.implementation = plain.impl_info_str();
        return r;
      },
      [&] {
        return "weight gradient as a GEMM, OHWI -> OIHW O=" + std::to_string(g.out_channels) +
               " C=" + std::to_string(g.in_channels) + " kernel " + std::to_string(g.kernel_h) +
               "x" + std::to_string(g.kernel_w) + ", fp32";
      });
}

}  // namespace

std::size_t wgrad_gemm_cols_bytes(const sdk::Conv2dGeometry& g, sdk::DType x) {
  if (unit_stride_unpadded_1x1(g)) return 0;
  return static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.kernel_h *
                                  g.kernel_w * g.in_channels) *
         sdk::dtype_size(x);
}

std::size_t wgrad_gemm_product_bytes(const sdk::Conv2dGeometry& g, WgradColumns columns) {
  if ((g.kernel_h == 1 && g.kernel_w == 1) || columns == WgradColumns::oihw) return 0;
  return static_cast<std::size_t>(g.out_channels * g.kernel_h * g.kernel_w * g.in_channels) * 4;
}

void weight_gradient_as_gemm(CpuContext& context, const sdk::Conv2dBackwardWeightsArgs& args,
                             WgradColumns columns, void* cols, float* product) {
  const sdk::Conv2dGeometry& g = args.geometry;
  const std::int64_t pixels = g.batch * g.out_height() * g.out_width();  // M
  const std::int64_t taps = g.kernel_h * g.kernel_w * g.in_channels;     // KH·KW·C
  const bool pointwise = g.kernel_h == 1 && g.kernel_w == 1;
  // dy is [M, O]; cols [M, KH·KW·C] in (kh, kw, c) or OIHW's (c, kh, kw) order; z [O, KH·KW·C]
  // in the same order: dw itself for a 1x1 kernel or OIHW's order.
  sdk::GemmArgs gemm;
  gemm.a = args.dy;
  gemm.a.view.shape = sdk::Shape{pixels, g.out_channels};
  gemm.a.transpose = true;
  gemm.b = args.x;
  const bool oihw = !pointwise && columns == WgradColumns::oihw;
  if (oihw) {
    gather_columns_channel_major(g, args.x.view, cols);
    gemm.b.view.data = cols;
  } else if (!unit_stride_unpadded_1x1(g)) {
    gather_columns(g, args.x.view, cols);
    gemm.b.view.data = cols;
  }
  const bool direct = pointwise || oihw;
  gemm.b.view.shape = sdk::Shape{pixels, taps};
  gemm.c = {direct ? args.dw.data : product, sdk::DType::fp32, sdk::Shape{g.out_channels, taps}};
  gemm.beta = direct && args.accumulate ? 1.0f : 0.0f;
  gemm.compute = args.compute;
  context.gemm().run(gemm);
  if (!direct) {
    PrimitiveCache& cache = context.prims();
    const ProductReorder& r = product_reorder(cache, g);
    cache.execute(args.accumulate ? r.add : r.overwrite,
                  {{DNNL_ARG_FROM, cache.wrap(r.ohwi, product)},
                   {DNNL_ARG_TO, cache.wrap(r.oihw, args.dw.data)}});
  }
  if (!args.dbias.empty())
    sum_columns(context, args.dy.view, pixels, g.out_channels, args.dbias.as<float>(),
                args.accumulate);
}

std::size_t fprop_gemm_cols_bytes(const sdk::Conv2dGeometry& g, sdk::DType x) {
  if (unit_stride_unpadded_1x1(g)) return 0;
  return static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.in_channels) *
         sdk::dtype_size(x);
}

void forward_as_gemm(CpuContext& context, const sdk::Conv2dForwardArgs& args, void* cols) {
  const sdk::Conv2dGeometry& g = args.geometry;
  const std::int64_t pixels = g.batch * g.out_height() * g.out_width();  // M
  // cols [M, C]; w [O, C] read transposed; y [M, O].
  sdk::GemmArgs gemm;
  gemm.a = args.x;
  if (!unit_stride_unpadded_1x1(g)) {
    gather_columns(g, args.x.view, cols);
    gemm.a.view.data = cols;
  }
  gemm.a.view.shape = sdk::Shape{pixels, g.in_channels};
  gemm.b = args.w;
  gemm.b.view.shape = sdk::Shape{g.out_channels, g.in_channels};
  gemm.b.transpose = true;
  gemm.c = {args.y.data, args.y.dtype, sdk::Shape{pixels, g.out_channels}};
  gemm.bias = args.bias;
  gemm.compute = args.compute;
  context.gemm().run(gemm);
}

namespace {

// The GEMM writes dx itself where dx is its product's own layout (stride 1) in a dtype the engine
// writes directly.
bool writes_dx_directly(CpuContext& context, const sdk::Conv2dBackwardDataArgs& args) {
  const sdk::Conv2dGeometry& g = args.geometry;
  return g.stride_h == 1 && g.stride_w == 1 &&
         context.gemm().writes_c_directly(args.dy.view.dtype, args.w.view.dtype, args.dx.dtype,
                                          args.compute);
}

}  // namespace

std::size_t dgrad_gemm_product_bytes(CpuContext& context, const sdk::Conv2dBackwardDataArgs& args) {
  if (writes_dx_directly(context, args)) return 0;
  const sdk::Conv2dGeometry& g = args.geometry;
  return static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.in_channels) * 4;
}

void data_gradient_as_gemm(CpuContext& context, const sdk::Conv2dBackwardDataArgs& args,
                           bool accumulate, float* product) {
  const sdk::Conv2dGeometry& g = args.geometry;
  const bool direct = writes_dx_directly(context, args);
  const std::int64_t oh = g.out_height(), ow = g.out_width(), c = g.in_channels;
  const std::int64_t pixels = g.batch * oh * ow;  // M: dy's pixels
  // dy is [M, O]; w [O, C]; the product [M, C]: dx itself when direct.
  sdk::GemmArgs gemm;
  gemm.a = args.dy;
  gemm.a.view.shape = sdk::Shape{pixels, g.out_channels};
  gemm.b = args.w;
  gemm.b.view.shape = sdk::Shape{g.out_channels, c};
  gemm.c = direct ? sdk::TensorView{args.dx.data, args.dx.dtype, sdk::Shape{pixels, c}}
                  : sdk::TensorView{product, sdk::DType::fp32, sdk::Shape{pixels, c}};
  gemm.beta = direct && accumulate ? 1.0f : 0.0f;
  gemm.compute = args.compute;
  context.gemm().run(gemm);
  if (direct) return;
  if (g.stride_h == 1 && g.stride_w == 1) {
    // A 16-bit dx at stride 1 (never accumulating: the rule adds into fp32 only): the product
    // rounded once, as a whole.
    encode_tensor(args.dx, product, pixels * c);
    return;
  }
  // x [N, H, W, C]: a row of pixels (n, h) at a time; h on the stride takes dy's row h / sh, and
  // each of its pixels on the stride the product's pixel w / sw.
  const std::int64_t rows = g.batch * g.height;
  const std::size_t element_bytes = sdk::dtype_size(args.dx.dtype);
  const std::size_t pixel_bytes = static_cast<std::size_t>(c) * element_bytes;
  char* dx = static_cast<char*>(args.dx.data);
#pragma omp parallel for schedule(static) if (parallel_worth(args.dx.numel()))
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t n = r / g.height, h = r % g.height;
    const bool row_hit = h % g.stride_h == 0;
    for (std::int64_t w = 0; w < g.width; ++w) {
      const std::int64_t at = (r * g.width + w) * c;  // x pixel's first element
      if (!row_hit || w % g.stride_w != 0) {
        if (!accumulate) std::memset(dx + at * element_bytes, 0, pixel_bytes);
        continue;
      }
      const float* z = product + ((n * oh + h / g.stride_h) * ow + w / g.stride_w) * c;
      if (accumulate) {
        float* d = args.dx.as<float>() + at;  // fp32 (checked by the rule)
#pragma omp simd
        for (std::int64_t k = 0; k < c; ++k) d[k] += z[k];
      } else {
        commit_chunk(args.dx, at, c, z);
      }
    }
  }
}

}  // namespace mixtrain::backend_cpu
