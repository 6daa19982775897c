// Convolution and pooling against double-precision references: every dtype and geometry, the
// accumulating data gradient, max pooling's ties and its NaN rule, and argument errors.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "conformance_fixture.h"

namespace mixtrain::conformance {
namespace internal {
void link_convolution() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

std::vector<double> absolute(std::vector<double> v) {
  for (double& x : v) x = std::abs(x);
  return v;
}

// A tf32 result's normwise tolerance against the reference, which rounds each fp32 operand to
// tf32 to nearest. Hardware may truncate instead: one tf32 unit (2^-10 relative) per operand, so
// each product a·b moves by up to 2^-9·|a·b|, and the sum by 2^-9·Σ|a||b| (`abs_sums`, the same
// computation over absolute values), on top of the FP32 accumulation's `fp32_tol`.
double tf32_tolerance(const std::vector<double>& abs_sums, const std::vector<double>& want,
                      double fp32_tol) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += abs_sums[i] * abs_sums[i];
    den += want[i] * want[i];
  }
  return fp32_tol + (den == 0 ? 0.0 : 0x1p-9 * std::sqrt(num / den));
}

// The values an operand stands for: stored (decoded) × scale_inv, tf32-rounded when asked.
std::vector<double> real_operand(const std::vector<float>& stored_values, float scale_inv,
                                 bool tf32) {
  std::vector<double> r(stored_values.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    const float v = tf32 ? sdk::round_to_tf32(stored_values[i]) : stored_values[i];
    r[i] = static_cast<double>(v) * scale_inv;
  }
  return r;
}

sdk::Conv2dGeometry conv_geometry(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                                  std::int64_t o, std::int64_t kh, std::int64_t kw, std::int64_t sh,
                                  std::int64_t sw, std::int64_t ph, std::int64_t pw,
                                  std::int64_t dh, std::int64_t dw, std::int64_t groups) {
  sdk::Conv2dGeometry g;
  g.batch = n;
  g.in_channels = c;
  g.height = h;
  g.width = w;
  g.out_channels = o;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = sh;
  g.stride_w = sw;
  g.pad_h = ph;
  g.pad_w = pw;
  g.dilation_h = dh;
  g.dilation_w = dw;
  g.groups = groups;
  return g;
}

// The three convolution products in double by direct loops over (image, output pixel, output
// channel, tap): y from x, w (and bias); dx from dy, w; dw and dbias from x, dy (pass empty
// vectors for what an op does not read). Channels-last
// x [N, H, W, C], y/dy [N, OH, OW, O]; w [O, C/g, KH, KW].
struct ConvReference {
  std::vector<double> y, dx, dw, dbias;
};
ConvReference naive_conv(const sdk::Conv2dGeometry& g, const std::vector<double>& x,
                         const std::vector<double>& w, const std::vector<double>& dy,
                         const std::vector<double>* bias) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  const std::int64_t cpg = g.in_channels / g.groups, opg = g.out_channels / g.groups;
  ConvReference r;
  r.y.assign(static_cast<std::size_t>(g.batch * oh_n * ow_n * g.out_channels), 0.0);
  r.dx.assign(static_cast<std::size_t>(g.batch * g.height * g.width * g.in_channels), 0.0);
  r.dw.assign(static_cast<std::size_t>(g.out_channels * cpg * g.kernel_h * g.kernel_w), 0.0);
  r.dbias.assign(static_cast<std::size_t>(g.out_channels), 0.0);
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        for (std::int64_t o = 0; o < g.out_channels; ++o) {
          const auto yi =
              static_cast<std::size_t>(((n * oh_n + oh) * ow_n + ow) * g.out_channels + o);
          double acc = bias != nullptr ? (*bias)[static_cast<std::size_t>(o)] : 0.0;
          const double d = dy.empty() ? 0.0 : dy[yi];
          for (std::int64_t ci = 0; ci < cpg; ++ci)
            for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const std::int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
                const std::int64_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
                if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                const std::int64_t c = o / opg * cpg + ci;
                const auto xi = static_cast<std::size_t>(
                    ((n * g.height + ih) * g.width + iw) * g.in_channels + c);
                const auto wi =
                    static_cast<std::size_t>(((o * cpg + ci) * g.kernel_h + kh) * g.kernel_w + kw);
                if (!x.empty() && !w.empty()) acc += x[xi] * w[wi];
                if (!dy.empty() && !w.empty()) r.dx[xi] += d * w[wi];
                if (!dy.empty() && !x.empty()) r.dw[wi] += x[xi] * d;
              }
          r.y[yi] = acc;
          r.dbias[static_cast<std::size_t>(o)] += d;
        }
  return r;
}

