// CpuBackend's batch-norm kernels on the shapes the conformance case (70 rows of 6 channels, one
// thread) does not reach: the compile-time channel widths (16, 32, 64 and multiples of 64), a
// width with a remainder slice, many L1 blocks per thread and two threads, every storage dtype,
// the fused ReLU's mask recomputed from the workspace or taken from y, and data whose mean is
// far from zero (where E[x²] − E[x]² would cancel). Each is checked against a double reference.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "cpu_batchnorm_kernels.h"
#include "isa_variants.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu::testing {
namespace {

struct Reference {
  std::vector<double> mean, var, y, dx, dgamma, dbeta;
};

// Batch norm in double over [rows, C], training statistics (biased variance); dy = r.
Reference reference(const std::vector<float>& x, const std::vector<float>& gamma,
                    const std::vector<float>& beta, const std::vector<float>& r, std::int64_t rows,
                    std::int64_t c, double eps, bool relu) {
  Reference out;
  const auto n = static_cast<std::size_t>(rows * c);
  out.mean.assign(static_cast<std::size_t>(c), 0.0);
  out.var.assign(static_cast<std::size_t>(c), 0.0);
  for (std::size_t i = 0; i < n; ++i) out.mean[i % static_cast<std::size_t>(c)] += x[i];
  for (double& m : out.mean) m /= static_cast<double>(rows);
  for (std::size_t i = 0; i < n; ++i) {
    const double d = x[i] - out.mean[i % static_cast<std::size_t>(c)];
    out.var[i % static_cast<std::size_t>(c)] += d * d;
  }
  for (double& v : out.var) v /= static_cast<double>(rows);
  out.y.resize(n);
  std::vector<double> g(n), xhat(n);
  out.dgamma.assign(static_cast<std::size_t>(c), 0.0);
  out.dbeta.assign(static_cast<std::size_t>(c), 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t j = i % static_cast<std::size_t>(c);
    xhat[i] = (x[i] - out.mean[j]) / std::sqrt(out.var[j] + eps);
    const double v = xhat[i] * gamma[j] + beta[j];
    out.y[i] = relu ? std::max(v, 0.0) : v;
    g[i] = relu && v <= 0.0 ? 0.0 : r[i];
    out.dbeta[j] += g[i];
    out.dgamma[j] += g[i] * xhat[i];
  }
  out.dx.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t j = i % static_cast<std::size_t>(c);
    const double inv = 1.0 / std::sqrt(out.var[j] + eps);
    out.dx[i] = gamma[j] * inv *
                (g[i] - out.dbeta[j] / static_cast<double>(rows) -
                 xhat[i] * out.dgamma[j] / static_cast<double>(rows));
  }
  return out;
}

// dy with zeros where the pre-ReLU value is within `margin` of 0: there the FP32 kernel and the
// double reference may disagree on the ReLU's side (v is computed from x − mean with an fp32
// mean), and either answer is right.
std::vector<float> zero_at_relu_edges(std::vector<float> dy, const std::vector<float>& x,
                                      const std::vector<float>& gamma,
                                      const std::vector<float>& beta, std::int64_t rows,
                                      std::int64_t c, double margin) {
  const Reference stats = reference(x, gamma, beta, dy, rows, c, 1e-5, false);
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::abs(stats.y[i]) < margin) dy[i] = 0.0f;
  return dy;
}

