// The convolution facet and batch norm of CpuBackend: argument errors name the op and what was
// expected, oneDNN primitives are created once per geometry, the native bf16 convolution agrees
// with exact emulation, conv_algorithm = winograd agrees with the direct convolution and a double
// reference within Winograd's measured error where it runs and is bit-identical to direct
// everywhere else, a weight gradient as one GEMM is within the FP32 sum's bound as the
// convolution is, fp16 max pooling in chunks of images is the fp32 pooling rounded once, and the
// backward ops are the gradients of their forwards (double central differences of the scalar
// loss L = Σ y·r).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "cpu_conv_algorithm.h"
#include "cpu_features.h"
#include "mixtrain/sdk/backend_plan_report.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

// `call` throws sdk::BackendError whose message holds every one of `parts`.
void expect_error(const std::function<void()>& call, std::initializer_list<std::string> parts) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << *parts.begin() << "'";
  } catch (const sdk::BackendError& e) {
    const std::string what = std::string(e.what()) + " HINT: " + e.hint();
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "message: " << what;
  }
}

sdk::Conv2dGeometry geometry(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                             std::int64_t o, std::int64_t kh, std::int64_t kw, std::int64_t stride,
                             std::int64_t pad, std::int64_t groups = 1) {
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

// A square max pooling over [N, H, W, C] = [n, h, w, c].
sdk::Pool2dGeometry pool_geometry(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                                  std::int64_t kernel, std::int64_t stride, std::int64_t pad) {
  sdk::Pool2dGeometry g;
  g.kind = sdk::PoolKind::max;
  g.batch = n;
  g.channels = c;
  g.height = h;
  g.width = w;
  g.kernel_h = g.kernel_w = kernel;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = pad;
  return g;
}

Shape x_shape(const sdk::Conv2dGeometry& g) {
  return Shape{g.batch, g.height, g.width, g.in_channels};
}
Shape y_shape(const sdk::Conv2dGeometry& g) {
  return Shape{g.batch, g.out_height(), g.out_width(), g.out_channels};
}
Shape w_shape(const sdk::Conv2dGeometry& g) {
  return Shape{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
}

TEST(BackendCpuConvolution, BadGeometriesAndShapesNameTheOpAndTheExpectation) {
  CpuBackend be(2);
  const auto g = geometry(2, 3, 8, 8, 4, 3, 3, 1, 1);
  DeviceTensor x(be, DType::fp32, x_shape(g));
  DeviceTensor x_first(be, DType::fp32, Shape{2, 3, 8, 8});  // channels-first
  DeviceTensor w(be, DType::fp32, w_shape(g));
  DeviceTensor y(be, DType::fp32, y_shape(g));
  sdk::Conv2dForwardArgs f;
  f.geometry = g;
  f.x.view = x_first;
  f.w.view = w;
  f.y = y;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f); },
               {"backend_cpu.conv2d_forward", "x is fp32 [2, 3, 8, 8]",
                "[N, H, W, C] = [2, 8, 8, 3]", "to_channels_last"});
  f.x.view = x;
  f.geometry.groups = 2;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f); },
               {"conv2d_forward", "groups = 2 must divide"});
  f.geometry = g;
  f.geometry.kernel_h = 11;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f); },
               {"conv2d_forward", "does not fit"});
  f.geometry = g;
  f.geometry.stride_w = 0;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f); },
               {"geometry.stride_w = 0 must be at least 1"});
  f.geometry = g;
  f.geometry.out_channels = 5;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f); },
               {"w is fp32 [4, 3, 3, 3]", "[O, C/groups, KH, KW] = [5, 3, 3, 3]"});
  f.geometry = g;
  f.compute = DType::bf16;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f); },
               {"compute = bf16"});
  f.compute = DType::fp32;
  f.w.transpose = true;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f); }, {"transpose"});
  f.w.transpose = false;
  DeviceTensor bias(be, DType::fp32, Shape{3});
  f.bias = bias;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f); },
               {"bias", "4 are needed"});

  DeviceTensor dw16(be, DType::bf16, w_shape(g));
  sdk::Conv2dBackwardWeightsArgs bw;
  bw.geometry = g;
  bw.x.view = x;
  bw.dy.view = y;
  bw.dw = dw16;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw); },
               {"backend_cpu.conv2d_backward_weights", "dw", "must be fp32"});
  sdk::Conv2dBackwardDataArgs bd;
  bd.geometry = g;
  bd.dy.view = x;  // the input's shape where the output's is expected
  bd.w.view = w;
  bd.dx = x;
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_data(bd); },
               {"backend_cpu.conv2d_backward_data", "dy", "[N, OH, OW, O] = [2, 8, 8, 4]"});

  sdk::Pool2dGeometry p;
  p.batch = 2;
  p.channels = 3;
  p.height = p.width = 8;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  p.pad_h = 2;
  DeviceTensor px(be, DType::fp32, Shape{2, 8, 8, 3});
  DeviceTensor py(be, DType::fp32, Shape{2, 4, 4, 3});
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_forward(p, px, py, {}); },
               {"backend_cpu.pool2d_forward", "more than half the kernel"});
  p.pad_h = 0;
  DeviceTensor tiny_ws(be, DType::int32, Shape{1});
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_forward(p, px, py, tiny_ws); },
               {"workspace", "bytes are needed"});
  DeviceTensor py16(be, DType::fp16, Shape{2, 4, 4, 3});
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_forward(p, px, py16, {}); },
               {"pooling keeps one dtype"});
  // The SDK lets a backend offer an fp32 dy into a 16-bit dx; oneDNN's pooling takes one dtype,
  // so the CPU neither offers it nor runs it.
  DeviceTensor px16(be, DType::fp16, Shape{2, 8, 8, 3});
  EXPECT_FALSE(sdk::facet<sdk::ConvolutionFacet>(be)->supports(
      sdk::ConvolutionOp::pool2d_backward, std::vector<DType>{DType::fp32, DType::fp16}));
  expect_error(
      [&] { sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_backward(p, py, px16, {}, {}, px16); },
      {"pooling keeps one dtype"});
  expect_error([&] { sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_forward(p, py, px, {}); },
               {"x is fp32 [2, 4, 4, 3]", "[N, H, W, C] = [2, 8, 8, 3]"});

  sdk::BatchNormShape s{12, 4, 1e-5f, false};
  DeviceTensor bx(be, DType::fp32, Shape{12, 4});
  DeviceTensor bx_wrong(be, DType::fp32, Shape{4, 12});
  DeviceTensor by(be, DType::fp32, Shape{12, 4});
  DeviceTensor stat(be, DType::fp32, Shape{4});
  DeviceTensor stat2(be, DType::fp32, Shape{4});
  expect_error(
      [&] {
        sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_forward_training(
            bx_wrong, {}, {}, s, 0.1f, by, stat, stat2, {}, {}, {});
      },
      {"backend_cpu.batchnorm_forward_training", "x is fp32 [4, 12]", "[rows, C] = [12, 4]"});
  expect_error(
      [&] {
        sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_forward_training(bx, stat, {}, s, 0.1f, by,
                                                                        stat, stat2, {}, {}, {});
      },
      {"gamma and beta must be both given"});
  sdk::BatchNormShape one{1, 4, 1e-5f, false};
  DeviceTensor row(be, DType::fp32, Shape{1, 4}), row_y(be, DType::fp32, Shape{1, 4});
  expect_error(
      [&] {
        sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_forward_training(
            row, {}, {}, one, 0.1f, row_y, stat, stat2, {}, {}, {});
      },
      {"more than one value per channel"});
  sdk::BatchNormShape relu = s;
  relu.relu = true;
  DeviceTensor bdx(be, DType::fp32, Shape{12, 4});
  expect_error(
      [&] {
        sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_backward(by, bx, {}, {}, stat, stat2, relu,
                                                                {}, bdx, {}, {}, false);
      },
      {"backend_cpu.batchnorm_backward", "workspace or y"});

  DeviceTensor first(be, DType::fp32, Shape{2, 3, 4, 5});
  DeviceTensor last(be, DType::fp32, Shape{2, 4, 5, 3});
  expect_error(
      [&] { sdk::facet<sdk::ConvolutionFacet>(be)->to_channels_last(first, 7, 4, 5, last); },
      {"backend_cpu.to_channels_last", "not a whole number of 7x4x5 images"});
  DeviceTensor short_last(be, DType::fp32, Shape{2, 4, 5, 2});
  expect_error(
      [&] { sdk::facet<sdk::ConvolutionFacet>(be)->to_channels_last(first, 3, 4, 5, short_last); },
      {"dst", "120 are needed"});
}

TEST(BackendCpuConvolution, PrimitivesAreCreatedOncePerGeometry) {
  CpuBackend be(2);
  auto run_conv = [&](const sdk::Conv2dGeometry& g) {
    DeviceTensor x(be, DType::fp32, x_shape(g), random_values(x_shape(g).numel(), 1));
    DeviceTensor w(be, DType::fp32, w_shape(g), random_values(w_shape(g).numel(), 2));
    DeviceTensor y(be, DType::fp32, y_shape(g));
    DeviceTensor dx(be, DType::fp32, x_shape(g));
    DeviceTensor dw(be, DType::fp32, w_shape(g));
    DeviceTensor db(be, DType::fp32, Shape{g.out_channels});
    sdk::Conv2dForwardArgs f;
    f.geometry = g;
    f.x.view = x;
    f.w.view = w;
    f.bias = db;
    f.y = y;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
    sdk::Conv2dBackwardDataArgs bd;
    bd.geometry = g;
    bd.dy.view = y;
    bd.w.view = w;
    bd.dx = dx;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_data(bd);
    sdk::Conv2dBackwardWeightsArgs bw;
    bw.geometry = g;
    bw.x.view = x;
    bw.dy.view = y;
    bw.dw = dw;
    bw.dbias = db;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
    bw.accumulate = true;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
  };
  const auto g = geometry(4, 16, 8, 8, 16, 3, 3, 1, 1);
  EXPECT_EQ(be.cached_dnnl_primitives(), 0u);
  run_conv(g);
  const std::size_t after_first = be.cached_dnnl_primitives();
  EXPECT_EQ(after_first, 3u);  // forward, backward-data, backward-weights (with their reorders)
  run_conv(g);
  EXPECT_EQ(be.cached_dnnl_primitives(), after_first) << "the second call created primitives";
  run_conv(geometry(4, 16, 8, 8, 32, 1, 1, 2, 0));
  EXPECT_EQ(be.cached_dnnl_primitives(), after_first + 3);

  const sdk::Pool2dGeometry p = pool_geometry(2, 16, 8, 8, 3, 2, 1);
  DeviceTensor px(be, DType::fp32, Shape{2, 8, 8, 16}, random_values(2 * 8 * 8 * 16, 3));
  DeviceTensor py(be, DType::fp32, Shape{2, 4, 4, 16});
  DeviceTensor pdx(be, DType::fp32, Shape{2, 8, 8, 16});
  const std::size_t ws_bytes =
      sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_workspace_bytes(p, DType::fp32);
  DeviceTensor ws(be, DType::int32, Shape{static_cast<std::int64_t>((ws_bytes + 3) / 4)});
  auto run_pool = [&] {
    sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_forward(p, px, py, ws);
    sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_backward(p, py, px, py, ws, pdx);
  };
  run_pool();
  const std::size_t with_pool = be.cached_dnnl_primitives();
  run_pool();
  EXPECT_EQ(be.cached_dnnl_primitives(), with_pool);

  // The plan_report facet (what `train --profile` prints) lists each cached primitive once, by
  // the problem it was made for, with the kernel oneDNN chose for it.
  const auto* plans = sdk::facet<sdk::PlanReportFacet>(be);
  ASSERT_NE(plans, nullptr);
  std::vector<std::string> lines;
  for (const sdk::PlanReport& r : plans->plan_reports())
    if (r.library == "oneDNN convolution and pooling") lines = r.plans;
  EXPECT_EQ(lines.size(), with_pool);
  EXPECT_TRUE(std::is_sorted(lines.begin(), lines.end()));
  auto listed = [&](const std::string& problem) {
    return std::count_if(lines.begin(), lines.end(), [&](const std::string& line) {
      return line.starts_with(problem + ": ") && line.size() > problem.size() + 2;
    });
  };
  EXPECT_EQ(listed("conv2d_forward N=4 C=16 HxW=8x8 O=16 kernel 3x3 stride 1x1 pad 1x1, fp32 -> "
                   "fp32, bias"),
            1);
  EXPECT_EQ(listed("conv2d_backward_weights N=4 C=16 HxW=8x8 O=32 kernel 1x1 stride 2x2 pad 0x0, "
                   "fp32 -> fp32, bias"),
            1);
  EXPECT_EQ(listed("pool2d_backward max N=2 C=16 HxW=8x8 kernel 3x3 stride 2x2 pad 1x1, fp32"), 1);

  sdk::BatchNormShape s{128, 16, 1e-5f, true};
  DeviceTensor bx(be, DType::fp32, Shape{2, 8, 8, 16}, random_values(2 * 8 * 8 * 16, 4));
  DeviceTensor by(be, DType::fp32, Shape{2, 8, 8, 16});
  DeviceTensor bdx(be, DType::fp32, Shape{2, 8, 8, 16});
  DeviceTensor gamma(be, DType::fp32, Shape{16}, random_values(16, 5, 0.5f, 1.5f));
  DeviceTensor beta(be, DType::fp32, Shape{16}, random_values(16, 6));
  DeviceTensor mean(be, DType::fp32, Shape{16}), var(be, DType::fp32, Shape{16});
  DeviceTensor dg(be, DType::fp32, Shape{16}), dbeta(be, DType::fp32, Shape{16});
  const std::size_t bn_ws_bytes =
      sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_workspace_bytes(s, DType::fp32);
  EXPECT_GT(bn_ws_bytes, 0u);
  DeviceTensor bn_ws(be, DType::int32, Shape{static_cast<std::int64_t>((bn_ws_bytes + 3) / 4)});
  auto run_bn = [&] {
    sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_forward_training(bx, gamma, beta, s, 0.1f, by,
                                                                    mean, var, {}, {}, bn_ws);
    sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_backward(by, bx, by, gamma, mean, var, s, bn_ws,
                                                            bdx, dg, dbeta, false);
  };
  run_bn();
  const std::size_t with_bn = be.cached_dnnl_primitives();
  run_bn();
  EXPECT_EQ(be.cached_dnnl_primitives(), with_bn);
}