TEST_P(Conformance, Conv2dEveryDtypeAndGeometryMatchesADoubleReference) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  struct Geometry {
    const char* name;
    sdk::Conv2dGeometry g;
    bool bias;
  };
  const std::vector<Geometry> geometries = {
      {"3x3 pad 1", conv_geometry(2, 3, 7, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1), true},
      {"ResNet-like 16->16", conv_geometry(4, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1), false},
      {"3x2 stride 2x1 dilation 1x2 groups 2",
       conv_geometry(2, 4, 9, 8, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2), true},
      {"depthwise dilation 2", conv_geometry(3, 8, 6, 6, 8, 3, 3, 1, 1, 2, 2, 2, 2, 8), false},
      {"1x1 stride 2", conv_geometry(2, 16, 8, 8, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1), true},
      // Fewer input channels than a SIMD block (8 with AVX2, 16 with AVX-512): oneDNN 2.6's 1x1
      // weight-gradient kernels overran their buffers here (cpu_conv_primitives.cpp).
      {"1x1 stride 2, 4 -> 8 channels", conv_geometry(4, 4, 16, 16, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1),
       false},
      {"1x1 stride 2, 12 -> 16 channels",
       conv_geometry(4, 12, 16, 16, 16, 1, 1, 2, 2, 0, 0, 1, 1, 1), true},
      {"floor: 7x6 stride 2 no pad", conv_geometry(2, 5, 7, 6, 3, 3, 3, 2, 2, 0, 0, 1, 1, 1),
       false},
  };
  struct Route {
    DType a, b, out, compute;
    float scale_a, scale_b;  // cast scales: stored = real * scale, scale_inv = 1 / scale (fp8)
  };
  const std::vector<Route> routes = {
      {DType::fp32, DType::fp32, DType::fp32, DType::fp32, 1, 1},
      {DType::fp32, DType::fp32, DType::bf16, DType::fp32, 1, 1},
      {DType::fp32, DType::fp32, DType::fp16, DType::fp32, 1, 1},
      {DType::fp32, DType::fp32, DType::fp32, DType::tf32, 1, 1},
      {DType::bf16, DType::bf16, DType::fp32, DType::fp32, 1, 1},
      {DType::bf16, DType::bf16, DType::bf16, DType::fp32, 1, 1},
      {DType::fp16, DType::fp16, DType::fp16, DType::fp32, 1, 1},
      {DType::fp16, DType::fp16, DType::fp32, DType::fp32, 1, 1},
      {DType::fp8_e4m3, DType::fp8_e4m3, DType::fp32, DType::fp32, 4, 3},
      {DType::fp8_e5m2, DType::fp8_e4m3, DType::bf16, DType::fp32, 8, 2},
      {DType::bf16, DType::fp32, DType::fp16, DType::fp32, 1, 1},
  };
  using C = sdk::ConvolutionOp;
  for (C op : {C::conv2d_forward, C::conv2d_backward_data})
    if (!tested_convolution->supports(op, std::vector<DType>(3, DType::fp32)))
      ADD_FAILURE() << "the convolution facet must support " << sdk::op_name(op) << " in fp32";
  for (const Geometry& geo : geometries)
    for (const Route& rt : routes) {
      const auto& g = geo.g;
      const Shape xs{g.batch, g.height, g.width, g.in_channels};
      const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
      const Shape ws{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
      const bool tf32 = rt.compute == DType::tf32;
      const float inv_a = sdk::is_fp8(rt.a) ? 1.0f / rt.scale_a : 1.0f;
      const float inv_b = sdk::is_fp8(rt.b) ? 1.0f / rt.scale_b : 1.0f;
      const double tol = output_tolerance(rt.out);
      const std::string what = std::string(geo.name) + ", " + dtypes_text({rt.a, rt.b, rt.out}) +
                               (tf32 ? " compute tf32" : "");
      const auto xv = random_values(static_cast<std::size_t>(xs.numel()), 60);
      const auto wv = random_values(static_cast<std::size_t>(ws.numel()), 61);
      const auto dyv = random_values(static_cast<std::size_t>(ys.numel()), 62);
      const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 63);
      auto bias = upload(bv, Shape{g.out_channels});
      const std::vector<double> bias_real = widen(bv);
      auto side = [&](int which, const Pair& p) {
        return which == 0 ? p.ref->view() : p.tested->view();
      };
      auto facet = [&](int which) { return which == 0 ? ref_convolution : tested_convolution; };

      if (tested_convolution->supports(C::conv2d_forward, std::vector<DType>{rt.a, rt.b, rt.out})) {
        auto x = upload(xv, xs, rt.a, rt.scale_a);
        auto w = upload(wv, ws, rt.b, rt.scale_b);
        auto y = zeros(ys, rt.out);
        for (int which : {0, 1}) {
          sdk::Conv2dForwardArgs f;
          f.geometry = g;
          f.x = {side(which, x), false, inv_a};
          f.w = {side(which, w), false, inv_b};
          if (geo.bias) f.bias = side(which, bias);
          f.y = side(which, y);
          f.compute = rt.compute;
          facet(which)->conv2d_forward(f);
        }
        const auto xr = real_operand(tested_values(x), inv_a, tf32);
        const auto wr = real_operand(tested_values(w), inv_b, tf32);
        const auto want = naive_conv(g, xr, wr, {}, geo.bias ? &bias_real : nullptr);
        const std::vector<double> bias_abs = absolute(bias_real);
        const double y_tol = tf32 ? tf32_tolerance(naive_conv(g, absolute(xr), absolute(wr), {},
                                                              geo.bias ? &bias_abs : nullptr)
                                                       .y,
                                                   want.y, tol)
                                  : tol;
        EXPECT_LE(relative_to(tested_values(y), want.y), y_tol) << "conv2d_forward " << what;
        expect_close(y, y_tol, "conv2d_forward vs the reference backend, " + what);
      }
      if (tested_convolution->supports(C::conv2d_backward_data,
                                       std::vector<DType>{rt.a, rt.b, rt.out})) {
        auto dy = upload(dyv, ys, rt.a, rt.scale_a);
        auto w = upload(wv, ws, rt.b, rt.scale_b);
        auto dx = zeros(xs, rt.out);
        for (int which : {0, 1}) {
          sdk::Conv2dBackwardDataArgs b;
          b.geometry = g;
          b.dy = {side(which, dy), false, inv_a};
          b.w = {side(which, w), false, inv_b};
          b.dx = side(which, dx);
          b.compute = rt.compute;
          facet(which)->conv2d_backward_data(b);
        }
        const auto wr = real_operand(tested_values(w), inv_b, tf32);
        const auto dyr = real_operand(tested_values(dy), inv_a, tf32);
        const auto want = naive_conv(g, {}, wr, dyr, nullptr);
        const double dx_tol =
            tf32 ? tf32_tolerance(naive_conv(g, {}, absolute(wr), absolute(dyr), nullptr).dx,
                                  want.dx, tol)
                 : tol;
        EXPECT_LE(relative_to(tested_values(dx), want.dx), dx_tol)
            << "conv2d_backward_data " << what;
        expect_close(dx, dx_tol, "conv2d_backward_data vs the reference backend, " + what);
      }
      if (tested_convolution->supports(C::conv2d_backward_weights,
                                       std::vector<DType>{rt.a, rt.b})) {
        auto x = upload(xv, xs, rt.a, rt.scale_a);
        auto dy = upload(dyv, ys, rt.b, rt.scale_b);
        const auto xr = real_operand(tested_values(x), inv_a, tf32);
        const auto dyr = real_operand(tested_values(dy), inv_b, tf32);
        const auto want = naive_conv(g, xr, {}, dyr, nullptr);
        // dw and dbias are fp32: FP32 accumulation over N·OH·OW products (and tf32's operands).
        const auto abs_want = naive_conv(g, absolute(xr), {}, absolute(dyr), nullptr);
        // dbias = Σ dy: its real values are dy's.
        for (bool accumulate : {false, true}) {
          const auto dw0 = random_values(static_cast<std::size_t>(ws.numel()), 64);
          const auto db0 = random_values(static_cast<std::size_t>(g.out_channels), 65);
          auto dw = upload(dw0, ws);
          auto db = upload(db0, Shape{g.out_channels});
          for (int which : {0, 1}) {
            sdk::Conv2dBackwardWeightsArgs b;
            b.geometry = g;
            b.x = {side(which, x), false, inv_a};
            b.dy = {side(which, dy), false, inv_b};
            b.dw = side(which, dw);
            if (geo.bias) b.dbias = side(which, db);
            b.accumulate = accumulate;
            b.compute = rt.compute;
            facet(which)->conv2d_backward_weights(b);
          }
          std::vector<double> want_dw = want.dw, want_db = want.dbias;
          for (std::size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += accumulate ? dw0[i] : 0.0;
          for (std::size_t i = 0; i < want_db.size(); ++i)
            want_db[i] = geo.bias ? want_db[i] + (accumulate ? db0[i] : 0.0) : db0[i];
          const std::string w_what = what + (accumulate ? ", accumulate" : "");
          double dw_tol = 2e-5, db_tol = 2e-5;
          if (tf32) {
            std::vector<double> abs_dw = abs_want.dw, abs_db = abs_want.dbias;
            for (std::size_t i = 0; i < abs_dw.size(); ++i)
              abs_dw[i] += accumulate ? std::abs(dw0[i]) : 0.0;
            for (std::size_t i = 0; i < abs_db.size(); ++i)
              abs_db[i] =
                  geo.bias ? abs_db[i] + (accumulate ? std::abs(db0[i]) : 0.0) : std::abs(db0[i]);
            dw_tol = tf32_tolerance(abs_dw, want_dw, dw_tol);
            db_tol = tf32_tolerance(abs_db, want_db, db_tol);
          }
          EXPECT_LE(relative_to(tested_values(dw), want_dw), dw_tol)
              << "conv2d_backward_weights dw " << w_what;
          EXPECT_LE(relative_to(tested_values(db), want_db), db_tol)
              << "conv2d_backward_weights dbias " << w_what;
          expect_close(dw, dw_tol,
                       "conv2d_backward_weights dw vs the reference backend, " + w_what);
          expect_close(db, db_tol,
                       "conv2d_backward_weights dbias vs the reference backend, " + w_what);
        }
      }
    }
}