TEST(BackendCpuBatchNorm, KernelsMatchADoubleReferenceAcrossWidthsDtypesAndThreads) {
  // One thread on every ISA variant of the kernels this CPU runs (cpu_isa.h), two on the widest.
  for (const auto& [threads, isa] : thread_and_isa_runs()) {
    const IsaScope as_isa(isa);
    CpuBackend be(threads);
    // 16, 32, 64 and 128 run compile-time widths; 80 is a 64-wide slice and a 16-wide remainder;
    // 6 the runtime width. rows·C ≥ 2^15 runs both threads over many blocks.
    for (const std::int64_t c : {16, 32, 64, 128, 80, 6}) {
      const std::int64_t rows = std::max<std::int64_t>(2048, 65536 / c) + 3;  // a partial block
      const auto n = static_cast<std::size_t>(rows * c);
      // A mean of 100 against a spread of 1: a one-pass E[x²] − E[x]² in fp32 loses the variance.
      const auto xv = random_values(n, 7, 99.0f, 101.0f);
      const auto rv = random_values(n, 8);
      const auto gv = random_values(static_cast<std::size_t>(c), 9, 0.5f, 1.5f);
      const auto bv = random_values(static_cast<std::size_t>(c), 10, -0.3f, 0.3f);
      for (const DType dt : {DType::fp32, DType::bf16, DType::fp16})
        for (const bool relu : {false, true})
          for (const bool with_workspace : {true, false}) {
            if (!relu && !with_workspace) continue;
            const std::string what = isa_name(isa) + ", threads " + std::to_string(threads) +
                                     ", C " + std::to_string(c) + ", " +
                                     std::string(sdk::dtype_name(dt)) + (relu ? ", relu" : "") +
                                     (with_workspace ? "" : ", mask from y");
            const sdk::BatchNormShape s{rows, c, 1e-5f, relu};
            const Shape shape{rows, c};
            DeviceTensor x(be, dt, shape, xv), y(be, dt, shape), dx(be, dt, shape);
            const auto x_stored = x.get();  // the values after rounding to dt
            DeviceTensor r(be, dt, shape,
                           relu ? zero_at_relu_edges(rv, x_stored, gv, bv, rows, c, 1e-3) : rv);
            const Reference want = reference(x_stored, gv, bv, r.get(), rows, c, 1e-5, relu);
            DeviceTensor gamma(be, DType::fp32, Shape{c}, gv), beta(be, DType::fp32, Shape{c}, bv);
            DeviceTensor mean(be, DType::fp32, Shape{c}), var(be, DType::fp32, Shape{c});
            DeviceTensor dg(be, DType::fp32, Shape{c}), db(be, DType::fp32, Shape{c});
            const std::size_t ws_bytes =
                sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_workspace_bytes(s, dt);
            EXPECT_EQ(ws_bytes, relu ? 2 * static_cast<std::size_t>(c) * sizeof(float) : 0u);
            DeviceTensor ws(be, DType::fp32, Shape{std::max<std::int64_t>(1, c * 2)});
            const TensorView ws_view = relu && with_workspace ? ws.view() : TensorView{};
            sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_forward_training(
                x, gamma, beta, s, 0.1f, y, mean, var, {}, {}, ws_view);
            EXPECT_LE(relative_error(mean.get(), want.mean), 1e-6) << "mean, " << what;
            EXPECT_LE(relative_error(var.get(), want.var), 1e-5) << "var, " << what;
            const double out_tol = dt == DType::fp32 ? 1e-5 : dt == DType::bf16 ? 8e-3 : 1e-3;
            EXPECT_LE(relative_error(y.get(), want.y), out_tol) << "y, " << what;

            sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_backward(r, x, y, gamma, mean, var, s,
                                                                    ws_view, dx, dg, db, false);
            EXPECT_LE(relative_error(dx.get(), want.dx), dt == DType::fp32 ? 1e-5 : 1e-2)
                << "dx, " << what;
            EXPECT_LE(relative_error(dg.get(), want.dgamma), dt == DType::fp32 ? 1e-4 : 2e-2)
                << "dgamma, " << what;
            EXPECT_LE(relative_error(db.get(), want.dbeta), dt == DType::fp32 ? 1e-5 : 1e-2)
                << "dbeta, " << what;
          }
    }
  }
}