TEST(BackendCpuConvolution, NativeBf16AgreesWithExactEmulation) {
  CpuBackend native(2, Bf16GemmPath::automatic, Bf16ConvPath::onednn);
  CpuBackend emulated(2, Bf16GemmPath::automatic, Bf16ConvPath::emulated);
  if (!native.bf16_conv_native())
    GTEST_SKIP() << "oneDNN has no bf16 convolution here: " << native.bf16_conv_note();
  EXPECT_FALSE(emulated.bf16_conv_native());
  for (const auto& g :
       {geometry(4, 16, 8, 8, 32, 3, 3, 1, 1), geometry(3, 8, 9, 7, 8, 3, 3, 2, 1, 8),
        geometry(2, 5, 6, 6, 7, 1, 1, 1, 0)}) {
    const auto xv = representable(random_values(x_shape(g).numel(), 7), DType::bf16);
    const auto wv = representable(random_values(w_shape(g).numel(), 8), DType::bf16);
    const auto dyv = representable(random_values(y_shape(g).numel(), 9), DType::bf16);
    struct Out {
      std::vector<float> y32, y16, dx, dw;
      std::string impl;
    };
    auto run = [&](CpuBackend& be) {
      DeviceTensor x(be, DType::bf16, x_shape(g), xv);
      DeviceTensor w(be, DType::bf16, w_shape(g), wv);
      DeviceTensor dy(be, DType::bf16, y_shape(g), dyv);
      DeviceTensor y32(be, DType::fp32, y_shape(g)), y16(be, DType::bf16, y_shape(g));
      DeviceTensor dx(be, DType::fp32, x_shape(g)), dw(be, DType::fp32, w_shape(g));
      sdk::Conv2dForwardArgs f;
      f.geometry = g;
      f.x.view = x;
      f.w.view = w;
      f.y = y32;
      sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
      Out out;
      out.impl = be.last_conv_implementation();
      f.y = y16;
      sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
      sdk::Conv2dBackwardDataArgs bd;
      bd.geometry = g;
      bd.dy.view = dy;
      bd.w.view = w;
      bd.dx = dx;
      sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_data(bd);
      sdk::Conv2dBackwardWeightsArgs bw;
      bw.geometry = g;
      bw.x.view = x;
      bw.dy.view = dy;
      bw.dw = dw;
      sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
      out.y32 = y32.get();
      out.y16 = y16.get();
      out.dx = dx.get();
      out.dw = dw.get();
      return out;
    };
    const Out a = run(native), b = run(emulated);
    EXPECT_NE(a.impl.find("bf16"), std::string::npos) << a.impl;
    EXPECT_EQ(b.impl.find("bf16"), std::string::npos) << b.impl;
    auto rel = [](const std::vector<float>& p, const std::vector<float>& q) {
      double num = 0, den = 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        num += (double{p[i]} - q[i]) * (double{p[i]} - q[i]);
        den += double{q[i]} * q[i];
      }
      return std::sqrt(num / den);
    };
    // bf16 products are exact in FP32 on both paths: only the summation order differs (and
    // vdpbf16ps's flushing of subnormals, absent with these values). A bf16 y is one rounding.
    EXPECT_LE(rel(a.y32, b.y32), 1e-5) << "forward, fp32 y";
    EXPECT_LE(rel(a.y16, b.y16), 0x1p-8) << "forward, bf16 y";
    EXPECT_LE(rel(a.dx, b.dx), 1e-5) << "backward-data";
    EXPECT_LE(rel(a.dw, b.dw), 1e-5) << "backward-weights";
  }
}

// ||p - q|| / ||q|| over the whole tensor, in double.
double rel_l2(const std::vector<float>& p, const std::vector<float>& q) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    num += (double{p[i]} - q[i]) * (double{p[i]} - q[i]);
    den += double{q[i]} * q[i];
  }
  return std::sqrt(num / den);
}
// max |p - q| / rms(q): the worst element against the tensor's typical magnitude.
double max_rel_rms(const std::vector<float>& p, const std::vector<float>& q) {
  double worst = 0, den = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    worst = std::max(worst, std::abs(double{p[i]} - q[i]));
    den += double{q[i]} * q[i];
  }
  return worst / std::sqrt(den / static_cast<double>(q.size()));
}

// Forward y, backward-data dx and backward-weights dw (and dbias) of a groups-1, dilation-1
// convolution in double, rounded to float once at the end.
struct ConvReference {
  std::vector<float> y, dx, dw, db;
};
ConvReference conv_reference(const sdk::Conv2dGeometry& g, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<float>& b,
                             const std::vector<float>& dy) {
  const std::int64_t oh = g.out_height(), ow = g.out_width(), c_n = g.in_channels,
                     o_n = g.out_channels;
  std::vector<double> y(static_cast<std::size_t>(g.batch * oh * ow * o_n));
  std::vector<double> dx(x.size()), dw(w.size()), db(static_cast<std::size_t>(o_n));
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j)
        for (std::int64_t o = 0; o < o_n; ++o) {
          const auto yi = static_cast<std::size_t>(((n * oh + i) * ow + j) * o_n + o);
          double acc = b.empty() ? 0.0 : b[static_cast<std::size_t>(o)];
          const double d = dy[yi];
          db[static_cast<std::size_t>(o)] += d;
          for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
            for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
              const std::int64_t h = i * g.stride_h - g.pad_h + kh,
                                 v = j * g.stride_w - g.pad_w + kw;
              if (h < 0 || h >= g.height || v < 0 || v >= g.width) continue;
              for (std::int64_t c = 0; c < c_n; ++c) {
                const auto xi =
                    static_cast<std::size_t>(((n * g.height + h) * g.width + v) * c_n + c);
                const auto wi =
                    static_cast<std::size_t>(((o * c_n + c) * g.kernel_h + kh) * g.kernel_w + kw);
                acc += double{x[xi]} * w[wi];
                dx[xi] += d * w[wi];
                dw[wi] += d * x[xi];
              }
            }
          y[yi] = acc;
        }
  auto to_float = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  return {to_float(y), to_float(dx), to_float(dw), to_float(db)};
}

// Every output of one backend's fp32 convolution calls, and oneDNN's implementation of each.
// p against q: rel-L2 at most `rel`, and the worst element at most `rms` of q's rms.
void expect_within(const std::vector<float>& p, const std::vector<float>& q, double rel, double rms,
                   const char* what) {
  EXPECT_LE(rel_l2(p, q), rel) << what;
  EXPECT_LE(max_rel_rms(p, q), rms) << what;
}

struct ConvOutputs {
  std::vector<float> y, y_bias, y16, dx, dw, db, dw_acc, db_acc;
  std::string impl_fwd, impl_bwd_data, impl_bwd_weights;
};
ConvOutputs run_fp32_conv(CpuBackend& be, const sdk::Conv2dGeometry& g,
                          const std::vector<float>& xv, const std::vector<float>& wv,
                          const std::vector<float>& bv, const std::vector<float>& dyv,
                          DType dtype = DType::fp32) {
  DeviceTensor x(be, dtype, x_shape(g), xv), w(be, dtype, w_shape(g), wv);
  DeviceTensor b(be, DType::fp32, Shape{g.out_channels}, bv), dy(be, dtype, y_shape(g), dyv);
  DeviceTensor y(be, DType::fp32, y_shape(g)), y16(be, DType::bf16, y_shape(g));
  DeviceTensor dx(be, DType::fp32, x_shape(g));
  DeviceTensor dw(be, DType::fp32, w_shape(g)), db(be, DType::fp32, Shape{g.out_channels});
  ConvOutputs out;
  sdk::Conv2dForwardArgs f;
  f.geometry = g;
  f.x.view = x;
  f.w.view = w;
  f.y = y;
  sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
  out.impl_fwd = be.last_conv_implementation();
  out.y = y.get();
  f.bias = b;
  sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
  out.y_bias = y.get();
  f.y = y16;  // a bf16 y: the fp32 result encoded once
  sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
  out.y16 = y16.get();
  sdk::Conv2dBackwardDataArgs bd;
  bd.geometry = g;
  bd.dy.view = dy;
  bd.w.view = w;
  bd.dx = dx;
  sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_data(bd);
  out.impl_bwd_data = be.last_conv_implementation();
  out.dx = dx.get();
  sdk::Conv2dBackwardWeightsArgs bw;
  bw.geometry = g;
  bw.x.view = x;
  bw.dy.view = dy;
  bw.dw = dw;
  bw.dbias = db;
  sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
  out.impl_bwd_weights = be.last_conv_implementation();
  out.dw = dw.get();
  out.db = db.get();
  // Accumulating into earlier values: dw += ..., dbias += ...
  dw.set(random_values(dw.view().numel(), 31));
  db.set(random_values(static_cast<std::size_t>(g.out_channels), 32));
  bw.accumulate = true;
  sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
  out.dw_acc = dw.get();
  out.db_acc = db.get();
  return out;
}