// convolution 1.1: the accumulating data gradient adds into an fp32 dx what conv2d_backward_data
// computes, in FP32: against old dx + the double reference, and against the reference backend's
// implementation (the CPU implements it whether or not it offers it). The contract lets 16-bit
// operands' gradient be rounded once into their dtype before the add where a library cannot add
// it unrounded, so their tolerance has that rounding of the gradient on top; fp32 operands' has
// FP32 accumulation only. Per operand route a backend offers, including the geometries with
// padding, strides, dilation and groups; then the bad arguments.
TEST_P(Conformance, Conv2dBackwardDataAccumulateAddsTheGradientIntoAnFp32Sum) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  using C = sdk::ConvolutionOp;
  if (tested_convolution->version() < sdk::FacetVersion{1, 1})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has convolution facet "
                 << sdk::to_string(tested_convolution->version());
  struct Route {
    DType a, b, compute;
  };
  // The accumulating data gradient on the reference backend and on the tested one, each on its
  // copy of the tensors.
  auto accumulate_on_both = [&](const sdk::Conv2dGeometry& g, const Pair& dy, const Pair& w,
                                const Pair& dx, DType compute) {
    for (int which : {0, 1}) {
      sdk::Conv2dBackwardDataArgs b;
      b.geometry = g;
      b.dy.view = which == 0 ? dy.ref->view() : dy.tested->view();
      b.w.view = which == 0 ? w.ref->view() : w.tested->view();
      b.dx = which == 0 ? dx.ref->view() : dx.tested->view();
      b.compute = compute;
      (which == 0 ? ref_convolution : tested_convolution)->conv2d_backward_data_accumulate(b);
    }
  };
  const std::vector<Route> routes = {{DType::fp32, DType::fp32, DType::fp32},
                                     {DType::fp32, DType::fp32, DType::tf32},
                                     {DType::bf16, DType::bf16, DType::fp32},
                                     {DType::fp16, DType::fp16, DType::fp32}};
  const std::vector<sdk::Conv2dGeometry> geometries = {
      conv_geometry(2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1),
      conv_geometry(2, 4, 9, 8, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2),
      conv_geometry(2, 16, 8, 8, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1)};
  int offered = 0;
  for (const Route& rt : routes) {
    if (!tested_convolution->supports(C::conv2d_backward_data_accumulate,
                                      std::vector<DType>{rt.a, rt.b, DType::fp32}))
      continue;
    ++offered;
    const bool tf32 = rt.compute == DType::tf32;
    for (const auto& g : geometries) {
      const Shape xs{g.batch, g.height, g.width, g.in_channels};
      const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
      const Shape ws{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
      const std::string what =
          dtypes_text({rt.a, rt.b, DType::fp32}) + (tf32 ? " compute tf32" : "") + ", " +
          std::to_string(g.in_channels) + " -> " + std::to_string(g.out_channels) + " channels";
      auto dy = upload(random_values(static_cast<std::size_t>(ys.numel()), 70), ys, rt.a);
      auto w = upload(random_values(static_cast<std::size_t>(ws.numel()), 71), ws, rt.b);
      const auto dx0 = random_values(static_cast<std::size_t>(xs.numel()), 72);
      auto dx = upload(dx0, xs);  // the other reader's contribution, already in the sum
      accumulate_on_both(g, dy, w, dx, rt.compute);
      const auto wr = real_operand(tested_values(w), 1.0f, tf32);
      const auto dyr = real_operand(tested_values(dy), 1.0f, tf32);
      const std::vector<double> gradient = naive_conv(g, {}, wr, dyr, nullptr).dx;
      std::vector<double> want = gradient;
      std::vector<double> abs_sums = naive_conv(g, {}, absolute(wr), absolute(dyr), nullptr).dx;
      for (std::size_t i = 0; i < want.size(); ++i) {
        want[i] += dx0[i];
        abs_sums[i] += std::abs(dx0[i]);
      }
      // FP32 accumulation and one FP32 addition, plus for 16-bit operands at most one rounding of
      // the gradient into their dtype (2^-9 bf16, 2^-12 fp16 of each element, normwise relative
      // to the sum).
      double tol = tf32 ? tf32_tolerance(abs_sums, want, 2e-5) : 2e-5;
      if (rt.a != DType::fp32) {
        double g2 = 0, w2 = 0;
        for (std::size_t i = 0; i < want.size(); ++i) {
          g2 += gradient[i] * gradient[i];
          w2 += want[i] * want[i];
        }
        tol += (rt.a == DType::bf16 ? 0x1p-9 : 0x1p-12) * std::sqrt(g2 / w2);
      }
      EXPECT_LE(relative_to(tested_values(dx), want), tol) << what;
      expect_close(dx, tol, "conv2d_backward_data_accumulate vs the reference backend, " + what);
    }
  }
  if (offered == 0)
    GTEST_SKIP() << "backend '" << GetParam().name << "' offers no conv2d_backward_data_accumulate";
  // A 16-bit sum of the operands' dtype (model.fp32_gradient_sums = false), where offered (a
  // dtype pair added through supports()): dx = round(dx + the gradient), within the sum's one
  // rounding plus the gradient's, against the double reference and the reference backend (the
  // CPU implements it, unoffered).
  // A pointwise convolution too (stride 1: the CUDA backend's one-GEMM route, beta = 1 into dx).
  std::vector<sdk::Conv2dGeometry> sum16_geometries = geometries;
  sum16_geometries.push_back(conv_geometry(2, 16, 8, 8, 8, 1, 1, 1, 1, 0, 0, 1, 1, 1));
  for (const DType d : {DType::bf16, DType::fp16}) {
    if (!tested_convolution->supports(C::conv2d_backward_data_accumulate,
                                      std::vector<DType>{d, d, d}))
      continue;
    for (const auto& g : sum16_geometries) {
      const Shape xs{g.batch, g.height, g.width, g.in_channels};
      const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
      const Shape ws{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
      const std::string what = dtypes_text({d, d, d}) + ", " + std::to_string(g.in_channels) +
                               " -> " + std::to_string(g.out_channels) + " channels";
      auto dy = upload(random_values(static_cast<std::size_t>(ys.numel()), 75), ys, d);
      auto w = upload(random_values(static_cast<std::size_t>(ws.numel()), 76), ws, d);
      auto dx = upload(random_values(static_cast<std::size_t>(xs.numel()), 77), xs, d);
      const auto dx0 = tested_values(dx);  // as the 16-bit sum holds it
      accumulate_on_both(g, dy, w, dx, DType::fp32);
      std::vector<double> want = naive_conv(g, {}, real_operand(tested_values(w), 1.0f, false),
                                            real_operand(tested_values(dy), 1.0f, false), nullptr)
                                     .dx;
      for (std::size_t i = 0; i < want.size(); ++i) want[i] += dx0[i];
      const double unit = d == DType::bf16 ? 0x1p-8 : 0x1p-11;  // the sum's rounding, and the
      EXPECT_LE(relative_to(tested_values(dx), want), 2 * unit) << what;  // gradient's at most
      expect_close(dx, 2 * unit, "conv2d_backward_data_accumulate into a 16-bit sum, " + what);
    }
  }
  // dx must be fp32 (or dy's 16-bit dtype) and apart from dy and w.
  const auto g = geometries[0];
  const Shape xs{g.batch, g.height, g.width, g.in_channels};
  const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
  const Shape ws{g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
  auto dy = upload(random_values(static_cast<std::size_t>(ys.numel()), 73), ys);
  auto w = upload(random_values(static_cast<std::size_t>(ws.numel()), 74), ws);
  auto dx16 = zeros(xs, DType::bf16);
  sdk::Conv2dBackwardDataArgs b;
  b.geometry = g;
  b.dy.view = dy.tested->view();
  b.w.view = w.tested->view();
  b.dx = dx16.tested->view();
  EXPECT_THROW(tested_convolution->conv2d_backward_data_accumulate(b), sdk::BackendError)
      << "a bf16 dx of fp32 operands";
  b.dx = {dy.tested->view().data, DType::fp32, xs};  // ys and xs hold as many elements here
  EXPECT_THROW(tested_convolution->conv2d_backward_data_accumulate(b), sdk::BackendError)
      << "dx on dy";
}

// Pooling in double: y, and dx for dy (max: dy to the first maximum in row-major window order).
struct PoolReference {
  std::vector<double> y, dx;
};
PoolReference naive_pool(const sdk::Pool2dGeometry& g, const std::vector<double>& x,
                         const std::vector<double>& dy) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  PoolReference r;
  r.y.assign(static_cast<std::size_t>(g.batch * oh_n * ow_n * g.channels), 0.0);
  r.dx.assign(x.size(), 0.0);
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        for (std::int64_t c = 0; c < g.channels; ++c) {
          const auto yi = static_cast<std::size_t>(((n * oh_n + oh) * ow_n + ow) * g.channels + c);
          double best = -std::numeric_limits<double>::infinity(), sum = 0.0;
          std::int64_t best_at = -1, count = 0;
          std::vector<std::size_t> inside;
          for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
            for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
              const std::int64_t ih = oh * g.stride_h - g.pad_h + kh;
              const std::int64_t iw = ow * g.stride_w - g.pad_w + kw;
              if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
              const auto xi =
                  static_cast<std::size_t>(((n * g.height + ih) * g.width + iw) * g.channels + c);
              inside.push_back(xi);
              sum += x[xi];
              ++count;
              if (x[xi] > best) {
                best = x[xi];
                best_at = static_cast<std::int64_t>(xi);
              }
            }
          if (g.kind == sdk::PoolKind::max) {
            r.y[yi] = best;
            r.dx[static_cast<std::size_t>(best_at)] += dy[yi];
          } else {
            const double div = g.count_include_pad ? static_cast<double>(g.kernel_h * g.kernel_w)
                                                   : static_cast<double>(count);
            r.y[yi] = sum / div;
            for (std::size_t xi : inside) r.dx[xi] += dy[yi] / div;
          }
        }
  return r;
}