// The backward's ReLU mask from the workspace is the forward's, in bf16 where y's rounding
// could hide a difference: a gradient only on the elements the forward cut (y = 0) gives dx = 0
// and dbeta = 0 exactly; one only on the others gives dbeta = their count per channel.
TEST(BackendCpuBatchNorm, WorkspaceMaskCutsExactlyWhereTheForwardCut) {
  CpuBackend be(2);
  const std::int64_t rows = 4096, c = 16;
  const sdk::BatchNormShape s{rows, c, 1e-5f, true};
  const Shape shape{rows, c};
  const auto xv = random_values(static_cast<std::size_t>(rows * c), 11, -2.0f, 2.0f);
  DeviceTensor x(be, DType::bf16, shape, xv), y(be, DType::bf16, shape);
  DeviceTensor gamma(be, DType::fp32, Shape{c}, std::vector<float>(c, 1.0f));
  DeviceTensor beta(be, DType::fp32, Shape{c});
  DeviceTensor mean(be, DType::fp32, Shape{c}), var(be, DType::fp32, Shape{c});
  DeviceTensor ws(be, DType::fp32, Shape{2 * c});
  sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_forward_training(x, gamma, beta, s, 0.1f, y, mean,
                                                                  var, {}, {}, ws);
  const auto yv = y.get();
  std::vector<float> on_cut(yv.size()), on_kept(yv.size());
  std::vector<float> kept(static_cast<std::size_t>(c), 0.0f);
  for (std::size_t i = 0; i < yv.size(); ++i) {
    on_cut[i] = yv[i] > 0.0f ? 0.0f : 1.0f;
    on_kept[i] = 1.0f - on_cut[i];
    kept[i % static_cast<std::size_t>(c)] += on_kept[i];
  }
  DeviceTensor dx(be, DType::bf16, shape), dg(be, DType::fp32, Shape{c}),
      db(be, DType::fp32, Shape{c});
  DeviceTensor r_cut(be, DType::bf16, shape, on_cut);
  sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_backward(r_cut, x, {}, gamma, mean, var, s, ws, dx,
                                                          dg, db, false);
  for (const float v : dx.get()) ASSERT_EQ(v, 0.0f);
  for (const float v : db.get()) EXPECT_EQ(v, 0.0f);
  DeviceTensor r_kept(be, DType::bf16, shape, on_kept);
  sdk::facet<sdk::BatchNormFacet>(be)->batchnorm_backward(r_kept, x, {}, gamma, mean, var, s, ws,
                                                          dx, dg, db, false);
  EXPECT_EQ(db.get(), kept);
}

// Every channel's gradient cancels: dy has its mean and its projection on x − mean taken out
// (least squares in double, then rounded to fp32), so Σ dy and Σ dy·x̂ are a millionth of their
// terms' magnitudes. The sums must still be the double sums of the stored values, per channel, on
// the kernels' every width (the runtime one, 16, a 64-slice with a remainder, 256) and with one
// and two threads. (The conformance case checks the same through the facet on every backend.)
TEST(BackendCpuBatchNorm, BackwardSumsOfCancellingChannelsAreDoubleAccurate) {
  for (const int threads : {1, 2}) {
    CpuBackend be(threads);
    for (const std::int64_t c : {6, 16, 80, 256}) {
      const std::int64_t rows = 6272;  // 32 images of 14x14
      const auto C = static_cast<std::size_t>(c);
      const auto n = static_cast<std::size_t>(rows * c);
      const auto xv = random_values(n, 21, -1.0f, 3.0f);
      auto dyv = random_values(n, 22);
      for (std::size_t j = 0; j < C; ++j) {
        double sx = 0, su = 0;
        for (std::size_t i = j; i < n; i += C) {
          sx += xv[i];
          su += dyv[i];
        }
        const double mx = sx / static_cast<double>(rows), mu = su / static_cast<double>(rows);
        double sdd = 0, sud = 0;
        for (std::size_t i = j; i < n; i += C) {
          sdd += (xv[i] - mx) * (xv[i] - mx);
          sud += (dyv[i] - mu) * (xv[i] - mx);
        }
        for (std::size_t i = j; i < n; i += C)
          dyv[i] = static_cast<float>(dyv[i] - mu - sud / sdd * (xv[i] - mx));
      }
      const std::vector<float> gv(C, 1.0f), bv(C, 0.0f);
      const Reference want = reference(xv, gv, bv, dyv, rows, c, 1e-5, false);
      const sdk::BatchNormShape s{rows, c, 1e-5f, false};
      const Shape shape{rows, c};
      DeviceTensor x(be, DType::fp32, shape, xv), y(be, DType::fp32, shape),
          dy(be, DType::fp32, shape, dyv), dx(be, DType::fp32, shape);
      DeviceTensor gamma(be, DType::fp32, Shape{c}, gv), beta(be, DType::fp32, Shape{c}, bv);
      DeviceTensor mean(be, DType::fp32, Shape{c}), var(be, DType::fp32, Shape{c});
      DeviceTensor dg(be, DType::fp32, Shape{c}), db(be, DType::fp32, Shape{c});
      auto* bn = sdk::facet<sdk::BatchNormFacet>(be);
      bn->batchnorm_forward_training(x, gamma, beta, s, 0.1f, y, mean, var, {}, {}, {});
      bn->batchnorm_backward(dy, x, y, gamma, mean, var, s, {}, dx, dg, db, false);
      const auto got_db = db.get(), got_dg = dg.get();
      for (std::size_t j = 0; j < C; ++j) {
        double abs_sum = 0.0;
        for (std::size_t i = j; i < n; i += C) abs_sum += std::abs(dyv[i]);
        ASSERT_GT(abs_sum, 1e5 * std::abs(want.dbeta[j])) << "channel " << j << " cancels";
        const std::string what = "channel " + std::to_string(j) + " of " + std::to_string(c) +
                                 ", threads " + std::to_string(threads);
        // 1e-4: the kernel's x − mean uses the saved fp32 mean, the reference the double one;
        // that moves Σ dy·x̂ by (their difference)·Σ dy, ~1e-5 of it where it cancels the most.
        EXPECT_NEAR(got_db[j], want.dbeta[j], 1e-5 * std::abs(want.dbeta[j])) << "dbeta, " << what;
        EXPECT_NEAR(got_dg[j], want.dgamma[j], 1e-4 * std::abs(want.dgamma[j]))
            << "dgamma, " << what;
      }
    }
  }
}