// Two runs' outputs within (rel, rms) of expect_within: y with and without bias, dx, dw and the
// accumulated dw. `versus` names q in the messages.
void expect_outputs_within(const ConvOutputs& p, const ConvOutputs& q, double rel, double rms,
                           const std::string& versus) {
  expect_within(p.y, q.y, rel, rms, ("y vs " + versus).c_str());
  expect_within(p.y_bias, q.y_bias, rel, rms, ("y + bias vs " + versus).c_str());
  expect_within(p.dx, q.dx, rel, rms, ("dx vs " + versus).c_str());
  expect_within(p.dw, q.dw, rel, rms, ("dw vs " + versus).c_str());
  expect_within(p.dw_acc, q.dw_acc, rel, rms, ("dw += vs " + versus).c_str());
}
// y, dx and dw within (rel, rms) of the double reference.
void expect_reference_within(const ConvOutputs& p, const ConvReference& ref, double rel,
                             double rms) {
  expect_within(p.y, ref.y, rel, rms, "y vs double");
  expect_within(p.dx, ref.dx, rel, rms, "dx vs double");
  expect_within(p.dw, ref.dw, rel, rms, "dw vs double");
}

// Winograd F(4,3)'s error, measured on these cases (uniform [-1, 1) data, C = 16..64,
// N = 2..32): against the double reference rel-L2 ≤ 8.7e-7 (y), 6.9e-7 (dx), 4.3e-7 (dw), the worst
// element ≤ 5.6e-6 of the tensor's rms (the direct convolution: rel-L2 ≤ 3.8e-7); against the
// direct result rel-L2 ≤ 9.4e-7 and the worst element ≤ 7.6e-6 of the rms. The bounds are ≈ 3-4x
// those: operands rounded to tf32 (rel ≈ 1e-4) or bf16 (1e-3), or a dropped transform term, fail.
constexpr double kWinogradRelL2 = 3e-6;
constexpr double kWinogradMaxRelRms = 3e-5;

TEST(BackendCpuConvolution, WinogradAgreesWithDirectAndTheDoubleReference) {
  CpuBackend direct(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
  CpuBackend wino(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::winograd);
  CpuBackend everywhere(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic,
                        ConvAlgorithm::winograd_everywhere);
  EXPECT_TRUE(direct.conv_algorithm_note().starts_with("conv_algorithm = direct"))
      << direct.conv_algorithm_note();
  if (!wino.conv_winograd_available())
    GTEST_SKIP() << "oneDNN has no fp32 Winograd here (it needs AVX-512): "
                 << wino.conv_algorithm_note();
  EXPECT_NE(wino.conv_algorithm_note().find("wino"), std::string::npos)
      << wino.conv_algorithm_note();
  struct Case {
    sdk::Conv2dGeometry g;
    CpuBackend* be;  // `wino` for a shape its rule takes, else `everywhere`
    bool reference;  // also against the double reference (small shapes only)
  };
  for (const Case& k : {Case{geometry(32, 32, 16, 16, 32, 3, 3, 1, 1), &wino, false},
                        Case{geometry(32, 64, 8, 8, 64, 3, 3, 1, 1), &wino, false},
                        Case{geometry(2, 32, 7, 9, 48, 3, 3, 1, 1), &everywhere, true},
                        Case{geometry(3, 16, 10, 10, 16, 3, 3, 1, 0), &everywhere, true},
                        Case{geometry(2, 64, 4, 4, 32, 3, 3, 1, 1), &everywhere, true}}) {
    const auto& g = k.g;
    SCOPED_TRACE("C=" + std::to_string(g.in_channels) + " O=" + std::to_string(g.out_channels) +
                 " HxW=" + std::to_string(g.height) + "x" + std::to_string(g.width) +
                 " N=" + std::to_string(g.batch) + " pad=" + std::to_string(g.pad_h));
    const auto xv = random_values(x_shape(g).numel(), 41);
    const auto wv = random_values(w_shape(g).numel(), 42);
    const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 43);
    const auto dyv = random_values(y_shape(g).numel(), 44);
    const ConvOutputs a = run_fp32_conv(*k.be, g, xv, wv, bv, dyv);
    const ConvOutputs d = run_fp32_conv(direct, g, xv, wv, bv, dyv);
    for (const std::string* impl : {&a.impl_fwd, &a.impl_bwd_data, &a.impl_bwd_weights})
      EXPECT_NE(impl->find("wino"), std::string::npos) << "not Winograd: " << *impl;
    EXPECT_EQ(d.impl_fwd.find("wino"), std::string::npos) << d.impl_fwd;
    expect_outputs_within(a, d, kWinogradRelL2, kWinogradMaxRelRms, "direct");
    // dbias is Σ dy over N·OH·OW in another order: within 2e-7 of Σ |dy| of the double sum
    // (measured ≤ 6e-8). A bf16 y is one rounding of a value ≤ 3e-6 off.
    for (std::int64_t o = 0; o < g.out_channels; ++o) {
      double sum = 0, abs_sum = 0;
      for (std::size_t i = static_cast<std::size_t>(o); i < dyv.size();
           i += static_cast<std::size_t>(g.out_channels)) {
        sum += dyv[i];
        abs_sum += std::abs(double{dyv[i]});
      }
      const auto c = static_cast<std::size_t>(o);
      EXPECT_NEAR(a.db[c], sum, 2e-7 * abs_sum) << "dbias " << o;
      EXPECT_NEAR(a.db_acc[c] - d.db_acc[c], a.db[c] - d.db[c], 2e-7 * abs_sum) << "dbias += " << o;
    }
    EXPECT_LE(rel_l2(a.y16, d.y16), 0x1p-8);
    if (k.reference)
      expect_reference_within(a, conv_reference(g, xv, wv, {}, dyv), kWinogradRelL2,
                              kWinogradMaxRelRms);
  }
}