sdk::Pool2dGeometry pool_geometry(sdk::PoolKind kind, bool include_pad, std::int64_t n,
                                  std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t kh,
                                  std::int64_t kw, std::int64_t sh, std::int64_t sw,
                                  std::int64_t ph, std::int64_t pw) {
  sdk::Pool2dGeometry g;
  g.kind = kind;
  g.count_include_pad = include_pad;
  g.batch = n;
  g.channels = c;
  g.height = h;
  g.width = w;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = sh;
  g.stride_w = sw;
  g.pad_h = ph;
  g.pad_w = pw;
  return g;
}

// Convolution facet 1.2: each call with a workspace of the bytes conv2d_workspace_bytes asked
// for (filled with NaN first: it holds nothing), and with one too small for the call, gives the
// call's bits without one, and writes nothing past the workspace it was given (guard words after
// it keep their NaN). The geometries include a ResNet stem (3 channels, which cuDNN pads to 8 in
// its workspace).
TEST_P(Conformance, Conv2dWithTheWorkspaceItAskedForIsTheCallWithoutItBitForBit) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  using C = sdk::ConvolutionOp;
  if (tested_convolution->version() < sdk::FacetVersion{1, 2})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has convolution facet "
                 << sdk::to_string(tested_convolution->version());
  sdk::ConvolutionFacet& conv = *tested_convolution;
  // A workspace of `bytes` (at least a word) and kGuard words after it, every one a quiet NaN.
  constexpr std::size_t kGuard = 1024;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto words_of = [](std::size_t bytes) { return std::max<std::size_t>(1, (bytes + 3) / 4); };
  const auto workspace = [&](std::size_t bytes) {
    const std::size_t words = words_of(bytes) + kGuard;
    return upload(std::vector<float>(words, nan), Shape{static_cast<std::int64_t>(words)});
  };
  // How many of the guard words after a workspace of `bytes` no longer hold their NaN.
  const auto guard_words_written = [&](const Pair& space, std::size_t bytes) {
    const std::vector<float> all = tested_values(space);
    return std::count_if(
        all.begin() + static_cast<std::ptrdiff_t>(words_of(bytes)), all.end(), [&](float v) {
          return std::bit_cast<std::uint32_t>(v) != std::bit_cast<std::uint32_t>(nan);
        });
  };
  const std::vector<sdk::Conv2dGeometry> geometries = {
      conv_geometry(2, 3, 32, 32, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1),
      conv_geometry(2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1),
      conv_geometry(2, 16, 8, 8, 8, 1, 1, 1, 1, 0, 0, 1, 1, 1)};
  int asked = 0;
  for (const DType d : {DType::fp32, DType::bf16}) {
    if (!conv.supports(C::conv2d_forward, std::vector<DType>{d, d, d})) continue;
    for (const auto& g : geometries) {
      const Shape xs{g.batch, g.height, g.width, g.in_channels};
      const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
      const Shape ws{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
      const std::string what =
          std::string(sdk::dtype_name(d)) + ", " + std::to_string(g.in_channels) + " -> " +
          std::to_string(g.out_channels) + " channels, kernel " + std::to_string(g.kernel_h);
      auto x = upload(random_values(static_cast<std::size_t>(xs.numel()), 80), xs, d);
      auto w = upload(random_values(static_cast<std::size_t>(ws.numel()), 81), ws, d);
      auto dy = upload(random_values(static_cast<std::size_t>(ys.numel()), 82), ys, d);
      sdk::Conv2dWorkspaceQuery q;
      q.geometry = g;
      q.a = d;
      q.b = d;
      q.out = d;
      // Three runs of each call: without a workspace, in the one asked for, in one word.
      const auto three_ways = [&](C op, Shape out_shape, DType out_dtype,
                                  const std::vector<float>& out_start, auto&& call) {
        q.op = op;
        const std::size_t bytes = conv.conv2d_workspace_bytes(q);
        asked += bytes > 0 ? 1 : 0;
        std::vector<std::vector<float>> got;
        for (const std::size_t size : {std::size_t{0}, bytes, std::size_t{4}}) {
          auto out = upload(out_start, out_shape, out_dtype);
          auto space = workspace(size);
          sdk::TensorView given = space.tested->view();
          given.shape = Shape{static_cast<std::int64_t>(words_of(size))};
          call(out.tested->view(), size == 0 ? sdk::TensorView{} : given);
          got.push_back(tested_values(out));
          if (size > 0) {
            EXPECT_EQ(guard_words_written(space, size), 0)
                << sdk::op_name(op) << " wrote past its " << size << "-byte workspace, " << what;
          }
        }
        EXPECT_EQ(got[1], got[0]) << sdk::op_name(op) << " in its " << bytes << "-byte workspace, "
                                  << what;
        EXPECT_EQ(got[2], got[0]) << sdk::op_name(op) << " in a workspace too small, " << what;
      };
      const std::vector<float> zeros_y(static_cast<std::size_t>(ys.numel()));
      const std::vector<float> zeros_x(static_cast<std::size_t>(xs.numel()));
      const std::vector<float> zeros_w(static_cast<std::size_t>(ws.numel()));
      three_ways(C::conv2d_forward, ys, d, zeros_y, [&](sdk::TensorView y, sdk::TensorView ws_) {
        sdk::Conv2dForwardArgs a;
        a.geometry = g;
        a.x.view = x.tested->view();
        a.w.view = w.tested->view();
        a.y = y;
        conv.conv2d_forward_with_workspace(a, ws_);
      });
      const auto data_args = [&](sdk::TensorView dx) {
        sdk::Conv2dBackwardDataArgs a;
        a.geometry = g;
        a.dy.view = dy.tested->view();
        a.w.view = w.tested->view();
        a.dx = dx;
        return a;
      };
      three_ways(C::conv2d_backward_data, xs, d, zeros_x,
                 [&](sdk::TensorView dx, sdk::TensorView ws_) {
                   conv.conv2d_backward_data_with_workspace(data_args(dx), ws_);
                 });
      q.out = DType::fp32;
      three_ways(C::conv2d_backward_weights, ws, DType::fp32, zeros_w,
                 [&](sdk::TensorView dw, sdk::TensorView ws_) {
                   sdk::Conv2dBackwardWeightsArgs a;
                   a.geometry = g;
                   a.x.view = x.tested->view();
                   a.dy.view = dy.tested->view();
                   a.dw = dw;
                   conv.conv2d_backward_weights_with_workspace(a, ws_);
                 });
      // The accumulating dgrad into an fp32 sum, and into a 16-bit sum of dy's dtype
      // (model.fp32_gradient_sums = false, its route's scratch in that dtype), where offered.
      std::vector<DType> sums{DType::fp32};
      if (d != DType::fp32) sums.push_back(d);
      for (const DType sum : sums) {
        q.out = sum;
        if (!conv.supports(C::conv2d_backward_data_accumulate, std::vector<DType>{d, d, sum}))
          continue;
        three_ways(
            C::conv2d_backward_data_accumulate, xs, sum,
            random_values(static_cast<std::size_t>(xs.numel()), sum == DType::fp32 ? 83 : 86),
            [&](sdk::TensorView dx, sdk::TensorView ws_) {
              conv.conv2d_backward_data_accumulate_with_workspace(data_args(dx), ws_);
            });
      }
    }
  }
  if (asked == 0)
    GTEST_SKIP() << "backend '" << GetParam().name
                 << "' asks for no workspace of its caller's (its calls with one ran as without)";
}

