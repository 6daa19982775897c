// The convolution facet and batch norm of CpuBackend: argument errors name the op and what was
// expected, oneDNN primitives are created once per geometry, the native bf16 convolution agrees
// with exact emulation, and the backward ops are the gradients of their forwards (double central
// differences of the scalar loss L = Σ y·r).
#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>

#include "backend_test_util.h"
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
  expect_error([&] { be.conv2d_forward(f); },
               {"backend_cpu.conv2d_forward", "x is fp32 [2, 3, 8, 8]",
                "[N, H, W, C] = [2, 8, 8, 3]", "to_channels_last"});
  f.x.view = x;
  f.geometry.groups = 2;
  expect_error([&] { be.conv2d_forward(f); }, {"conv2d_forward", "groups = 2 must divide"});
  f.geometry = g;
  f.geometry.kernel_h = 11;
  expect_error([&] { be.conv2d_forward(f); }, {"conv2d_forward", "does not fit"});
  f.geometry = g;
  f.geometry.stride_w = 0;
  expect_error([&] { be.conv2d_forward(f); }, {"geometry.stride_w = 0 must be at least 1"});
  f.geometry = g;
  f.geometry.out_channels = 5;
  expect_error([&] { be.conv2d_forward(f); },
               {"w is fp32 [4, 3, 3, 3]", "[O, C/groups, KH, KW] = [5, 3, 3, 3]"});
  f.geometry = g;
  f.compute = DType::bf16;
  expect_error([&] { be.conv2d_forward(f); }, {"compute = bf16"});
  f.compute = DType::fp32;
  f.w.transpose = true;
  expect_error([&] { be.conv2d_forward(f); }, {"transpose"});
  f.w.transpose = false;
  DeviceTensor bias(be, DType::fp32, Shape{3});
  f.bias = bias;
  expect_error([&] { be.conv2d_forward(f); }, {"bias", "4 are needed"});

  DeviceTensor dw16(be, DType::bf16, w_shape(g));
  sdk::Conv2dBackwardWeightsArgs bw;
  bw.geometry = g;
  bw.x.view = x;
  bw.dy.view = y;
  bw.dw = dw16;
  expect_error([&] { be.conv2d_backward_weights(bw); },
               {"backend_cpu.conv2d_backward_weights", "dw", "must be fp32"});
  sdk::Conv2dBackwardDataArgs bd;
  bd.geometry = g;
  bd.dy.view = x;  // the input's shape where the output's is expected
  bd.w.view = w;
  bd.dx = x;
  expect_error([&] { be.conv2d_backward_data(bd); },
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
  expect_error([&] { be.pool2d_forward(p, px, py, {}); },
               {"backend_cpu.pool2d_forward", "more than half the kernel"});
  p.pad_h = 0;
  DeviceTensor tiny_ws(be, DType::int32, Shape{1});
  expect_error([&] { be.pool2d_forward(p, px, py, tiny_ws); }, {"workspace", "bytes are needed"});
  DeviceTensor py16(be, DType::fp16, Shape{2, 4, 4, 3});
  expect_error([&] { be.pool2d_forward(p, px, py16, {}); }, {"pooling keeps one dtype"});
  expect_error([&] { be.pool2d_forward(p, py, px, {}); },
               {"x is fp32 [2, 4, 4, 3]", "[N, H, W, C] = [2, 8, 8, 3]"});

  sdk::BatchNormShape s{12, 4, 1e-5f, false};
  DeviceTensor bx(be, DType::fp32, Shape{12, 4});
  DeviceTensor bx_wrong(be, DType::fp32, Shape{4, 12});
  DeviceTensor by(be, DType::fp32, Shape{12, 4});
  DeviceTensor stat(be, DType::fp32, Shape{4});
  DeviceTensor stat2(be, DType::fp32, Shape{4});
  expect_error(
      [&] {
        be.batchnorm_forward_training(bx_wrong, {}, {}, s, 0.1f, by, stat, stat2, {}, {}, {});
      },
      {"backend_cpu.batchnorm_forward_training", "x is fp32 [4, 12]", "[rows, C] = [12, 4]"});
  expect_error(
      [&] { be.batchnorm_forward_training(bx, stat, {}, s, 0.1f, by, stat, stat2, {}, {}, {}); },
      {"gamma and beta must be both given"});
  sdk::BatchNormShape one{1, 4, 1e-5f, false};
  DeviceTensor row(be, DType::fp32, Shape{1, 4}), row_y(be, DType::fp32, Shape{1, 4});
  expect_error(
      [&] {
        be.batchnorm_forward_training(row, {}, {}, one, 0.1f, row_y, stat, stat2, {}, {}, {});
      },
      {"more than one value per channel"});
  sdk::BatchNormShape relu = s;
  relu.relu = true;
  DeviceTensor bdx(be, DType::fp32, Shape{12, 4});
  expect_error(
      [&] { be.batchnorm_backward(by, bx, {}, {}, stat, stat2, relu, {}, bdx, {}, {}, false); },
      {"backend_cpu.batchnorm_backward", "workspace or y"});

  DeviceTensor first(be, DType::fp32, Shape{2, 3, 4, 5});
  DeviceTensor last(be, DType::fp32, Shape{2, 4, 5, 3});
  expect_error([&] { be.to_channels_last(first, 7, 4, 5, last); },
               {"backend_cpu.to_channels_last", "not a whole number of 7x4x5 images"});
  DeviceTensor short_last(be, DType::fp32, Shape{2, 4, 5, 2});
  expect_error([&] { be.to_channels_last(first, 3, 4, 5, short_last); }, {"dst", "120 are needed"});
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
    be.conv2d_forward(f);
    sdk::Conv2dBackwardDataArgs bd;
    bd.geometry = g;
    bd.dy.view = y;
    bd.w.view = w;
    bd.dx = dx;
    be.conv2d_backward_data(bd);
    sdk::Conv2dBackwardWeightsArgs bw;
    bw.geometry = g;
    bw.x.view = x;
    bw.dy.view = y;
    bw.dw = dw;
    bw.dbias = db;
    be.conv2d_backward_weights(bw);
    bw.accumulate = true;
    be.conv2d_backward_weights(bw);
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

  sdk::Pool2dGeometry p;
  p.batch = 2;
  p.channels = 16;
  p.height = p.width = 8;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  DeviceTensor px(be, DType::fp32, Shape{2, 8, 8, 16}, random_values(2 * 8 * 8 * 16, 3));
  DeviceTensor py(be, DType::fp32, Shape{2, 4, 4, 16});
  DeviceTensor pdx(be, DType::fp32, Shape{2, 8, 8, 16});
  const std::size_t ws_bytes = be.pool2d_workspace_bytes(p, DType::fp32);
  DeviceTensor ws(be, DType::int32, Shape{static_cast<std::int64_t>((ws_bytes + 3) / 4)});
  auto run_pool = [&] {
    be.pool2d_forward(p, px, py, ws);
    be.pool2d_backward(p, py, px, py, ws, pdx);
  };
  run_pool();
  const std::size_t with_pool = be.cached_dnnl_primitives();
  run_pool();
  EXPECT_EQ(be.cached_dnnl_primitives(), with_pool);

  sdk::BatchNormShape s{128, 16, 1e-5f, true};
  DeviceTensor bx(be, DType::fp32, Shape{2, 8, 8, 16}, random_values(2 * 8 * 8 * 16, 4));
  DeviceTensor by(be, DType::fp32, Shape{2, 8, 8, 16});
  DeviceTensor bdx(be, DType::fp32, Shape{2, 8, 8, 16});
  DeviceTensor gamma(be, DType::fp32, Shape{16}, random_values(16, 5, 0.5f, 1.5f));
  DeviceTensor beta(be, DType::fp32, Shape{16}, random_values(16, 6));
  DeviceTensor mean(be, DType::fp32, Shape{16}), var(be, DType::fp32, Shape{16});
  DeviceTensor dg(be, DType::fp32, Shape{16}), dbeta(be, DType::fp32, Shape{16});
  const std::size_t bn_ws_bytes = be.batchnorm_workspace_bytes(s, DType::fp32);
  EXPECT_GT(bn_ws_bytes, 0u);
  DeviceTensor bn_ws(be, DType::int32, Shape{static_cast<std::int64_t>((bn_ws_bytes + 3) / 4)});
  auto run_bn = [&] {
    be.batchnorm_forward_training(bx, gamma, beta, s, 0.1f, by, mean, var, {}, {}, bn_ws);
    be.batchnorm_backward(by, bx, by, gamma, mean, var, s, bn_ws, bdx, dg, dbeta, false);
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
      be.conv2d_forward(f);
      Out out;
      out.impl = be.last_conv_implementation();
      f.y = y16;
      be.conv2d_forward(f);
      sdk::Conv2dBackwardDataArgs bd;
      bd.geometry = g;
      bd.dy.view = dy;
      bd.w.view = w;
      bd.dx = dx;
      be.conv2d_backward_data(bd);
      sdk::Conv2dBackwardWeightsArgs bw;
      bw.geometry = g;
      bw.x.view = x;
      bw.dy.view = dy;
      bw.dw = dw;
      be.conv2d_backward_weights(bw);
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
      be.conv2d_forward(f);
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
    be.conv2d_backward_data(bd);
    sdk::Conv2dBackwardWeightsArgs bw;
    bw.geometry = g;
    bw.x.view = x;
    bw.dy.view = r;
    bw.dw = dw;
    bw.dbias = db;
    be.conv2d_backward_weights(bw);
    // L is linear in x, w and b: the differences are exact up to the FP32 rounding of y.
    expect_gradient(xv, forward, dx.get(), 0.1f, 1e-4, "dL/dx");
    expect_gradient(wv, forward, dw.get(), 0.1f, 1e-4, "dL/dw");
    expect_gradient(bv, forward, db.get(), 0.1f, 1e-4, "dL/dbias");
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
    be.batchnorm_forward_training(x, gamma, beta, s, 0.1f, y, mean, var, {}, {}, {});
    return loss(y.get(), rv);
  };
  DeviceTensor x(be, DType::fp32, shape, xv), y(be, DType::fp32, shape);
  DeviceTensor gamma(be, DType::fp32, Shape{3}, gv), beta(be, DType::fp32, Shape{3}, bv);
  DeviceTensor mean(be, DType::fp32, Shape{3}), var(be, DType::fp32, Shape{3});
  be.batchnorm_forward_training(x, gamma, beta, s, 0.1f, y, mean, var, {}, {}, {});
  DeviceTensor r(be, DType::fp32, shape, rv), dx(be, DType::fp32, shape);
  DeviceTensor dg(be, DType::fp32, Shape{3}), db(be, DType::fp32, Shape{3});
  be.batchnorm_backward(r, x, y, gamma, mean, var, s, {}, dx, dg, db, false);
  // h = 1e-2: truncation O(h²) and FP32 rounding of y over 2h both stay below 1e-3.
  expect_gradient(xv, forward, dx.get(), 1e-2f, 2e-3, "dL/dx");
  expect_gradient(gv, forward, dg.get(), 1e-2f, 2e-3, "dL/dgamma");
  expect_gradient(bv, forward, db.get(), 1e-2f, 2e-3, "dL/dbeta");
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