// The rule is per direction: the forward wants >= 32 channels in x, backward-data >= 32 in dy,
// backward-weights 16 on both sides (all at >= 2^23 multiply-adds per tap). So 16 -> 32 runs
// backward-data and backward-weights in Winograd and the forward direct, 32 -> 16 the forward and
// backward-weights, 16 -> 16 backward-weights only. The direct directions are bit-identical to
// conv_algorithm = direct, the Winograd ones within its error.
TEST(BackendCpuConvolution, WinogradRuleDecidesPerDirection) {
  CpuBackend direct(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
  CpuBackend wino(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::winograd);
  if (!wino.conv_winograd_available())
    GTEST_SKIP() << "oneDNN has no fp32 Winograd here: " << wino.conv_algorithm_note();
  struct Case {
    sdk::Conv2dGeometry g;  // N·OH·OW·C·O = 2^23, the rule's work threshold
    bool fwd, bwd_data, bwd_weights;
  };
  for (const Case& k : {Case{geometry(16, 16, 32, 32, 32, 3, 3, 1, 1), false, true, true},
                        Case{geometry(16, 32, 32, 32, 16, 3, 3, 1, 1), true, false, true},
                        Case{geometry(32, 16, 32, 32, 16, 3, 3, 1, 1), false, false, true}}) {
    const auto& g = k.g;
    const std::string what =
        std::to_string(g.in_channels) + " -> " + std::to_string(g.out_channels);
    const auto xv = random_values(x_shape(g).numel(), 71);
    const auto wv = random_values(w_shape(g).numel(), 72);
    const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 73);
    const auto dyv = random_values(y_shape(g).numel(), 74);
    const ConvOutputs a = run_fp32_conv(wino, g, xv, wv, bv, dyv);
    const ConvOutputs d = run_fp32_conv(direct, g, xv, wv, bv, dyv);
    auto is_wino = [](const std::string& impl) { return impl.find("wino") != std::string::npos; };
    EXPECT_EQ(is_wino(a.impl_fwd), k.fwd) << what << ": " << a.impl_fwd;
    EXPECT_EQ(is_wino(a.impl_bwd_data), k.bwd_data) << what << ": " << a.impl_bwd_data;
    EXPECT_EQ(is_wino(a.impl_bwd_weights), k.bwd_weights) << what << ": " << a.impl_bwd_weights;
    // Winograd: within its error; direct: the same bits.
    auto agree = [](bool winograd, const std::vector<float>& p, const std::vector<float>& q) {
      if (winograd)
        return rel_l2(p, q) <= kWinogradRelL2 && max_rel_rms(p, q) <= kWinogradMaxRelRms;
      return p.size() == q.size() && std::memcmp(p.data(), q.data(), p.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(agree(k.fwd, a.y, d.y) && agree(k.fwd, a.y_bias, d.y_bias)) << what << ": y";
    EXPECT_TRUE(agree(k.bwd_data, a.dx, d.dx)) << what << ": dx";
    EXPECT_TRUE(agree(k.bwd_weights, a.dw, d.dw) && agree(k.bwd_weights, a.dw_acc, d.dw_acc))
        << what << ": dw";
  }
}

// What Winograd does not compute, what the rule leaves direct, and every operand route other
// than pure fp32 runs exactly as under conv_algorithm = direct: the same kernel, the same bits.
TEST(BackendCpuConvolution, WinogradLeavesEverythingElseBitIdenticalToDirect) {
  CpuBackend direct(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
  CpuBackend wino(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::winograd);
  struct Case {
    sdk::Conv2dGeometry g;
    DType dtype;
    const char* what;
  };
  for (const Case& k :
       {Case{geometry(8, 32, 16, 16, 32, 3, 3, 2, 1), DType::fp32, "stride 2"},
        Case{geometry(8, 64, 16, 16, 64, 1, 1, 1, 0), DType::fp32, "1x1"},
        Case{geometry(8, 64, 16, 16, 64, 3, 3, 1, 1, 2), DType::fp32, "groups 2"},
        Case{geometry(128, 8, 16, 16, 64, 3, 3, 1, 1), DType::fp32, "8 input channels (the rule)"},
        Case{geometry(8, 32, 16, 16, 32, 3, 3, 1, 1), DType::fp32, "2^21 work (the rule)"},
        Case{geometry(2, 32, 8, 8, 32, 3, 3, 1, 1), DType::fp32, "small work (the rule)"},
        Case{geometry(32, 32, 16, 16, 32, 3, 3, 1, 1), DType::bf16, "bf16 operands"},
        Case{geometry(32, 32, 16, 16, 32, 3, 3, 1, 1), DType::fp16, "fp16 operands"},
        Case{geometry(32, 32, 16, 16, 32, 3, 3, 1, 1), DType::tf32, "tf32 operands"}}) {
    const auto& g = k.g;
    const auto xv = representable(random_values(x_shape(g).numel(), 51), k.dtype);
    const auto wv = representable(random_values(w_shape(g).numel(), 52), k.dtype);
    const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 53);
    const auto dyv = representable(random_values(y_shape(g).numel(), 54), k.dtype);
    const ConvOutputs a = run_fp32_conv(wino, g, xv, wv, bv, dyv, k.dtype);
    const ConvOutputs d = run_fp32_conv(direct, g, xv, wv, bv, dyv, k.dtype);
    for (const std::string* impl : {&a.impl_fwd, &a.impl_bwd_data, &a.impl_bwd_weights})
      EXPECT_EQ(impl->find("wino"), std::string::npos) << k.what << ": " << *impl;
    EXPECT_EQ(a.impl_fwd, d.impl_fwd) << k.what;
    EXPECT_EQ(a.impl_bwd_data, d.impl_bwd_data) << k.what;
    EXPECT_EQ(a.impl_bwd_weights, d.impl_bwd_weights) << k.what;
    auto bits = [&](const std::vector<float>& p, const std::vector<float>& q, const char* name) {
      ASSERT_EQ(p.size(), q.size());
      EXPECT_EQ(std::memcmp(p.data(), q.data(), p.size() * sizeof(float)), 0)
          << k.what << ": " << name << " differs";
    };
    bits(a.y, d.y, "y");
    bits(a.y_bias, d.y_bias, "y + bias");
    bits(a.y16, d.y16, "bf16 y");
    bits(a.dx, d.dx, "dx");
    bits(a.dw, d.dw, "dw");
    bits(a.db, d.db, "dbias");
    bits(a.dw_acc, d.dw_acc, "dw +=");
    bits(a.db_acc, d.db_acc, "dbias +=");
  }
  // compute = tf32 on fp32 storage rounds the operands: not the pure fp32 route either.
  const auto g = geometry(32, 32, 16, 16, 32, 3, 3, 1, 1);
  const auto xv = random_values(x_shape(g).numel(), 61);
  const auto wv = random_values(w_shape(g).numel(), 62);
  auto forward_tf32 = [&](CpuBackend& be) {
    DeviceTensor x(be, DType::fp32, x_shape(g), xv), w(be, DType::fp32, w_shape(g), wv);
    DeviceTensor y(be, DType::fp32, y_shape(g));
    sdk::Conv2dForwardArgs f;
    f.geometry = g;
    f.x.view = x;
    f.w.view = w;
    f.y = y;
    f.compute = DType::tf32;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
    EXPECT_EQ(be.last_conv_implementation().find("wino"), std::string::npos);
    return y.get();
  };
  const auto p = forward_tf32(wino), q = forward_tf32(direct);
  EXPECT_EQ(std::memcmp(p.data(), q.data(), p.size() * sizeof(float)), 0) << "compute = tf32";
}

// L = Σ y·r in double.
double loss(const std::vector<float>& y, const std::vector<float>& r) {
  double l = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) l += double{y[i]} * r[i];
  return l;
}

// Central differences of `f` at each element of `values` (step h), against `grad`.
void expect_gradient(std::vector<float>& values, const std::function<double()>& f,
                     const std::vector<float>& grad, float h, double tol, const char* what) {
  ASSERT_EQ(values.size(), grad.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    values[i] = v + h;
    const double up = f();
    values[i] = v - h;
    const double down = f();
    values[i] = v;
    const double fd = (up - down) / (2.0 * static_cast<double>(h));
    EXPECT_NEAR(grad[i], fd, tol * (1.0 + std::abs(fd))) << what << " element " << i;
  }
}

// The plan report's lines for the cached convolutions (problem: implementation).
std::vector<std::string> conv_plans(CpuBackend& be) {
  for (const sdk::PlanReport& r : sdk::facet<sdk::PlanReportFacet>(be)->plan_reports())
    if (r.library == "oneDNN convolution and pooling") return r.plans;
  return {};
}
std::size_t blocked_plans(CpuBackend& be) {
  const auto lines = conv_plans(be);
  return static_cast<std::size_t>(std::count_if(lines.begin(), lines.end(), [](const auto& l) {
    return l.find(", blocked:") != std::string::npos;
  }));
}

// The direct convolution in oneDNN's blocked layout is the same FP32 sum in another order: against
// nhwc, and against the double reference, within what two orders of an FP32 sum give (nhwc's
// direct rel-L2 against double ≤ 3.8e-7 above; measured blocked ≤ 4.2e-7 against double and
// ≤ 2.9e-7 against nhwc, the worst element ≤ 4.5e-6 of the rms). A missing tap or an operand
// rounded to tf32 would be 1e-4 off. Shapes: 3x3 with the rule's 32 channels, a stride of 2, 8
// channels (one AVX2 block: no reorder), 1x1 with channels that pad the blocks, and bf16 operands
// (decoded exactly, then the blocked fp32 kernel).
constexpr double kDirectOrderRelL2 = 2e-6;
constexpr double kDirectOrderMaxRelRms = 2e-5;

TEST(BackendCpuConvolution, BlockedLayoutAgreesWithNhwcAndTheDoubleReference) {
  CpuBackend nhwc(2, Bf16GemmPath::automatic, Bf16ConvPath::emulated, ConvAlgorithm::direct_nhwc);
  CpuBackend blocked(2, Bf16GemmPath::automatic, Bf16ConvPath::emulated,
                     ConvAlgorithm::blocked_everywhere);
  EXPECT_NE(blocked.conv_algorithm_note().find("blocked layout everywhere"), std::string::npos)
      << blocked.conv_algorithm_note();
  struct Case {
    sdk::Conv2dGeometry g;
    DType dtype;
    const char* what;
  };
  for (const Case& k : {Case{geometry(2, 32, 7, 9, 48, 3, 3, 1, 1), DType::fp32, "3x3, 32 -> 48"},
                        Case{geometry(3, 64, 10, 10, 64, 3, 3, 2, 1), DType::fp32, "stride 2"},
                        Case{geometry(3, 8, 6, 6, 8, 3, 3, 1, 1), DType::fp32, "8 channels"},
                        Case{geometry(2, 40, 6, 6, 24, 1, 1, 1, 0), DType::fp32, "1x1, 40 -> 24"},
                        Case{geometry(2, 32, 8, 8, 32, 3, 3, 1, 1), DType::bf16, "bf16"}}) {
    const auto& g = k.g;
    SCOPED_TRACE(k.what);
    const auto xv = representable(random_values(x_shape(g).numel(), 81), k.dtype);
    const auto wv = representable(random_values(w_shape(g).numel(), 82), k.dtype);
    const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 83);
    const auto dyv = representable(random_values(y_shape(g).numel(), 84), k.dtype);
    const std::size_t before = blocked_plans(blocked);
    const ConvOutputs b = run_fp32_conv(blocked, g, xv, wv, bv, dyv, k.dtype);
    const ConvOutputs n = run_fp32_conv(nhwc, g, xv, wv, bv, dyv, k.dtype);
    // forward (with and without bias, fp32 and bf16 y), backward-data, backward-weights (with
    // dbias): each a new blocked primitive.
    EXPECT_GE(blocked_plans(blocked), before + 3);
    EXPECT_EQ(blocked_plans(nhwc), 0u);
    expect_outputs_within(b, n, kDirectOrderRelL2, kDirectOrderMaxRelRms, "nhwc");
    expect_within(b.db, n.db, kDirectOrderRelL2, kDirectOrderMaxRelRms, "dbias vs nhwc");
    expect_within(b.db_acc, n.db_acc, kDirectOrderRelL2, kDirectOrderMaxRelRms, "dbias += vs nhwc");
    EXPECT_LE(rel_l2(b.y16, n.y16), 0x1p-8);
    expect_reference_within(b, conv_reference(g, xv, wv, {}, dyv), kDirectOrderRelL2,
                            kDirectOrderMaxRelRms);
  }
}

// The default algorithm takes the blocked layout by cpu_conv_algorithm.h's rule: on a CPU whose
// direct kernel is oneDNN's AVX2 one, 3x3 convolutions with at least 32 channels on each side
// (backward-data from 28x28 inputs), bit for bit what blocked_everywhere computes; everything
// else, and every convolution on other CPUs, bit for bit nhwc's.
TEST(BackendCpuConvolution, BlockedRuleTakesWide3x3ConvolutionsWhereTheKernelIsAvx2) {
  using D = Direction;
  const sdk::Conv2dGeometry large = geometry(2, 32, 28, 28, 64, 3, 3, 1, 1);
  const sdk::Conv2dGeometry small = geometry(2, 64, 8, 8, 32, 3, 3, 2, 1);
  for (const D dir : {D::forward, D::backward_data, D::backward_weights}) {
    EXPECT_TRUE(blocked_pays(dir, large));
    EXPECT_EQ(blocked_pays(dir, small), dir != D::backward_data);              // 8x8 < 28x28 for dx
    EXPECT_FALSE(blocked_pays(dir, geometry(2, 16, 28, 28, 64, 3, 3, 1, 1)));  // 16 channels in
    EXPECT_FALSE(blocked_pays(dir, geometry(2, 64, 28, 28, 16, 3, 3, 1, 1)));  // 16 out
    EXPECT_FALSE(blocked_pays(dir, geometry(2, 64, 28, 28, 64, 1, 1, 1, 0)));  // 1x1
    EXPECT_FALSE(blocked_pays(dir, geometry(2, 64, 28, 28, 64, 3, 3, 1, 1, 2)));  // groups
    auto dilated = large;
    dilated.dilation_h = dilated.dilation_w = 2;
    EXPECT_FALSE(blocked_pays(dir, dilated));
  }

  CpuBackend rule(2);
  CpuBackend nhwc(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct_nhwc);
  CpuBackend blocked(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic,
                     ConvAlgorithm::blocked_everywhere);
  const bool avx2 = rule.conv_algorithm_note().find("jit:avx2") != std::string::npos;
  for (const auto& g : {large, small, geometry(2, 64, 8, 8, 64, 1, 1, 1, 0)}) {
    const auto xv = random_values(x_shape(g).numel(), 91);
    const auto wv = random_values(w_shape(g).numel(), 92);
    const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 93);
    const auto dyv = random_values(y_shape(g).numel(), 94);
    const ConvOutputs r = run_fp32_conv(rule, g, xv, wv, bv, dyv);
    const ConvOutputs b = run_fp32_conv(blocked, g, xv, wv, bv, dyv);
    const ConvOutputs n = run_fp32_conv(nhwc, g, xv, wv, bv, dyv);
    const auto same = [&](D dir, const std::vector<float>& p, const std::vector<float>& from_b,
                          const std::vector<float>& from_n) {
      const bool taken = avx2 && blocked_pays(dir, g);
      const auto& q = taken ? from_b : from_n;
      EXPECT_EQ(std::memcmp(p.data(), q.data(), p.size() * sizeof(float)), 0)
          << g.kernel_h << "x" << g.kernel_w << " " << g.height << "x" << g.width << ", direction "
          << static_cast<int>(dir) << (taken ? ": not blocked's bits" : ": not nhwc's bits");
    };
    same(D::forward, r.y, b.y, n.y);
    same(D::backward_data, r.dx, b.dx, n.dx);
    same(D::backward_weights, r.dw, b.dw, n.dw);
  }
  EXPECT_EQ(blocked_plans(rule) > 0, avx2) << rule.conv_algorithm_note();
}

TEST(BackendCpuConvolution, ConvBackwardIsTheGradientOfTheForward) {
  CpuBackend be(1);
  for (const auto& g0 :
       {geometry(2, 3, 5, 4, 2, 3, 2, 1, 1), geometry(2, 4, 5, 5, 6, 3, 3, 2, 1, 2)}) {
    auto g = g0;
    g.dilation_w = g.groups == 1 ? 2 : 1;
    auto xv = random_values(x_shape(g).numel(), 11);
    auto wv = random_values(w_shape(g).numel(), 12);
    auto bv = random_values(static_cast<std::size_t>(g.out_channels), 13);
    const auto rv = random_values(y_shape(g).numel(), 14);
    auto forward = [&] {
      DeviceTensor x(be, DType::fp32, x_shape(g), xv), w(be, DType::fp32, w_shape(g), wv);
      DeviceTensor b(be, DType::fp32, Shape{g.out_channels}, bv), y(be, DType::fp32, y_shape(g));
      sdk::Conv2dForwardArgs f;
      f.geometry = g;
      f.x.view = x;
      f.w.view = w;
      f.bias = b;
      f.y = y;
      sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
      return loss(y.get(), rv);
    };
    DeviceTensor x(be, DType::fp32, x_shape(g), xv), w(be, DType::fp32, w_shape(g), wv);
    DeviceTensor r(be, DType::fp32, y_shape(g), rv);
    DeviceTensor dx(be, DType::fp32, x_shape(g)), dw(be, DType::fp32, w_shape(g));
    DeviceTensor db(be, DType::fp32, Shape{g.out_channels});
    sdk::Conv2dBackwardDataArgs bd;
    bd.geometry = g;
    bd.dy.view = r;
    bd.w.view = w;
    bd.dx = dx;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_data(bd);
    sdk::Conv2dBackwardWeightsArgs bw;
    bw.geometry = g;
    bw.x.view = x;
    bw.dy.view = r;
    bw.dw = dw;
    bw.dbias = db;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
    // L is linear in x, w and b: the differences are exact up to the FP32 rounding of y.
    expect_gradient(xv, forward, dx.get(), 0.1f, 1e-4, "dL/dx");
    expect_gradient(wv, forward, dw.get(), 0.1f, 1e-4, "dL/dw");
    expect_gradient(bv, forward, db.get(), 0.1f, 1e-4, "dL/dbias");
  }
}