// A backend that asks for a workspace refuses one overlapping the call's output, as it refuses
// any overlapping output.
TEST_P(Conformance, Conv2dRefusesAWorkspaceOverlappingItsOutput) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  if (tested_convolution->version() < sdk::FacetVersion{1, 2})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has convolution facet "
                 << sdk::to_string(tested_convolution->version());
  const sdk::Conv2dGeometry g = conv_geometry(1, 4, 6, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1);
  const Shape xs{1, 6, 6, 4}, ws{4, 4, 3, 3};
  auto x = upload(random_values(static_cast<std::size_t>(xs.numel()), 84), xs);
  auto w = upload(random_values(static_cast<std::size_t>(ws.numel()), 85), ws);
  auto y = upload(std::vector<float>(static_cast<std::size_t>(xs.numel())), xs);
  sdk::Conv2dForwardArgs a;
  a.geometry = g;
  a.x.view = x.tested->view();
  a.w.view = w.tested->view();
  a.y = y.tested->view();
  const sdk::TensorView inside{y.tested->view().data, DType::fp32, Shape{8}};
  sdk::ConvolutionFacet& conv = *tested_convolution;
  sdk::Conv2dWorkspaceQuery q;
  q.geometry = g;
  if (conv.conv2d_workspace_bytes(q) == 0)
    GTEST_SKIP() << "backend '" << GetParam().name
                 << "' asks for no workspace for this call: it runs as without one";
  EXPECT_THROW(conv.conv2d_forward_with_workspace(a, inside), sdk::BackendError);
}