// The kernels' in-loop bf16 encode is the SDK's (RNE, overflow to inf, NaN quieted with its
// sign), bit for bit: every exponent with random mantissas, the rounding ties and the specials.
TEST(BackendCpuBatchNorm, InLoopBf16EncodeIsTheSdksBitForBit) {
  std::vector<std::uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x00008000u,
                                     0x00018000u, 0x3F808000u, 0x3F818000u, 0x7F7F7FFFu,
                                     0x7F7F8000u, 0x7F7FFFFFu, 0x7F800000u, 0xFF800000u,
                                     0x7F800001u, 0xFFC00000u, 0x7FBFFFFFu, 0x807FFFFFu};
  std::mt19937 rng(3);
  for (std::uint32_t e = 0; e < 256; ++e)
    for (int k = 0; k < 2000; ++k)
      bits.push_back((static_cast<std::uint32_t>(rng() & 1u) << 31) | (e << 23) |
                     (rng() & 0x7FFFFFu));
  for (const std::uint32_t b : bits) {
    const float v = std::bit_cast<float>(b);
    ASSERT_EQ(bf16_from_float(v), sdk::encode_bf16(v, sdk::Overflow::to_inf_or_nan))
        << "fp32 bits 0x" << std::hex << b;
    // The decode is exact for every non-NaN (NaNs are quieted by the arithmetic that reads them).
    const auto h = static_cast<Bf16Bits>(b >> 16);
    if (!std::isnan(sdk::decode_bf16(h))) {
      ASSERT_EQ(float_from_bf16(h), sdk::decode_bf16(h));
    }
  }
}