// conv2d_backward_data_accumulate into an fp32 dx0 gives dx0 + what conv2d_backward_data writes
// into fp32, bit for bit (dy, w and dx0 random from seed, seed + 1, seed + 2); returns the
// implementation the accumulating call ran.
std::string expect_accumulate_adds_the_overwritten(CpuBackend& be, const sdk::Conv2dGeometry& g,
                                                   DType t, std::uint32_t seed) {
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

// convolution 1.1's accumulating data gradient on the convolution's route (conv_gemm =
// convolution, where it is implemented but not offered; cpu_convolution.cpp): dx + what
// conv2d_backward_data writes into an fp32 dx, bit for bit (the same primitive into FP32, one fp32
// addition), for fp32 operands and for bf16 ones on the native or emulated route; a bf16 sum of
// bf16 operands rounded once; any other dx that is not fp32 is refused, and supports() says no.
TEST(BackendCpuConvolution, AccumulatingDataGradientAddsWhatTheOverwritingOneWrites) {
  CpuBackend be(2);
  be.set_conv_gemm(ConvGemm::convolution);  // the convolution's route, offered nowhere
  auto* conv = sdk::facet<sdk::ConvolutionFacet>(be);
  EXPECT_FALSE(conv->supports(sdk::ConvolutionOp::conv2d_backward_data_accumulate,
                              std::vector<DType>{DType::bf16, DType::bf16, DType::fp32}));
  for (DType t : {DType::fp32, DType::bf16})
    for (const auto& g :
         {geometry(2, 16, 8, 8, 16, 3, 3, 1, 1), geometry(3, 8, 9, 7, 8, 3, 3, 2, 1, 8)})
      expect_accumulate_adds_the_overwritten(be, g, t, 31);
  // A 16-bit sum of the operands' dtype (model.fp32_gradient_sums = false): dx = round(dx + the
  // fp32 gradient), rounded once; any other 16-bit dx is refused.
  const auto g = geometry(2, 4, 6, 6, 4, 3, 3, 1, 1);
  DeviceTensor dy(be, DType::bf16, y_shape(g), random_values(y_shape(g).numel(), 34));
  DeviceTensor w(be, DType::bf16, w_shape(g), random_values(w_shape(g).numel(), 35));
  DeviceTensor dx16(be, DType::bf16, x_shape(g), random_values(x_shape(g).numel(), 36));
  DeviceTensor apart(be, DType::fp32, x_shape(g));
  const auto dx0 = dx16.get();
  sdk::Conv2dBackwardDataArgs bd;
  bd.geometry = g;
  bd.dy.view = dy;
  bd.w.view = w;
  bd.dx = apart;
  conv->conv2d_backward_data(bd);
  bd.dx = dx16;
  conv->conv2d_backward_data_accumulate(bd);
  const auto a = apart.get(), got = dx16.get();
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], bf16_to_float(float_to_bf16(dx0[i] + a[i]))) << "element " << i;
  DeviceTensor dx_fp16(be, DType::fp16, x_shape(g));
  bd.dx = dx_fp16;
  expect_error([&] { conv->conv2d_backward_data_accumulate(bd); },
               {"conv2d_backward_data_accumulate", "dx", "fp32"});
}

// The data gradient of an unpadded 1x1 convolution as one GEMM (conv_gemm = gemm,
// cpu_conv_gemm.h) on every operand route, at stride 1, 2 and (2, 3), plain and accumulating:
// an x pixel on the stride is Σ_o dy·w (+ dx0 when accumulating) within the FP32 sum's bound of
// the exact sum, |err| <= γ(O+2)·(Σ|products| + |dx0|) + u·|dx|, plus one rounding into a 16-bit
// dx; a pixel off the stride is +0, or dx0 untouched when accumulating. supports() offers the
// accumulating op where the rule takes the GEMM: under `gemm` for an fp32 dx, under `auto` for
// bf16 operands read natively with AMX-BF16, under `convolution` nowhere; a shape the GEMM does
// not take (a padded 1x1) still adds what the overwriting call writes.
TEST(BackendCpuConvolution, PointwiseDataGradientAsAGemmIsWithinTheFp32SumBound) {
  using C = sdk::ConvolutionOp;
  struct Stride {
    std::int64_t h, w;
  };
  for (const Stride st : {Stride{1, 1}, Stride{2, 2}, Stride{2, 3}})
    for (const auto& [dtype, scale] :
         {std::pair{DType::fp32, 1.0f}, std::pair{DType::bf16, 1.0f}, std::pair{DType::fp16, 1.0f},
          std::pair{DType::fp8_e4m3, 0.5f}})
      for (const auto& [accumulate, dx_dtype] :
           {std::pair{true, DType::fp32}, std::pair{false, DType::fp32},
            std::pair{false, DType::bf16}, std::pair{false, DType::fp16}}) {
        auto g = geometry(3, 24, 7, 8, 40, 1, 1, 1, 0);
        g.stride_h = st.h;
        g.stride_w = st.w;
        SCOPED_TRACE(std::string(sdk::dtype_name(dtype)) + ", stride " + std::to_string(st.h) +
                     "x" + std::to_string(st.w) + (accumulate ? ", accumulating" : ", plain") +
                     " into " + std::string(sdk::dtype_name(dx_dtype)));
        CpuBackend be(2);
        be.set_conv_gemm(ConvGemm::gemm);
        auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
        EXPECT_TRUE(conv.supports(C::conv2d_backward_data_accumulate,
                                  std::vector<DType>{dtype, dtype, DType::fp32}));
        const auto dyv = representable(random_values(y_shape(g).numel(), 71), dtype);
        const auto wv = representable(random_values(w_shape(g).numel(), 72), dtype);
        const auto dx0 = representable(random_values(x_shape(g).numel(), 73), dx_dtype);
        DeviceTensor dy(be, dtype, y_shape(g), dyv), w(be, dtype, w_shape(g), wv);
        DeviceTensor dx(be, dx_dtype, x_shape(g), dx0);
        sdk::Conv2dBackwardDataArgs bd;
        bd.geometry = g;
        bd.dy.view = dy;
        bd.dy.scale_inv = scale;
        bd.w.view = w;
        bd.w.scale_inv = scale;
        bd.dx = dx;
        if (accumulate)
          conv.conv2d_backward_data_accumulate(bd);
        else
          conv.conv2d_backward_data(bd);
        EXPECT_EQ(be.last_conv_implementation().rfind("gemm ", 0), 0u)
            << be.last_conv_implementation();
        const auto got = dx.get();
        const std::int64_t O = g.out_channels, Cn = g.in_channels;
        const std::int64_t oh = g.out_height(), ow = g.out_width();
        const double u = 0x1p-24, gamma = (O + 2) * u / (1.0 - (O + 2) * u);
        const double rounding = dx_dtype == DType::bf16   ? 0x1p-8
                                : dx_dtype == DType::fp16 ? 0x1p-11
                                                          : 0.0;
        int bad = 0;
        for (std::int64_t n = 0; n < g.batch; ++n)
          for (std::int64_t h = 0; h < g.height; ++h)
            for (std::int64_t x = 0; x < g.width; ++x)
              for (std::int64_t c = 0; c < Cn; ++c) {
                const auto e =
                    static_cast<std::size_t>(((n * g.height + h) * g.width + x) * Cn + c);
                const double base = accumulate ? dx0[e] : 0.0;
                if (h % st.h != 0 || x % st.w != 0) {
                  // Off the stride: nothing of the product reaches it.
                  if (got[e] != base || (!accumulate && std::signbit(got[e])))
                    if (++bad <= 3)
                      ADD_FAILURE() << "dx[" << e << "] = " << got[e] << ", want " << base
                                    << " (off the stride)";
                  continue;
                }
                const std::int64_t m = (n * oh + h / st.h) * ow + x / st.w;  // dy's pixel
                double exact = 0.0, magnitude = 0.0;
                for (std::int64_t o = 0; o < O; ++o) {
                  const double p = double{dyv[static_cast<std::size_t>(m * O + o)]} *
                                   wv[static_cast<std::size_t>(o * Cn + c)] * scale * scale;
                  exact += p;
                  magnitude += std::abs(p);
                }
                const double want = exact + base;
                const double bound = gamma * (magnitude + std::abs(base)) + u * std::abs(want) +
                                     rounding * (std::abs(want) + gamma * magnitude);
                if (std::abs(got[e] - want) > bound && ++bad <= 3)
                  ADD_FAILURE() << "dx[" << e << "] = " << got[e] << ", exact " << want
                                << ", bound " << bound;
              }
        // A 16-bit sum is not the GEMM's: refused by supports(), run by the convolution.
        EXPECT_FALSE(conv.supports(C::conv2d_backward_data_accumulate,
                                   std::vector<DType>{DType::bf16, DType::bf16, DType::bf16}));
      }
  // A padded 1x1: the convolution's route, dx0 + the overwriting call's dx exactly.
  CpuBackend be(2);
  be.set_conv_gemm(ConvGemm::gemm);
  EXPECT_NE(expect_accumulate_adds_the_overwritten(be, geometry(2, 8, 7, 7, 16, 1, 1, 2, 1),
                                                   DType::bf16, 74)
                .rfind("gemm ", 0),
            0u);
  // What auto and convolution offer.
  CpuBackend automatic(1), never(1);
  never.set_conv_gemm(ConvGemm::convolution);
  const bool amx_native =
      detect_cpu().has("amx_bf16") && automatic.bf16_conv_native() && automatic.bf16_gemm_native();
  const std::vector<DType> bf16_sum{DType::bf16, DType::bf16, DType::fp32};
  const std::vector<DType> fp32_sum{DType::fp32, DType::fp32, DType::fp32};
  EXPECT_EQ(sdk::facet<sdk::ConvolutionFacet>(automatic)->supports(
                C::conv2d_backward_data_accumulate, bf16_sum),
            amx_native);
  EXPECT_FALSE(sdk::facet<sdk::ConvolutionFacet>(automatic)->supports(
      C::conv2d_backward_data_accumulate, fp32_sum));
  EXPECT_FALSE(sdk::facet<sdk::ConvolutionFacet>(never)->supports(
      C::conv2d_backward_data_accumulate, bf16_sum));
}