TEST_P(Conformance, PoolingMaxAndAverageForwardBackwardMatchADoubleReference) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  using K = sdk::PoolKind;
  struct Case {
    const char* name;
    sdk::Pool2dGeometry g;
  };
  const std::vector<Case> cases = {
      {"max 3x3 stride 2 pad 1", pool_geometry(K::max, true, 2, 5, 7, 7, 3, 3, 2, 2, 1, 1)},
      {"max 2x2 stride 2", pool_geometry(K::max, true, 2, 16, 8, 8, 2, 2, 2, 2, 0, 0)},
      {"max 3x2 stride 1x2 pad 1x1", pool_geometry(K::max, true, 2, 3, 6, 7, 3, 2, 1, 2, 1, 1)},
      {"avg 3x3 stride 2 pad 1 include pad",
       pool_geometry(K::average, true, 2, 5, 7, 7, 3, 3, 2, 2, 1, 1)},
      {"avg 3x3 stride 2 pad 1 exclude pad",
       pool_geometry(K::average, false, 2, 5, 7, 7, 3, 3, 2, 2, 1, 1)},
      {"avg 2x3 stride 1 pad 1x1 exclude pad",
       pool_geometry(K::average, false, 2, 4, 5, 6, 2, 3, 1, 1, 1, 1)},
      {"global average 8x8", pool_geometry(K::average, true, 3, 10, 8, 8, 8, 8, 1, 1, 0, 0)},
  };
  using C = sdk::ConvolutionOp;
  for (C op : {C::pool2d_forward, C::pool2d_backward})
    if (!tested_convolution->supports(op, std::vector<DType>(2, DType::fp32)))
      ADD_FAILURE() << "the convolution facet must support " << sdk::op_name(op) << " in fp32";
  for (const Case& pc : cases)
    for (DType dt : kStorageFloats) {
      const std::vector<DType> pair{dt, dt};
      if (!tested_convolution->supports(C::pool2d_forward, pair) ||
          !tested_convolution->supports(C::pool2d_backward, pair))
        continue;
      const auto& g = pc.g;
      const bool max = g.kind == K::max;
      const Shape xs{g.batch, g.height, g.width, g.channels};
      const Shape ys{g.batch, g.out_height(), g.out_width(), g.channels};
      const std::string what = std::string(pc.name) + ", " + std::string(sdk::dtype_name(dt));
      auto x = upload(random_values(static_cast<std::size_t>(xs.numel()), 70, -2.f, 2.f), xs, dt);
      auto dy = upload(random_values(static_cast<std::size_t>(ys.numel()), 71), ys, dt);
      const auto want = naive_pool(g, widen(tested_values(x)), widen(tested_values(dy)));
      // Max selects a stored value (exact); average and the summed gradients round once.
      const double tol = output_tolerance(dt);
      std::unique_ptr<DeviceTensor> ws_ref, ws_tested;
      if (max) {
        ws_ref = workspace_on(*ref_, ref_convolution->pool2d_workspace_bytes(g, dt));
        ws_tested = workspace_on(*tested_, tested_convolution->pool2d_workspace_bytes(g, dt));
      } else {
        EXPECT_EQ(tested_convolution->pool2d_workspace_bytes(g, dt), 0u) << what;
      }
      for (bool training : {true, false}) {
        if (!max && !training) continue;
        auto y = zeros(ys, dt);
        ref_convolution->pool2d_forward(g, x.ref->view(), y.ref->view(),
                                        max && training ? ws_ref->view() : TensorView{});
        tested_convolution->pool2d_forward(g, x.tested->view(), y.tested->view(),
                                           max && training ? ws_tested->view() : TensorView{});
        const std::string fwhat = what + (max ? (training ? ", workspace" : ", no workspace") : "");
        EXPECT_LE(relative_to(tested_values(y), want.y), max ? 0.0 : tol)
            << "pool2d_forward " << fwhat;
        expect_close(y, max ? 0.0 : tol, "pool2d_forward vs the reference backend, " + fwhat);
        if (!training) continue;
        // Backward from the workspace, and (max) from x alone.
        for (bool from_ws : {true, false}) {
          if (!max && !from_ws) continue;
          auto dx = upload(std::vector<float>(static_cast<std::size_t>(xs.numel()), 7.f), xs, dt);
          const TensorView wr = max && from_ws ? ws_ref->view() : TensorView{};
          const TensorView wt = max && from_ws ? ws_tested->view() : TensorView{};
          ref_convolution->pool2d_backward(g, dy.ref->view(), x.ref->view(), y.ref->view(), wr,
                                           dx.ref->view());
          tested_convolution->pool2d_backward(g, dy.tested->view(), x.tested->view(),
                                              y.tested->view(), wt, dx.tested->view());
          const std::string bwhat = what + (max ? (from_ws ? ", workspace" : ", from x") : "");
          EXPECT_LE(relative_to(tested_values(dx), want.dx), tol) << "pool2d_backward " << bwhat;
          expect_close(dx, tol, "pool2d_backward vs the reference backend, " + bwhat);
        }
      }
    }
}

