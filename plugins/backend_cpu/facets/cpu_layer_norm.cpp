// CpuLayerNorm: the CPU backend's LayerNormFacet over rows of fp32 / bf16 / fp16 storage: a
// two-pass mean and variance in double per row, fp32 normalisation, one rounding per output
// (the forward's row kernels: cpu_layernorm_kernels.h);
// the backward's parameter gradients are summed in double per thread, then across threads; its
// input gradient is written, or added into an fp32 sum (1.1's layernorm_backward_accumulate); the
// residual add before it can run in the forward's row pass (1.2's layernorm_add_forward).
#include <algorithm>
#include <cmath>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <omp.h>

#include "cpu_access.h"
#include "cpu_bf16_rows.h"
#include "cpu_context.h"
#include "cpu_layernorm_kernels.h"
#include "cpu_typed_storage.h"
#include "mixtrain/sdk/backend_layer_norm.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

// A small fp32 vector ([n] parameters such as bias or gamma): the tensor itself when fp32,
// else a converted copy. An empty view yields `fallback` everywhere.
class Fp32Vector {
 public:
  Fp32Vector(const TensorView& v, std::int64_t n, float fallback) {
    if (!v.empty() && is_fp32_storage(v.dtype)) {
      ptr_ = v.as<const float>();
      return;
    }
    copy_.assign(static_cast<std::size_t>(n), fallback);
    if (!v.empty())
      for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const std::int64_t len = std::min(kChunk, n - c0);
        const float* src = read_chunk(v, c0, len, copy_.data() + c0);
        (void)src;  // 16-bit storage: converted straight into copy_
      }
    ptr_ = copy_.data();
  }
  const float* data() const { return ptr_; }

 private:
  const float* ptr_ = nullptr;
  std::vector<float> copy_;
};

class CpuLayerNorm final : public sdk::LayerNormFacet {
 public:
  explicit CpuLayerNorm(CpuContext& context) : context_(context) {}

  void layernorm_forward(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta, float eps,
                         sdk::TensorView y, sdk::TensorView mean, sdk::TensorView rstd) override;
  void layernorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView gamma,
                          sdk::TensorView mean, sdk::TensorView rstd, sdk::TensorView dx,
                          sdk::TensorView dgamma, sdk::TensorView dbeta, bool accumulate) override;
  // layernorm_backward with dx fp32 added to: the same row pass, its last loop adding.
  void layernorm_backward_accumulate(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView gamma,
                                     sdk::TensorView mean, sdk::TensorView rstd, sdk::TensorView dx,
                                     sdk::TensorView dgamma, sdk::TensorView dbeta,
                                     bool accumulate) override;
  // The residual add's row summed and rounded into `sum`, then normalised from what was stored.
  void layernorm_add_forward(const sdk::LayerNormAddArgs& args) override;
  bool supports(sdk::LayerNormOp op, std::span<const sdk::DType> dtypes) const override;

 private:
  void backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView mean,
                sdk::TensorView rstd, sdk::TensorView dx, sdk::TensorView dgamma,
                sdk::TensorView dbeta, bool accumulate, bool add_into_dx);
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::LayerNormFacet, CpuLayerNorm> kRegistration;

}  // namespace

namespace {

// Row r of y = layernorm(in), its mean and rstd, for storage the typed kernels do not take (fp16,
// mixed dtypes): their arithmetic on the row decoded to fp32, so every path writes the same bits.
void normalize_row(const float* in, std::int64_t r, std::int64_t n, float eps, const float* gp,
                   const float* bp, const TensorView& y, std::vector<float>& out_buf,
                   float* mean_out, float* rstd_out) {
  float* out = row_target(y, r, n, out_buf);  // may alias `in` when y == x: element-wise
  normalize_float_row(in, n, eps, gp, bp, out, mean_out + r, rstd_out + r);
  commit_row(y, r, n, out);
}

// read_row, with bf16 rows decoded inline rather than through the SDK's bulk converter, which
// costs a call per row (cpu_bf16_rows.h).
const float* read_row_decoded(const TensorView& v, std::int64_t r, std::int64_t n,
                              std::vector<float>& buf) {
  if (v.dtype != sdk::DType::bf16) return read_row(v, r, n, buf);
  buf.resize(static_cast<std::size_t>(n));
  decode_bf16_rows(v.as<const Bf16Bits>() + r * n, n, 1, n, buf.data());
  return buf.data();
}

}  // namespace