// fp16 batch norm is the fp32 kernels' arithmetic on the decoded values, each output rounded once
// (the kernels run it on chunks of decoded rows): the forward (statistics, y with and without the
// residual add) and the backward (dx, dgamma, dbeta, with the ReLU mask from the workspace and
// from y) against the fp32 facet run on the decoded inputs, bit for bit, on every ISA variant and
// with two threads, on shapes of several chunks and a partial one, narrow and wide (C > 64).
TEST(BackendCpuBatchNorm, Fp16IsTheFp32KernelsOnTheDecodedValuesRoundedOnce) {
  const auto bits_of = [](const std::vector<float>& v) {
    std::vector<std::uint32_t> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = std::bit_cast<std::uint32_t>(v[i]);
    return out;
  };
  const auto rounded = [](std::vector<float> v) {
    for (float& e : v) e = sdk::decode_fp16(sdk::encode_fp16(e, sdk::Overflow::to_inf_or_nan));
    return v;
  };
  for (const auto& [threads, isa] : thread_and_isa_runs()) {
    const IsaScope as_isa(isa);
    CpuBackend be(threads);
    auto* bn = sdk::facet<sdk::BatchNormFacet>(be);
    for (const std::int64_t c : {16, 80, 256, 6}) {
      const std::int64_t rows = 65536 / c + 5;
      const auto n = static_cast<std::size_t>(rows * c);
      const sdk::BatchNormShape s{rows, c, 1e-5f, true};
      const Shape shape{rows, c};
      const std::string what =
          isa_name(isa) + ", threads " + std::to_string(threads) + ", C " + std::to_string(c);
      // Values down to fp16's subnormals.
      auto xv = random_values(n, 31, -3.0f, 3.0f);
      for (std::size_t i = 0; i < n; i += 7) xv[i] *= 1e-6f;
      DeviceTensor x16(be, DType::fp16, shape, xv),
          res16(be, DType::fp16, shape, random_values(n, 32));
      DeviceTensor dy16(be, DType::fp16, shape, random_values(n, 33));
      DeviceTensor x32(be, DType::fp32, shape, x16.get()),
          res32(be, DType::fp32, shape, res16.get());
      DeviceTensor dy32(be, DType::fp32, shape, dy16.get());
      DeviceTensor gamma(be, DType::fp32, Shape{c},
                         random_values(static_cast<std::size_t>(c), 34, 0.5f, 1.5f));
      DeviceTensor beta(be, DType::fp32, Shape{c},
                        random_values(static_cast<std::size_t>(c), 35, -0.3f, 0.3f));
      struct Run {
        DeviceTensor y, mean, var, ws, dx, dg, db;
      };
      const auto run = [&](DType dt, const DeviceTensor& x, const DeviceTensor& res,
                           const DeviceTensor& dy, const DeviceTensor* y_for_mask, bool add) {
        // DeviceTensor does not move: the run is built in place.
        std::unique_ptr<Run> run_out(new Run{
            DeviceTensor(be, dt, shape), DeviceTensor(be, DType::fp32, Shape{c}),
            DeviceTensor(be, DType::fp32, Shape{c}), DeviceTensor(be, DType::fp32, Shape{2 * c}),
            DeviceTensor(be, dt, shape), DeviceTensor(be, DType::fp32, Shape{c}),
            DeviceTensor(be, DType::fp32, Shape{c})});
        Run& r = *run_out;
        if (add) {
          sdk::BatchNormAddArgs a;
          a.x = x;
          a.residual = res;
          a.gamma = gamma;
          a.beta = beta;
          a.shape = s;
          a.training = true;
          a.momentum = 0.1f;
          a.y = r.y;
          a.save_mean = r.mean;
          a.save_var = r.var;
          bn->batchnorm_add_forward(a);
        } else {
          bn->batchnorm_forward_training(x, gamma, beta, s, 0.1f, r.y, r.mean, r.var, {}, {}, r.ws);
        }
        // The mask from y when one is given (the fp32 run reads the fp16 run's y, decoded), else
        // recomputed from the forward's workspace.
        const TensorView y = y_for_mask != nullptr ? y_for_mask->view() : r.y.view();
        const TensorView ws = add ? TensorView{} : r.ws.view();
        bn->batchnorm_backward(dy, x, y, gamma, r.mean, r.var, s, ws, r.dx, r.dg, r.db, false);
        return run_out;
      };
      for (const bool add : {false, true}) {
        const std::string w = what + (add ? ", add + relu (mask from y)" : ", relu (workspace)");
        const auto hp = run(DType::fp16, x16, res16, dy16, nullptr, add);
        const Run& h = *hp;
        DeviceTensor y16_decoded(be, DType::fp32, shape, h.y.get());
        const auto fp = run(DType::fp32, x32, res32, dy32, add ? &y16_decoded : nullptr, add);
        const Run& f = *fp;
        EXPECT_EQ(bits_of(h.mean.get()), bits_of(f.mean.get())) << "mean, " << w;
        EXPECT_EQ(bits_of(h.var.get()), bits_of(f.var.get())) << "var, " << w;
        EXPECT_EQ(bits_of(h.y.get()), bits_of(rounded(f.y.get()))) << "y, " << w;
        EXPECT_EQ(bits_of(h.dx.get()), bits_of(rounded(f.dx.get()))) << "dx, " << w;
        EXPECT_EQ(bits_of(h.dg.get()), bits_of(f.dg.get())) << "dgamma, " << w;
        EXPECT_EQ(bits_of(h.db.get()), bits_of(f.db.get())) << "dbeta, " << w;
      }
    }
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