TEST_P(Conformance, PoolingMaxTiesGoToTheFirstMaximumInTheWindow) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  // Inputs from {0, 1, 2}: most windows hold several maxima. PyTorch routes dy to the first one in
  // row-major window order; so must every backend (exactly: dy are multiples of 1/8).
  const auto g = pool_geometry(sdk::PoolKind::max, true, 2, 6, 7, 7, 3, 3, 2, 2, 1, 1);
  const Shape xs{g.batch, g.height, g.width, g.channels};
  const Shape ys{g.batch, g.out_height(), g.out_width(), g.channels};
  std::mt19937 rng(72);
  std::vector<float> xv(static_cast<std::size_t>(xs.numel())),
      dyv(static_cast<std::size_t>(ys.numel()));
  for (auto& v : xv) v = static_cast<float>(rng() % 3);
  for (auto& v : dyv) v = static_cast<float>(static_cast<int>(rng() % 17) - 8) / 8.0f;
  for (DType dt : kStorageFloats) {
    if (!tested_convolution->supports(sdk::ConvolutionOp::pool2d_backward,
                                      std::vector<DType>{dt, dt}))
      continue;
    auto x = upload(xv, xs, dt);
    auto dy = upload(dyv, ys, dt);
    auto y = zeros(ys, dt);
    auto dx = zeros(xs, dt);
    auto ws = workspace_on(*tested_, tested_convolution->pool2d_workspace_bytes(g, dt));
    tested_convolution->pool2d_forward(g, x.tested->view(), y.tested->view(), ws->view());
    tested_convolution->pool2d_backward(g, dy.tested->view(), x.tested->view(), y.tested->view(),
                                        ws->view(), dx.tested->view());
    const auto want = naive_pool(g, widen(xv), widen(dyv));
    const auto got = tested_values(dx);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want.dx[i]) << sdk::dtype_name(dt) << " element " << i;
  }
}