void CpuLayerNorm::layernorm_forward(TensorView x, TensorView gamma, TensorView beta, float eps,
                                     TensorView y, TensorView mean, TensorView rstd) {
  context_.use_threads();
  const auto shape = checks().layernorm_forward_shape(x, gamma, beta, y, mean, rstd);
  const std::int64_t rows = shape.rows, n = shape.cols;
  const Fp32Vector g(gamma, n, 1.0f);
  const Fp32Vector b(beta, n, 0.0f);
  float* mean_out = mean.as<float>();
  float* rstd_out = rstd.as<float>();
  if (typed_storage(x) && typed_storage(y)) {
    with_typed(x, [&](auto* xp) {
      with_typed(y, [&](auto* yp) {
        layernorm_rows(static_cast<const std::remove_pointer_t<decltype(xp)>*>(xp), yp, rows, n,
                       eps, g.data(), b.data(), mean_out, rstd_out);
      });
    });
    return;
  }
#pragma omp parallel if (parallel_worth(rows * n))
  {
    std::vector<float> in_buf, out_buf;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r)
      normalize_row(read_row(x, r, n, in_buf), r, n, eps, g.data(), b.data(), y, out_buf, mean_out,
                    rstd_out);
  }
}

void CpuLayerNorm::layernorm_add_forward(const sdk::LayerNormAddArgs& args) {
  context_.use_threads();
  const auto shape = checks().layernorm_add_forward_shape(args);
  const std::int64_t rows = shape.rows, n = shape.cols;
  const Fp32Vector g(args.gamma, n, 1.0f);
  const Fp32Vector b(args.beta, n, 0.0f);
  float* mean_out = args.mean.as<float>();
  float* rstd_out = args.rstd.as<float>();
  if (args.a.dtype == args.sum.dtype && args.b.dtype == args.sum.dtype && typed_storage(args.sum) &&
      typed_storage(args.y)) {
    with_typed(args.sum, [&](auto* sum) {
      using T = std::remove_pointer_t<decltype(sum)>;
      with_typed(args.y, [&](auto* yp) {
        add_layernorm_rows(static_cast<const T*>(args.a.data), static_cast<const T*>(args.b.data),
                           sum, yp, rows, n, args.eps, g.data(), b.data(), mean_out, rstd_out);
      });
    });
    return;
  }
  // Mixed or fp16 storage: a row at a time, as the layer norm alone: its buffers stay in L1 (blocks
  // of several rows measured slower, bench/gpt/bench_add_layer_norm).
#pragma omp parallel if (parallel_worth(rows * n))
  {
    std::vector<float> a_buf, b_buf, sum_buf, in_buf, out_buf;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* ar = read_row(args.a, r, n, a_buf);
      const float* br = read_row(args.b, r, n, b_buf);
      float* s = row_target(args.sum, r, n, sum_buf);  // may be a's or b's row: element-wise
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j) s[j] = ar[j] + br[j];
      commit_row(args.sum, r, n, s);
      // The layer norm reads the sum as stored, rounded, as it would read it from memory.
      const float* in = is_fp32_storage(args.sum.dtype) ? s : read_row(args.sum, r, n, in_buf);
      normalize_row(in, r, n, args.eps, g.data(), b.data(), args.y, out_buf, mean_out, rstd_out);
    }
  }
}

bool CpuLayerNorm::supports(sdk::LayerNormOp op, std::span<const sdk::DType> dtypes) const {
  if (op == sdk::LayerNormOp::layernorm_backward_accumulate)
    return LayerNormFacet::supports(sdk::LayerNormOp::layernorm_backward, dtypes);
  if (op == sdk::LayerNormOp::layernorm_add_forward)  // {a, b, sum, y}: any storage float each
    return dtypes.size() == 4 && std::all_of(dtypes.begin(), dtypes.end(),
                                             [](sdk::DType t) { return is_storage_float(t); });
  return LayerNormFacet::supports(op, dtypes);
}

void CpuLayerNorm::layernorm_backward(TensorView dy, TensorView x, TensorView gamma,
                                      TensorView mean, TensorView rstd, TensorView dx,
                                      TensorView dgamma, TensorView dbeta, bool accumulate) {
  checks().layernorm_backward_shape(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, accumulate, false);
}

void CpuLayerNorm::layernorm_backward_accumulate(TensorView dy, TensorView x, TensorView gamma,
                                                 TensorView mean, TensorView rstd, TensorView dx,
                                                 TensorView dgamma, TensorView dbeta,
                                                 bool accumulate) {
  checks().layernorm_backward_accumulate_shape(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, accumulate, true);
}