// Convolution facet 1.2: a call takes its scratch (decoded operands, the fp32 output before its
// rounding, activations in a blocked layout) from a workspace of the bytes conv2d_workspace_bytes
// asked for, at any alignment, and none of the backend's own grows; its outputs are the call's
// without a workspace, bit for bit. A workspace too small leaves the call to the backend's own.
TEST(BackendCpuConvolution, ACallsScratchComesFromTheWorkspaceItAskedFor) {
  struct Case {
    Bf16ConvPath bf16;
    ConvAlgorithm algorithm;
    DType dtype, compute;
    sdk::Conv2dGeometry g;
    const char* what;
  };
  const std::vector<Case> cases = {
      {Bf16ConvPath::emulated, ConvAlgorithm::direct_nhwc, DType::bf16, DType::fp32,
       geometry(2, 16, 8, 8, 24, 3, 3, 1, 1), "bf16 decoded, nhwc"},
      {Bf16ConvPath::emulated, ConvAlgorithm::blocked_everywhere, DType::bf16, DType::fp32,
       geometry(2, 32, 8, 8, 32, 3, 3, 1, 1), "bf16 decoded, blocked layout"},
      {Bf16ConvPath::emulated, ConvAlgorithm::winograd_everywhere, DType::fp32, DType::fp32,
       geometry(2, 32, 10, 10, 32, 3, 3, 1, 1), "fp32, winograd"},
      {Bf16ConvPath::emulated, ConvAlgorithm::direct_nhwc, DType::fp32, DType::tf32,
       geometry(2, 8, 6, 6, 16, 1, 1, 2, 0), "tf32 rounded, 1x1 stride 2"}};
  using C = sdk::ConvolutionOp;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const auto& g = k.g;
    const auto xv = representable(random_values(x_shape(g).numel(), 91), k.dtype);
    const auto wv = representable(random_values(w_shape(g).numel(), 92), k.dtype);
    const auto dyv = representable(random_values(y_shape(g).numel(), 93), k.dtype);
    // Every call on a fresh backend, with the workspace of `size` bytes (asked: the query's)
    // starting `shift` bytes past a 64-byte boundary; the outputs, the bytes asked, and how much
    // of the backend's own scratch grew.
    struct Run {
      std::vector<std::vector<float>> outputs;
      std::vector<std::size_t> asked;
      std::size_t grew = 0;
    };
    const auto run = [&](bool with_workspace, bool too_small, std::size_t shift) {
      CpuBackend be(1, Bf16GemmPath::automatic, k.bf16, k.algorithm);
      auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
      const auto& scratch = *sdk::facet<sdk::ScratchFacet>(be);
      DeviceTensor x(be, k.dtype, x_shape(g), xv), w(be, k.dtype, w_shape(g), wv);
      DeviceTensor dy(be, k.dtype, y_shape(g), dyv), y(be, k.dtype, y_shape(g));
      DeviceTensor dx(be, k.dtype, x_shape(g)), dw(be, DType::fp32, w_shape(g));
      Run r;
      sdk::Conv2dWorkspaceQuery q;
      q.geometry = g;
      q.a = q.b = q.out = k.dtype;
      q.compute = k.compute;
      // The workspace for one call: its bytes from the query, or 4 when too small.
      std::vector<std::byte> memory;
      const auto space = [&](C op, DType out) -> TensorView {
        q.op = op;
        q.out = out;
        const std::size_t bytes = conv.conv2d_workspace_bytes(q);
        r.asked.push_back(bytes);
        if (!with_workspace) return {};
        const std::size_t size = too_small ? 4 : bytes;
        memory.assign(size + 128, std::byte{0xFF});
        auto* at = reinterpret_cast<std::byte*>(
            (reinterpret_cast<std::uintptr_t>(memory.data()) + 63) / 64 * 64 + shift);
        return {at, DType::fp32, Shape{static_cast<std::int64_t>((size + 3) / 4)}};
      };
      const std::size_t before = scratch.scratch_bytes();
      sdk::Conv2dForwardArgs f;
      f.geometry = g;
      f.x.view = x;
      f.w.view = w;
      f.y = y;
      f.compute = k.compute;
      conv.conv2d_forward_with_workspace(f, space(C::conv2d_forward, k.dtype));
      sdk::Conv2dBackwardDataArgs bd;
      bd.geometry = g;
      bd.dy.view = dy;
      bd.w.view = w;
      bd.dx = dx;
      bd.compute = k.compute;
      conv.conv2d_backward_data_with_workspace(bd, space(C::conv2d_backward_data, k.dtype));
      sdk::Conv2dBackwardWeightsArgs bw;
      bw.geometry = g;
      bw.x.view = x;
      bw.dy.view = dy;
      bw.dw = dw;
      bw.compute = k.compute;
      conv.conv2d_backward_weights_with_workspace(bw,
                                                  space(C::conv2d_backward_weights, DType::fp32));
      r.grew = scratch.scratch_bytes() - before;
      r.outputs = {y.get(), dx.get(), dw.get()};
      return r;
    };
    const Run plain = run(false, false, 0);
    for (const std::size_t shift : {std::size_t{0}, std::size_t{1}, std::size_t{36}}) {
      const Run lent = run(true, false, shift);
      EXPECT_EQ(lent.outputs, plain.outputs) << "shift " << shift;
      EXPECT_EQ(lent.grew, 0u) << "the backend's own scratch grew, shift " << shift;
    }
    EXPECT_GT(plain.grew, 0u) << "without a workspace the calls use the backend's own scratch";
    const std::size_t asked = *std::max_element(plain.asked.begin(), plain.asked.end());
    EXPECT_GT(asked, 0u);
    // Enough (nothing grew above), and no more than the slots themselves: the largest call asks
    // at most what the three calls grew them to, plus its parts' 64-byte roundings.
    EXPECT_LE(asked, plain.grew + 64 * 8);
    const Run small = run(true, true, 0);
    EXPECT_EQ(small.outputs, plain.outputs);
    EXPECT_EQ(small.grew, plain.grew) << "a workspace too small leaves the calls to the backend";
  }
  // The option conv_workspace = false: nothing asked of the caller.
  CpuBackend off(1, Bf16GemmPath::automatic, Bf16ConvPath::emulated, ConvAlgorithm::direct_nhwc);
  off.set_conv_workspace(false);
  sdk::Conv2dWorkspaceQuery q;
  q.geometry = cases[0].g;
  q.a = q.b = q.out = DType::bf16;
  EXPECT_EQ(sdk::facet<sdk::ConvolutionFacet>(off)->conv2d_workspace_bytes(q), 0u);
}

// A weight gradient as one GEMM (conv_gemm = gemm, cpu_wgrad_gemm.h) on every operand route and
// on 1x1, padded, strided, dilated and non-square kernels: dw and dbias, overwritten and
// accumulated, within the FP32 summation bound of the exact (double) sum for every element —
// |err| <= γ(K+2)·Σ|products| with γ(n) = n·u / (1 − n·u), u = 2^-24, K = N·OH·OW summed terms
// plus the fp8 scale's and the accumulate's roundings — as the convolution is; repeatable bit for
// bit; its gathered columns and product from the workspace it asked for; and the calls the GEMM
// cannot take stay on the convolution.
struct WgradCase {
  DType dtype;
  DType compute;
  float scale_x, scale_dy;  // fp8 scale_inv (1 otherwise)
  bool bias;
  sdk::Conv2dGeometry g;
  const char* what;
};

// dw and dbias by one backend, overwritten then accumulated into `dw0` / `db0`, and the
// implementation that ran.
struct WgradOut {
  std::vector<float> dw, db, dw_acc, db_acc;
  std::string impl;
};
WgradOut run_wgrad(ConvGemm choice, const WgradCase& k, const std::vector<float>& xv,
                   const std::vector<float>& dyv, const std::vector<float>& dw0,
                   const std::vector<float>& db0) {
  CpuBackend be(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
  be.set_conv_gemm(choice);
  const auto& g = k.g;
  DeviceTensor x(be, k.dtype, x_shape(g), xv), dy(be, k.dtype, y_shape(g), dyv);
  DeviceTensor dw(be, DType::fp32, w_shape(g)), db(be, DType::fp32, Shape{g.out_channels});
  sdk::Conv2dBackwardWeightsArgs bw;
  bw.geometry = g;
  bw.x.view = x;
  bw.x.scale_inv = k.scale_x;
  bw.dy.view = dy;
  bw.dy.scale_inv = k.scale_dy;
  bw.dw = dw;
  if (k.bias) bw.dbias = db;
  bw.compute = k.compute;
  auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
  conv.conv2d_backward_weights(bw);
  WgradOut out;
  out.impl = be.last_conv_implementation();
  out.dw = dw.get();
  out.db = k.bias ? db.get() : std::vector<float>{};
  dw.set(dw0);
  db.set(db0);
  bw.accumulate = true;
  conv.conv2d_backward_weights(bw);
  out.dw_acc = dw.get();
  out.db_acc = k.bias ? db.get() : std::vector<float>{};
  return out;
}

TEST(BackendCpuConvolution, WeightGradientAsAGemmIsWithinTheFp32SumBound) {
  sdk::Conv2dGeometry uneven = geometry(2, 12, 9, 7, 20, 1, 1, 1, 0);
  uneven.stride_h = 2;
  uneven.stride_w = 3;
  sdk::Conv2dGeometry dilated = geometry(2, 8, 9, 9, 12, 3, 3, 1, 2);
  dilated.dilation_h = dilated.dilation_w = 2;
  sdk::Conv2dGeometry oblong = geometry(2, 6, 7, 8, 10, 3, 2, 1, 0);
  oblong.pad_h = 1;
  const std::vector<WgradCase> cases = {
      {DType::fp32, DType::fp32, 1.0f, 1.0f, true, geometry(3, 24, 6, 5, 40, 1, 1, 1, 0),
       "fp32, 1x1, bias"},
      {DType::bf16, DType::fp32, 1.0f, 1.0f, true, geometry(2, 32, 7, 9, 16, 1, 1, 2, 0),
       "bf16, 1x1 stride 2 on odd sizes, bias"},
      {DType::bf16, DType::fp32, 1.0f, 1.0f, false, uneven, "bf16, 1x1 strides 2 and 3"},
      {DType::bf16, DType::fp32, 1.0f, 1.0f, true, geometry(2, 16, 9, 7, 24, 3, 3, 2, 1),
       "bf16, 3x3 stride 2 padded, bias"},
      {DType::fp32, DType::fp32, 1.0f, 1.0f, false, dilated, "fp32, 3x3 dilation 2"},
      {DType::fp16, DType::fp32, 1.0f, 1.0f, true, oblong, "fp16, 3x2 padded in h only, bias"},
      {DType::bf16, DType::fp32, 1.0f, 1.0f, false, geometry(2, 8, 6, 6, 8, 1, 1, 1, 1),
       "bf16, a padded 1x1"},
      {DType::fp32, DType::tf32, 1.0f, 1.0f, false, geometry(2, 16, 6, 6, 8, 3, 3, 2, 1),
       "tf32 compute on tf32 values, 3x3 stride 2"},
      {DType::fp8_e4m3, DType::fp32, 0.5f, 0.25f, false, geometry(2, 16, 6, 6, 32, 3, 3, 1, 1),
       "fp8 e4m3 with scales, 3x3"}};
  for (const WgradCase& k : cases) {
    SCOPED_TRACE(k.what);
    const auto& g = k.g;
    // tf32: values that tf32 holds (bf16 ones), so its rounding of the operands changes nothing.
    const DType values = k.compute == DType::tf32 ? DType::bf16 : k.dtype;
    const auto xv = representable(random_values(x_shape(g).numel(), 41), values);
    const auto dyv = representable(random_values(y_shape(g).numel(), 42), values);
    const auto dw0 = random_values(w_shape(g).numel(), 43);
    const auto db0 = random_values(static_cast<std::size_t>(g.out_channels), 44);
    const WgradOut gemm = run_wgrad(ConvGemm::gemm, k, xv, dyv, dw0, db0);
    const WgradOut conv = run_wgrad(ConvGemm::convolution, k, xv, dyv, dw0, db0);
    EXPECT_EQ(gemm.impl.rfind("gemm ", 0), 0u) << gemm.impl;
    EXPECT_NE(conv.impl.rfind("gemm ", 0), 0u) << conv.impl;  // oneDNN's own, e.g. x64:gemm:jit
    // The same call again: the same bits.
    const WgradOut again = run_wgrad(ConvGemm::gemm, k, xv, dyv, dw0, db0);
    EXPECT_EQ(again.dw, gemm.dw);
    EXPECT_EQ(again.dw_acc, gemm.dw_acc);
    EXPECT_EQ(again.db, gemm.db);

    // The exact sums in double, with Σ|products| for the bound; dw is [O, C, KH, KW].
    const std::int64_t oh = g.out_height(), ow = g.out_width(), C = g.in_channels,
                       O = g.out_channels, K = g.batch * oh * ow;
    const double scale = double{k.scale_x} * k.scale_dy;
    std::vector<double> dw(w_shape(g).numel()), dw_abs(dw.size());
    std::vector<double> db(static_cast<std::size_t>(O)), db_abs(db.size());
    for (std::int64_t n = 0; n < g.batch; ++n)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j)
          for (std::int64_t o = 0; o < O; ++o) {
            const double d = dyv[static_cast<std::size_t>(((n * oh + i) * ow + j) * O + o)];
            db[static_cast<std::size_t>(o)] += d * k.scale_dy;
            db_abs[static_cast<std::size_t>(o)] += std::abs(d * k.scale_dy);
            for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const std::int64_t h = i * g.stride_h - g.pad_h + kh * g.dilation_h,
                                   w = j * g.stride_w - g.pad_w + kw * g.dilation_w;
                if (h < 0 || h >= g.height || w < 0 || w >= g.width) continue;
                for (std::int64_t c = 0; c < C; ++c) {
                  const double xe =
                      xv[static_cast<std::size_t>(((n * g.height + h) * g.width + w) * C + c)];
                  const auto at =
                      static_cast<std::size_t>(((o * C + c) * g.kernel_h + kh) * g.kernel_w + kw);
                  dw[at] += d * xe * scale;
                  dw_abs[at] += std::abs(d * xe * scale);
                }
              }
          }
    const double u = 0x1p-24;
    const double gamma = (K + 2) * u / (1.0 - (K + 2) * u);
    const auto within = [&](const std::vector<float>& got, const std::vector<double>& want,
                            const std::vector<double>& abs_sum, const std::vector<float>& base,
                            const char* what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      int bad = 0;
      for (std::size_t e = 0; e < want.size(); ++e) {
        const double b = base.empty() ? 0.0 : base[e];
        const double bound = gamma * (abs_sum[e] + std::abs(b)) + u * std::abs(want[e] + b);
        if (std::abs(got[e] - (want[e] + b)) > bound && ++bad <= 3)
          ADD_FAILURE() << what << "[" << e << "] = " << got[e] << ", exact " << want[e] + b
                        << ", bound " << bound;
      }
    };
    for (const WgradOut* r : {&gemm, &conv}) {
      SCOPED_TRACE(r->impl);
      within(r->dw, dw, dw_abs, {}, "dw");
      within(r->dw_acc, dw, dw_abs, dw0, "dw +=");
      if (k.bias) {
        within(r->db, db, db_abs, {}, "dbias");
        within(r->db_acc, db, db_abs, db0, "dbias +=");
      }
    }
  }
}