// PyTorch's max_pool2d on special values (torch 1.13 checked: [NaN, 1] -> NaN, [-inf, -inf] ->
// -inf): a window holding a NaN gives NaN and an all -inf window gives -inf, with or without a
// workspace, in every storage dtype; the NaN is the canonical quiet one whatever the window's NaN
// (sign, payload), so backends agree bit for bit. oneDNN alone gives -3.4e38 for both and drops a
// NaN beside finite values, so this fails on a CPU backend that passes oneDNN's output through. 19
// channels: oneDNN's vector body and its tail both run.
TEST_P(Conformance, PoolingMaxPropagatesNanAndKeepsMinusInfinityAsPyTorch) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  const auto g = pool_geometry(sdk::PoolKind::max, true, 2, 19, 7, 7, 3, 3, 2, 2, 1, 1);
  const Shape xs{g.batch, g.height, g.width, g.channels};
  const Shape ys{g.batch, g.out_height(), g.out_width(), g.channels};
  auto xv = random_values(static_cast<std::size_t>(xs.numel()), 73, -2.f, 2.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const auto at = [&](std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c) -> float& {
    return xv[static_cast<std::size_t>(((n * g.height + h) * g.width + w) * g.channels + c)];
  };
  at(0, 0, 0, 0) = nan;                 // a window's first element (padding aside)
  at(0, 3, 4, 7) = -nan;                // the middle of windows, beside finite values; negative
  at(1, 6, 6, 18) = nan;                // the last channel, the image's corner
  for (std::int64_t h = 0; h < 2; ++h)  // the top-left window of channel 3 is all -inf
    for (std::int64_t w = 0; w < 2; ++w) at(1, h, w, 3) = minus_inf;
  at(0, 5, 5, 11) = minus_inf;  // one -inf among finite values changes nothing
  for (std::int64_t c = 0; c < g.channels; ++c) at(0, 2, 2, c) = nan;  // a NaN in every channel
  // The rule in double, from the values as stored in each dtype.
  const auto want = [&](const std::vector<float>& x) {
    std::vector<double> y(static_cast<std::size_t>(ys.numel()));
    for (std::int64_t n = 0; n < g.batch; ++n)
      for (std::int64_t oh = 0; oh < g.out_height(); ++oh)
        for (std::int64_t ow = 0; ow < g.out_width(); ++ow)
          for (std::int64_t c = 0; c < g.channels; ++c) {
            double best = -std::numeric_limits<double>::infinity();
            for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const std::int64_t ih = oh * g.stride_h - g.pad_h + kh;
                const std::int64_t iw = ow * g.stride_w - g.pad_w + kw;
                if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                const double v = x[static_cast<std::size_t>(
                    ((n * g.height + ih) * g.width + iw) * g.channels + c)];
                if (std::isnan(v) || v > best) best = v;
                if (std::isnan(best)) break;
              }
            y[static_cast<std::size_t>(
                ((n * g.out_height() + oh) * g.out_width() + ow) * g.channels + c)] = best;
          }
    return y;
  };
  for (DType dt : kStorageFloats) {
    if (!tested_convolution->supports(sdk::ConvolutionOp::pool2d_forward,
                                      std::vector<DType>{dt, dt}))
      continue;
    // Unsaturated: -inf stays -inf in 16 bits (upload() would make it the lowest finite value).
    const auto x = make_on(*tested_, xv, xs, dt, 1.0f, /*saturate=*/false);
    const auto expected = want(download(*tested_, x->view()));
    std::size_t nans = 0, minus_infs = 0;
    for (double v : expected) {
      nans += std::isnan(v) ? 1 : 0;
      minus_infs += v == -std::numeric_limits<double>::infinity() ? 1 : 0;
    }
    ASSERT_GE(nans, 20u) << "the case must hold NaN windows";
    ASSERT_EQ(minus_infs, 1u) << "the case must hold one all -inf window, " << sdk::dtype_name(dt);
    auto ws = workspace_on(*tested_, tested_convolution->pool2d_workspace_bytes(g, dt));
    for (bool training : {true, false}) {
      auto y = zeros(ys, dt);
      tested_convolution->pool2d_forward(g, x->view(), y.tested->view(),
                                         training ? ws->view() : TensorView{});
      const auto got = tested_values(y);
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(expected[i]))
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), 0x7FC00000u)
              << sdk::dtype_name(dt) << (training ? ", workspace" : ", no workspace") << ": output "
              << i << " is " << got[i] << ", its window holds a NaN (the canonical quiet NaN)";
        else
          ASSERT_EQ(static_cast<double>(got[i]), expected[i])
              << sdk::dtype_name(dt) << (training ? ", workspace" : ", no workspace") << ": output "
              << i;
      }
    }
  }
}

// Batch norm in double over [rows, C]: the batch statistics, y, and the training backward.

}  // namespace
}  // namespace mixtrain::conformance