void CpuLayerNorm::backward(TensorView dy, TensorView x, TensorView gamma, TensorView mean,
                            TensorView rstd, TensorView dx, TensorView dgamma, TensorView dbeta,
                            bool accumulate, bool add_into_dx) {
  context_.use_threads();
  const std::int64_t rows = x.shape.rows(), n = x.shape.cols();
  const bool want_dgamma = !dgamma.empty();
  const bool want_dbeta = !dbeta.empty();
  const Fp32Vector g(gamma, n, 1.0f);
  const float* gp = g.data();
  const float* mean_in = mean.as<const float>();
  const float* rstd_in = rstd.as<const float>();
  // Each thread's parameter-gradient sums, added across threads in thread order after the rows:
  // the same bits on every run for a given team (merged as threads finish, three or more
  // threads' sums would round in a different order from run to run). Each thread sums into
  // vectors of its own while it runs and copies them into its slice at the end: summing in the
  // slices ran the op 1.8x slower (the threads' writes met on the lines between them), and
  // handing the vectors themselves over 1.5x (the main thread freed another thread's memory).
  const auto width = static_cast<std::size_t>(n);
  const bool parallel = parallel_worth(rows * n);
  const auto team = parallel ? static_cast<std::size_t>(std::max(1, omp_get_max_threads())) : 1;
  std::vector<double> dgamma_parts(want_dgamma ? team * width : 0, 0.0);
  std::vector<double> dbeta_parts(want_dbeta ? team * width : 0, 0.0);
  // fp32 x, dy and dx (or the fp32 sum), or bf16 x, dy and dx: the typed kernels. Other storage
  // runs a decoded row at a time through the fp32 kernel, over the same split of the rows; bf16
  // rows decode inline (cpu_bf16_rows.h). That row path is also the faster one for bf16 x and dy
  // with an fp32 dx (GPT's case): the typed kernel decodes each element in four loops, the row
  // path once (bench/gpt/bench_add_layer_norm: 0.130 -> 0.081 ms for 1024 x 128 on 2 threads).
  const bool typed = x.dtype == dy.dtype && typed_storage(x) &&
                     (is_fp32_storage(x.dtype) ? add_into_dx || is_fp32_storage(dx.dtype)
                                               : !add_into_dx && dx.dtype == x.dtype);
#pragma omp parallel if (parallel)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const std::int64_t threads = omp_get_num_threads();
    const std::int64_t r0 = rows * static_cast<std::int64_t>(t) / threads;
    const std::int64_t r1 = rows * (static_cast<std::int64_t>(t) + 1) / threads;
    std::vector<double> dgamma_mine(want_dgamma ? width : 0, 0.0);
    std::vector<double> dbeta_mine(want_dbeta ? width : 0, 0.0);
    double* dgamma_part = want_dgamma ? dgamma_mine.data() : nullptr;
    double* dbeta_part = want_dbeta ? dbeta_mine.data() : nullptr;
    if (typed) {
      with_typed(x, [&](auto* xp) {
        using T = std::remove_pointer_t<decltype(xp)>;
        const auto* dyp = static_cast<const T*>(dy.data);
        with_typed(dx, [&](auto* dxp) {
          using D = std::remove_pointer_t<decltype(dxp)>;
          if constexpr (std::is_same_v<T, D>)  // the only pairs `typed` lets through
            layernorm_backward_range(static_cast<const T*>(xp), dyp, gp, mean_in, rstd_in, dxp,
                                     add_into_dx, r0, r1, n, dgamma_part, dbeta_part);
        });
      });
    } else {
      std::vector<float> x_buf, dy_buf, out_buf;
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* xs = read_row_decoded(x, r, n, x_buf);
        const float* gy = read_row_decoded(dy, r, n, dy_buf);
        // add_into_dx: dx is fp32 and apart from dy and x (checked), the host's sum.
        float* out = add_into_dx ? dx.as<float>() + r * n : row_target(dx, r, n, out_buf);
        layernorm_backward_range(xs, gy, gp, mean_in + r, rstd_in + r, out, add_into_dx,
                                 std::int64_t{0}, std::int64_t{1}, n, dgamma_part, dbeta_part);
        if (!add_into_dx) commit_row(dx, r, n, out);  // dx may alias dy: after the row's sums
      }
    }
    if (want_dgamma) std::copy(dgamma_mine.begin(), dgamma_mine.end(), &dgamma_parts[t * width]);
    if (want_dbeta) std::copy(dbeta_mine.begin(), dbeta_mine.end(), &dbeta_parts[t * width]);
  }
  // The threads' sums in thread order (a thread without rows added zeros; one that did not run,
  // nothing).
  const auto finish = [&](const std::vector<double>& parts, const TensorView& grad) {
    float* out = grad.as<float>();
    for (std::size_t j = 0; j < width; ++j) {
      double sum = 0.0;
      for (std::size_t t = 0; t < team; ++t) sum += parts[t * width + j];
      out[j] = static_cast<float>((accumulate ? out[j] : 0.0) + sum);
    }
  };
  if (want_dgamma) finish(dgamma_parts, dgamma);
  if (want_dbeta) finish(dbeta_parts, dbeta);
}

}  // namespace mixtrain::backend_cpu