TEST(BackendCpuConvolution, WeightGradientAsAGemmTakesItsScratchFromTheWorkspaceItAskedFor) {
  // A 1x1 at stride 2 gathers x's pixels (3 images of 5x4 pixels of 24 bf16 channels); a 3x3 also
  // gathers its columns (9 taps a pixel) and keeps its product [O, 3, 3, C] in fp32 before the
  // reorder into OIHW; a 1x1 at stride 1 reads x where it is and writes dw itself: nothing.
  struct Case {
    sdk::Conv2dGeometry g;
    std::size_t least;
  };
  for (const Case& k :
       {Case{geometry(3, 24, 9, 8, 16, 1, 1, 2, 0), std::size_t{3 * 5 * 4 * 24 * 2}},
        Case{geometry(2, 8, 6, 6, 16, 3, 3, 2, 1),
             std::size_t{2 * 3 * 3 * 9 * 8 * 2 + 16 * 9 * 8 * 4}},
        Case{geometry(3, 24, 9, 8, 16, 1, 1, 1, 0), std::size_t{0}}}) {
    const auto& g = k.g;
    SCOPED_TRACE(::testing::Message()
                 << g.kernel_h << "x" << g.kernel_w << " stride " << g.stride_h);
    const auto xv = representable(random_values(x_shape(g).numel(), 51), DType::bf16);
    const auto dyv = representable(random_values(y_shape(g).numel(), 52), DType::bf16);
    sdk::Conv2dWorkspaceQuery q;
    q.op = sdk::ConvolutionOp::conv2d_backward_weights;
    q.geometry = g;
    q.a = q.b = DType::bf16;
    q.out = DType::fp32;
    const auto run = [&](bool with_workspace, std::size_t* asked, std::size_t* grew) {
      CpuBackend be(1, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
      be.set_conv_gemm(ConvGemm::gemm);
      auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
      const auto& scratch = *sdk::facet<sdk::ScratchFacet>(be);
      DeviceTensor x(be, DType::bf16, x_shape(g), xv), dy(be, DType::bf16, y_shape(g), dyv);
      DeviceTensor dw(be, DType::fp32, w_shape(g));
      *asked = conv.conv2d_workspace_bytes(q);
      std::vector<std::byte> memory(*asked + 64, std::byte{0xFF});
      auto* at = reinterpret_cast<std::byte*>(
          (reinterpret_cast<std::uintptr_t>(memory.data()) + 63) / 64 * 64);
      sdk::Conv2dBackwardWeightsArgs bw;
      bw.geometry = g;
      bw.x.view = x;
      bw.dy.view = dy;
      bw.dw = dw;
      const std::size_t before = scratch.scratch_bytes();
      if (with_workspace)
        conv.conv2d_backward_weights_with_workspace(
            bw, {at, DType::fp32, Shape{static_cast<std::int64_t>((*asked + 3) / 4)}});
      else
        conv.conv2d_backward_weights(bw);
      *grew = scratch.scratch_bytes() - before;
      EXPECT_EQ(be.last_conv_implementation().rfind("gemm ", 0), 0u);
      return dw.get();
    };
    std::size_t asked = 0, grew = 0, asked_lent = 0, grew_lent = 0;
    const auto own = run(false, &asked, &grew);
    const auto lent = run(true, &asked_lent, &grew_lent);
    EXPECT_EQ(lent, own);
    // Where oneDNN has no native bf16 matmul (a CPU without AVX512-BF16), the GEMM engine decodes
    // its operands, dy [M, O] and the columns [M, KH·KW·C], into fp32 scratch of its own, with or
    // without a workspace (cpu_conv_gemm.h).
    const std::size_t pixels = static_cast<std::size_t>(g.batch * g.out_height() * g.out_width());
    const std::size_t engine_own =
        CpuBackend(1).bf16_gemm_native()
            ? 0
            : pixels *
                  static_cast<std::size_t>(g.out_channels +
                                           g.kernel_h * g.kernel_w * g.in_channels) *
                  4;
    if (k.least == 0) {
      EXPECT_EQ(asked, 0u);
      EXPECT_EQ(grew, engine_own);
      continue;
    }
    // Each request from a 64-byte boundary, and 63 bytes for the workspace's own start.
    EXPECT_GE(asked, k.least);
    EXPECT_LE(asked, k.least + 64 * 2 + 63);
    EXPECT_GT(grew, engine_own) << "without a workspace the scratch is the backend's own";
    EXPECT_EQ(grew_lent, engine_own) << "with it, nothing else of the backend's grew";
  }
}

// A 1x1's data gradient as a GEMM keeps its product [N·OH·OW, C] in fp32 before writing it to
// every stride-th pixel, or before rounding it into a 16-bit dx: from the workspace it asked for
// when given one (the same dx, plain and accumulating), from the backend's own scratch otherwise;
// at stride 1 into an fp32 dx it asks for nothing (the GEMM writes dx).
TEST(BackendCpuConvolution, DataGradientAsAGemmTakesItsProductFromTheWorkspaceItAskedFor) {
  struct Case {
    std::int64_t stride;
    DType dx;
    bool accumulate;
    std::size_t least;
  };
  for (const Case& k : {Case{2, DType::fp32, false, 3 * 5 * 4 * 24 * 4},
                        Case{2, DType::fp32, true, 3 * 5 * 4 * 24 * 4},
                        Case{2, DType::bf16, false, 3 * 5 * 4 * 24 * 4},
                        Case{1, DType::bf16, false, 3 * 9 * 8 * 24 * 4},
                        Case{1, DType::fp32, false, 0}, Case{1, DType::fp32, true, 0}}) {
    const std::int64_t stride = k.stride;
    const bool accumulate = k.accumulate;
    const auto g = geometry(3, 24, 9, 8, 16, 1, 1, stride, 0);
    SCOPED_TRACE(::testing::Message() << "stride " << stride << ", dx " << sdk::dtype_name(k.dx)
                                      << (accumulate ? ", +=" : ""));
    const std::size_t least = k.least;
    const auto dyv = representable(random_values(y_shape(g).numel(), 53), DType::bf16);
    const auto wv = representable(random_values(w_shape(g).numel(), 54), DType::bf16);
    const auto dx0 = random_values(x_shape(g).numel(), 55);
    sdk::Conv2dWorkspaceQuery q;
    q.op = accumulate ? sdk::ConvolutionOp::conv2d_backward_data_accumulate
                      : sdk::ConvolutionOp::conv2d_backward_data;
    q.geometry = g;
    q.a = q.b = DType::bf16;
    q.out = k.dx;
    const auto run = [&](bool with_workspace, std::size_t* asked, std::size_t* grew) {
      CpuBackend be(1, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
      be.set_conv_gemm(ConvGemm::gemm);
      auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
      const auto& scratch = *sdk::facet<sdk::ScratchFacet>(be);
      DeviceTensor dy(be, DType::bf16, y_shape(g), dyv), w(be, DType::bf16, w_shape(g), wv);
      DeviceTensor dx(be, k.dx, x_shape(g), dx0);
      *asked = conv.conv2d_workspace_bytes(q);
      std::vector<std::byte> memory(*asked + 64, std::byte{0xFF});
      auto* at = reinterpret_cast<std::byte*>(
          (reinterpret_cast<std::uintptr_t>(memory.data()) + 63) / 64 * 64);
      sdk::Conv2dBackwardDataArgs bd;
      bd.geometry = g;
      bd.dy.view = dy;
      bd.w.view = w;
      bd.dx = dx;
      const TensorView ws{at, DType::fp32, Shape{static_cast<std::int64_t>((*asked + 3) / 4)}};
      const std::size_t before = scratch.scratch_bytes();
      if (accumulate && with_workspace)
        conv.conv2d_backward_data_accumulate_with_workspace(bd, ws);
      else if (accumulate)
        conv.conv2d_backward_data_accumulate(bd);
      else if (with_workspace)
        conv.conv2d_backward_data_with_workspace(bd, ws);
      else
        conv.conv2d_backward_data(bd);
      *grew = scratch.scratch_bytes() - before;
      EXPECT_EQ(be.last_conv_implementation().rfind("gemm ", 0), 0u);
      return dx.get();
    };
    std::size_t asked = 0, grew = 0, asked_lent = 0, grew_lent = 0;
    const auto own = run(false, &asked, &grew);
    const auto lent = run(true, &asked_lent, &grew_lent);
    EXPECT_EQ(lent, own);
    EXPECT_EQ(asked, asked_lent);
    // Where oneDNN has no native bf16 matmul, the GEMM engine decodes dy [M, O] and w [O, C] into
    // fp32 scratch of its own, with or without a workspace (cpu_conv_gemm.h).
    const std::size_t engine_own =
        CpuBackend(1).bf16_gemm_native()
            ? 0
            : static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.out_channels +
                                       g.out_channels * g.in_channels) *
                  4;
    if (least == 0) {
      EXPECT_EQ(asked, 0u);
      EXPECT_EQ(grew, engine_own);
      continue;
    }
    EXPECT_GE(asked, least);
    EXPECT_LE(asked, least + 64 + 63);
    EXPECT_GT(grew, engine_own) << "without a workspace the product is the backend's own scratch";
    EXPECT_EQ(grew_lent, engine_own) << "with it, nothing else of the backend's grew";
  }
}

// What the GEMM does not take (groups, an fp8 dy with a bias gradient) stays on the convolution
// under conv_gemm = gemm; `auto` takes the GEMM only for the 1x1 and wide 3x3 shapes of the
// rule, bf16 operands read natively, with AMX-BF16; and `convolution` never.
TEST(BackendCpuConvolution, WgradGemmRuleTakesOnlyWhatTheGemmComputesAndWhereItPays) {
  const auto impl = [](ConvGemm choice, const sdk::Conv2dGeometry& g, DType dtype, bool bias) {
    CpuBackend be(1, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
    be.set_conv_gemm(choice);
    DeviceTensor x(be, dtype, x_shape(g), random_values(x_shape(g).numel(), 61, -0.5f, 0.5f));
    DeviceTensor dy(be, dtype, y_shape(g), random_values(y_shape(g).numel(), 62, -0.5f, 0.5f));
    DeviceTensor dw(be, DType::fp32, w_shape(g)), db(be, DType::fp32, Shape{g.out_channels});
    sdk::Conv2dBackwardWeightsArgs bw;
    bw.geometry = g;
    bw.x.view = x;
    bw.dy.view = dy;
    bw.dw = dw;
    if (bias) bw.dbias = db;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
    return be.last_conv_implementation();
  };
  const auto is_gemm = [](const std::string& s) { return s.rfind("gemm ", 0) == 0; };
  const sdk::Conv2dGeometry pointwise = geometry(2, 16, 6, 6, 16, 1, 1, 1, 0);
  const sdk::Conv2dGeometry narrow_3x3 = geometry(2, 16, 6, 6, 16, 3, 3, 1, 1);
  EXPECT_TRUE(is_gemm(impl(ConvGemm::gemm, pointwise, DType::fp32, true)));
  EXPECT_TRUE(is_gemm(impl(ConvGemm::gemm, narrow_3x3, DType::fp32, false)));
  EXPECT_FALSE(
      is_gemm(impl(ConvGemm::gemm, geometry(2, 16, 6, 6, 16, 1, 1, 1, 0, 4), DType::fp32, false)))
      << "groups";
  EXPECT_FALSE(is_gemm(impl(ConvGemm::gemm, pointwise, DType::fp8_e4m3, true)))
      << "an fp8 dy with a bias gradient";
  EXPECT_TRUE(is_gemm(impl(ConvGemm::gemm, pointwise, DType::fp8_e4m3, false)));
  for (DType d : {DType::bf16, DType::fp32})
    EXPECT_FALSE(is_gemm(impl(ConvGemm::convolution, pointwise, d, false)));
  EXPECT_FALSE(is_gemm(impl(ConvGemm::automatic, pointwise, DType::fp32, false)))
      << "auto keeps fp32 on the convolution";
  EXPECT_FALSE(is_gemm(impl(ConvGemm::automatic, pointwise, DType::fp16, false)));
  EXPECT_FALSE(is_gemm(impl(ConvGemm::automatic, narrow_3x3, DType::bf16, false)))
      << "auto keeps narrow 3x3s on the convolution";
  CpuBackend probe(1, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
  const bool amx = detect_cpu().has("amx_bf16");
  const bool native = probe.bf16_conv_native() && probe.bf16_gemm_native();
  EXPECT_EQ(is_gemm(impl(ConvGemm::automatic, pointwise, DType::bf16, false)), amx && native)
      << probe.conv_gemm_note();
  EXPECT_NE(probe.conv_gemm_note().find("conv_gemm = auto"), std::string::npos);
  // The rule's shapes, on ResNet-50's convolutions (batch 8) and their neighbours.
  EXPECT_TRUE(wgrad_gemm_pays(geometry(8, 1024, 14, 14, 2048, 1, 1, 2, 0)));
  EXPECT_TRUE(wgrad_gemm_pays(geometry(8, 64, 56, 56, 256, 1, 1, 1, 0)));
  EXPECT_TRUE(wgrad_gemm_pays(geometry(8, 256, 28, 28, 256, 3, 3, 2, 1)));
  EXPECT_TRUE(wgrad_gemm_pays(geometry(8, 512, 7, 7, 512, 3, 3, 1, 1)));
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 256, 14, 14, 256, 3, 3, 1, 1))) << "measured a tie";
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 128, 56, 56, 128, 3, 3, 2, 1)));
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 3, 224, 224, 64, 7, 7, 2, 3))) << "the stem";
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 512, 7, 7, 512, 1, 1, 1, 1))) << "a padded 1x1";
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 512, 7, 7, 512, 3, 3, 1, 1, 2))) << "groups";
}

