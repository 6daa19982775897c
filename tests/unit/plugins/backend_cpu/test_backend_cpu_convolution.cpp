// The convolution facet and batch norm of CpuBackend: argument errors name the op and what was
// expected, oneDNN primitives are created once per geometry, the native bf16 convolution agrees
// with exact emulation, conv_algorithm = winograd agrees with the direct convolution and a double
// reference within Winograd's measured error where it runs and is bit-identical to direct
// everywhere else, the accumulating data gradient adds what the overwriting one writes, a call's
// scratch comes from the workspace it asked for, fp16 max pooling is the fp32 pooling rounded
// once, and the backward ops are the gradients of their forwards (double central
// differences of the scalar loss L = Σ y·r).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "conv_test_util.h"
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
  // oneDNN's primitives are what this counts: no convolution runs as a GEMM (conv_gemm's rule
  // takes fp32 1x1s on small maps on some CPUs).
  be.set_conv_gemm(ConvGemm::convolution);
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

  sdk::Pool2dGeometry p = pool_geometry(2, 16, 8, 8, 3, 2, 1);
  DeviceTensor px(be, DType::fp32, Shape{2, 8, 8, 16}, random_values(2 * 8 * 8 * 16, 3));
  DeviceTensor py(be, DType::fp32, Shape{2, 4, 4, 16});
  DeviceTensor pdx(be, DType::fp32, Shape{2, 8, 8, 16});
  const std::size_t ws_bytes =
      sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_workspace_bytes(p, DType::fp32);
  DeviceTensor ws(be, DType::int32, Shape{static_cast<std::int64_t>((ws_bytes + 3) / 4)});
  sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_forward(p, px, py, ws);
  sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_backward(p, py, px, py, ws, pdx);
  EXPECT_EQ(be.cached_dnnl_primitives(), after_first + 3) << "max pooling is the backend's own";
  p.kind = sdk::PoolKind::average;
  auto run_pool = [&] {
    sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_forward(p, px, py, {});
    sdk::facet<sdk::ConvolutionFacet>(be)->pool2d_backward(p, py, px, py, {}, pdx);
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
  EXPECT_EQ(listed("pool2d_backward average N=2 C=16 HxW=8x8 kernel 3x3 stride 2x2 pad 1x1, fp32"),
            1);

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
  // The layouts of oneDNN's convolution are what this compares, not conv_gemm's GEMMs.
  nhwc.set_conv_gemm(ConvGemm::convolution);
  blocked.set_conv_gemm(ConvGemm::convolution);
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

// fp16 max pooling decodes a window's rows at a time (cpu_max_pool.h). Its results are the fp32
// pooling's on the decoded values, rounded once, bit for bit: forward with and without a
// workspace, backward through the forward's workspace and through indices recomputed from x, on
// two threads against one. Overlapping windows (3x3, stride 2) make the backward sum several dy
// into one dx; values on a coarse grid make ties. The backend's scratch stays below one fp32 copy
// of x.
TEST(BackendCpuConvolution, Fp16MaxPoolingIsTheFp32PoolingOnTheDecodedValuesRoundedOnce) {
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
  EXPECT_EQ(ws, ws32) << "the indices are the fp32 pooling's";
  conv.pool2d_backward(g, dy, x, y, wsv, dx);
  expect_bits(dx, dx32.get(), "backward through the workspace");
  EXPECT_LT(scratch.scratch_bytes(), static_cast<std::size_t>(xs.numel()) * sizeof(float))
      << "the decoded scratch is a few rows, not a copy of x";

  DeviceTensor y_eval(be, DType::fp16, ys), dx_again(be, DType::fp16, xs);
  conv.pool2d_forward(g, x, y_eval, {});
  expect_bits(y_eval, y32.get(), "forward without a workspace");
  conv.pool2d_backward(g, dy, x, y, {}, dx_again);
  expect_bits(dx_again, dx32.get(), "backward through indices recomputed from x");
}

// A window of more than 256 elements keeps int32 indices (cpu_max_pool.h): a global max pooling of
// 17x17 maps (289 positions; a byte would wrap at 256) in fp32 and bf16. y is each channel's
// maximum, its first occurrence's dy goes to it and nothing else, a NaN anywhere gives the
// canonical NaN, a channel of -inf gives -inf; the same on one thread and on two, and from x alone.
TEST(BackendCpuConvolution, MaxPoolingOverMoreThan256PositionsKeepsWholeIndices) {
  const sdk::Pool2dGeometry g = pool_geometry(2, 5, 17, 17, 17, 1, 0);
  const std::int64_t positions = 17 * 17;
  const Shape xs{2, 17, 17, 5}, ys{2, 1, 1, 5};
  auto xv = random_values(static_cast<std::size_t>(xs.numel()), 81, -2.0f, 2.0f);
  for (auto& v : xv) v = std::round(v * 2.0f) / 2.0f;  // ties everywhere
  // Sample 0: channel 1's maximum at position 300 > 256, channel 2 holds a NaN, channel 3 is -inf.
  auto at = [&](std::int64_t n, std::int64_t p, std::int64_t c) -> float& {
    return xv[static_cast<std::size_t>((n * positions + p) * 5 + c)];
  };
  at(0, 280, 1) = 9.0f;
  at(0, 270, 2) = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t p = 0; p < positions; ++p)
    at(0, p, 3) = -std::numeric_limits<float>::infinity();
  const std::vector<float> dyv = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  for (DType dt : {DType::fp32, DType::bf16}) {
    SCOPED_TRACE(std::string(sdk::dtype_name(dt)));
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2}) {
      CpuBackend be(threads);
      auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
      const std::size_t bytes = conv.pool2d_workspace_bytes(g, dt);
      ASSERT_EQ(bytes, static_cast<std::size_t>(ys.numel()) * 4) << "int32 indices";
      std::vector<std::byte> ws(bytes);
      const TensorView wsv{ws.data(), DType::fp32, Shape{static_cast<std::int64_t>(bytes / 4)}};
      DeviceTensor x(be, dt, xs, xv), y(be, dt, ys), dy(be, dt, ys, dyv), dx(be, dt, xs),
          dx_from_x(be, dt, xs);
      conv.pool2d_forward(g, x, y, wsv);
      conv.pool2d_backward(g, dy, x, y, wsv, dx);
      conv.pool2d_backward(g, dy, x, y, {}, dx_from_x);
      const auto xq = x.get();  // the values as stored
      const auto yv = y.get(), dxv = dx.get();
      EXPECT_EQ(dx_from_x.get(), dxv) << "indices recomputed from x";
      for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t c = 0; c < 5; ++c) {
          std::int64_t first = 0;
          bool nan = false;
          for (std::int64_t p = 0; p < positions; ++p) {
            const float v = xq[static_cast<std::size_t>((n * positions + p) * 5 + c)];
            nan = nan || std::isnan(v);
            if (v > xq[static_cast<std::size_t>((n * positions + first) * 5 + c)]) first = p;
          }
          const float got = yv[static_cast<std::size_t>(n * 5 + c)];
          if (nan) {
            EXPECT_EQ(std::bit_cast<std::uint32_t>(got), 0x7FC00000u) << n << ", " << c;
            continue;
          }
          EXPECT_EQ(got, xq[static_cast<std::size_t>((n * positions + first) * 5 + c)])
              << n << ", " << c;
          for (std::int64_t p = 0; p < positions; ++p)
            EXPECT_EQ(dxv[static_cast<std::size_t>((n * positions + p) * 5 + c)],
                      p == first ? dyv[static_cast<std::size_t>(n * 5 + c)] : 0.0f)
                << n << ", " << c << ", position " << p;
        }
      EXPECT_EQ(yv[1], 9.0f);
      EXPECT_EQ(yv[3], -std::numeric_limits<float>::infinity());
      results.push_back(dxv);
    }
    EXPECT_EQ(results[0], results[1]) << "one thread and two";
  }
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