// fp16 max pooling decodes a chunk of whole images at a time (cpu_pooling.cpp: about 1 MiB of fp32
// source a chunk). Its results are the fp32 pooling's of the whole batch on the decoded values,
// rounded once, bit for bit: forward with and without a workspace, backward through the forward's
// workspace and through indices recomputed from x. Overlapping windows (3x3, stride 2) make the
// backward sum several dy into one dx; values on a coarse grid make ties. 8 images of 24x24x128
// are 3 chunks (3, 3 and 2 images), and the backend's scratch stays below one fp32 copy of x.
TEST(BackendCpuConvolution, Fp16MaxPoolingInImageChunksIsTheFp32PoolingRoundedOnce) {
  const sdk::Pool2dGeometry g = pool_geometry(8, 128, 24, 24, 3, 2, 1);
  const Shape xs{g.batch, g.height, g.width, g.channels};
  const Shape ys{g.batch, g.out_height(), g.out_width(), g.channels};
  auto xv = random_values(static_cast<std::size_t>(xs.numel()), 71, -2.0f, 2.0f);
  for (auto& v : xv) v = std::round(v * 4.0f) / 4.0f;  // a grid of 17 values: many ties
  const auto dyv =
      representable(random_values(static_cast<std::size_t>(ys.numel()), 72), DType::fp16);

  // Whole-batch fp32 on the same values: the reference.
  CpuBackend ref_be(1);
  auto& ref = *sdk::facet<sdk::ConvolutionFacet>(ref_be);
  DeviceTensor x32(ref_be, DType::fp32, xs, xv), y32(ref_be, DType::fp32, ys);
  DeviceTensor dy32(ref_be, DType::fp32, ys, dyv), dx32(ref_be, DType::fp32, xs);
  std::vector<std::byte> ws32(ref.pool2d_workspace_bytes(g, DType::fp32));
  const TensorView ws32v{ws32.data(), DType::fp32, Shape{static_cast<std::int64_t>(ws32.size())}};
  ref.pool2d_forward(g, x32, y32, ws32v);
  ref.pool2d_backward(g, dy32, x32, y32, ws32v, dx32);

  // The reference's values rounded once, as fp16 bits.
  const auto expect_bits = [](const DeviceTensor& got, const std::vector<float>& want,
                              const char* what) {
    const auto* bits = got.view().as<const std::uint16_t>();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      if (bits[i] != float_to_fp16(want[i]) && bad++ < 3)
        ADD_FAILURE() << what << " element " << i << ": " << fp16_to_float(bits[i])
                      << ", the fp32 pooling's " << want[i];
    EXPECT_EQ(bad, 0u) << what;
  };

  CpuBackend be(2);
  auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
  const auto& scratch = *sdk::facet<sdk::ScratchFacet>(be);
  DeviceTensor x(be, DType::fp16, xs, xv), y(be, DType::fp16, ys);
  DeviceTensor dy(be, DType::fp16, ys, dyv), dx(be, DType::fp16, xs);
  const std::size_t ws_bytes = conv.pool2d_workspace_bytes(g, DType::fp16);
  ASSERT_EQ(ws_bytes, ws32.size()) << "fp16 pools in fp32: the same indices";
  std::vector<std::byte> ws(ws_bytes);
  const TensorView wsv{ws.data(), DType::fp32, Shape{static_cast<std::int64_t>(ws.size())}};

  conv.pool2d_forward(g, x, y, wsv);
  expect_bits(y, y32.get(), "forward with a workspace");
  EXPECT_EQ(ws, ws32) << "the chunks' argmax indices are the whole batch's";
  conv.pool2d_backward(g, dy, x, y, wsv, dx);
  expect_bits(dx, dx32.get(), "backward through the workspace");
  EXPECT_LT(scratch.scratch_bytes(), static_cast<std::size_t>(xs.numel()) * sizeof(float))
      << "the decoded scratch is a chunk's, not a copy of x";

  DeviceTensor y_eval(be, DType::fp16, ys), dx_again(be, DType::fp16, xs);
  conv.pool2d_forward(g, x, y_eval, {});
  expect_bits(y_eval, y32.get(), "forward without a workspace");
  conv.pool2d_backward(g, dy, x, y, {}, dx_again);
  expect_bits(dx_again, dx32.get(), "backward through indices recomputed from x");
}

TEST(BackendCpuConvolution, BatchNormBackwardIsTheGradientOfTheTrainingForward) {
  CpuBackend be(1);
  const sdk::BatchNormShape s{12, 3, 1e-5f, false};  // [N, H, W, C] = [2, 2, 3, 3]
  const Shape shape{2, 2, 3, 3};
  auto xv = random_values(36, 21, -1.0f, 2.0f);
  auto gv = random_values(3, 22, 0.5f, 1.5f);
  auto bv = random_values(3, 23);
  const auto rv = random_values(36, 24);
  auto forward = [&] {
    DeviceTensor x(be, DType::fp32, shape, xv), y(be, DType::fp32, shape);
    DeviceTensor gamma(be, DType::fp32, Shape{3}, gv), beta(be, DType::fp32, Shape{3}, bv);
    DeviceTensor mean(be, DType::fp32, Shape{3}), var(be, DType::fp32, Shape{3});
    sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_forward_training(x, gamma, beta, s, 0.1f, y,
                                                                    mean, var, {}, {}, {});
    return loss(y.get(), rv);
  };
  DeviceTensor x(be, DType::fp32, shape, xv), y(be, DType::fp32, shape);
  DeviceTensor gamma(be, DType::fp32, Shape{3}, gv), beta(be, DType::fp32, Shape{3}, bv);
  DeviceTensor mean(be, DType::fp32, Shape{3}), var(be, DType::fp32, Shape{3});
  sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_forward_training(x, gamma, beta, s, 0.1f, y, mean,
                                                                  var, {}, {}, {});
  DeviceTensor r(be, DType::fp32, shape, rv), dx(be, DType::fp32, shape);
  DeviceTensor dg(be, DType::fp32, Shape{3}), db(be, DType::fp32, Shape{3});
  sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_backward(r, x, y, gamma, mean, var, s, {}, dx, dg,
                                                          db, false);
  // h = 1e-2: truncation O(h²) and FP32 rounding of y over 2h both stay below 1e-3.
  expect_gradient(xv, forward, dx.get(), 1e-2f, 2e-3, "dL/dx");
  expect_gradient(gv, forward, dg.get(), 1e-2f, 2e-3, "dL/dgamma");
  expect_gradient(bv, forward, db.get(), 1e-2f, 2e-3, "dL/dbeta");
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
