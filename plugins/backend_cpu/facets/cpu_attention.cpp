// CpuBackend's AttentionFacet: the head-layout permutes and the masked scaled softmax.
//
// - split_heads / merge_heads move rows of D elements between x [N, T, P, H, D] and
//   y [P, N, H, T', D]: a memcpy when both sides have the same storage, else an exact decode and
//   one RNE encode (sdk/float_formats.h). Rows of y outside [offset, offset + T) are not touched.
// - The softmax is fp32 with max subtraction; the row sum and the division are in double, so a
//   row's probabilities sum to 1 within an fp32 rounding each. Masked probabilities (and their
//   gradients) are written as exact zeros, never computed.
// - OpenMP over rows (batch * rows for the softmax, P * N * H * T for the permutes), each row
//   written by one thread: results do not depend on the thread count.
// - flash_forward / flash_backward (facet 1.1) and flash_decode (1.3) are cpu_flash_attention.h's;
//   supports() answers for them from the SDK's table, as for the other ops.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_access.h"
#include "cpu_context.h"
#include "cpu_eltwise.h"
#include "cpu_flash_attention.h"
#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

// x [N, T, P, H, D] -> y [P, N, H, T', D] rows [offset, offset + T) (to_heads), or back.
void permute(const TensorView& x, const sdk::HeadLayout& l, const TensorView& y, bool to_heads) {
  const std::int64_t n_batch = l.batch, t_len = l.tokens, parts = l.parts, heads = l.heads;
  const std::int64_t d = l.head_dim, cap = l.capacity(), offset = l.head_offset;
  const std::int64_t rows = parts * n_batch * heads * t_len;
#pragma omp parallel for schedule(static) if (parallel_worth(rows * d))
  for (std::int64_t q = 0; q < rows; ++q) {
    // q runs over y's order (p, n, h, t), so consecutive rows of y are written consecutively.
    const std::int64_t t = q % t_len;
    std::int64_t r = q / t_len;
    const std::int64_t h = r % heads;
    r /= heads;
    const std::int64_t n = r % n_batch;
    const std::int64_t p = r / n_batch;
    const std::int64_t x_at = (((n * t_len + t) * parts + p) * heads + h) * d;
    const std::int64_t y_at = (((p * n_batch + n) * heads + h) * cap + offset + t) * d;
    if (to_heads)
      copy_elements(x, x_at, y, y_at, d);
    else
      copy_elements(y, y_at, x, x_at, d);
  }
}

// Keys row i of a [rows, cols] score matrix sees: j < visible_keys (all of them when not causal).
inline std::int64_t visible_keys(const sdk::SoftmaxShape& s, std::int64_t i) {
  return s.causal ? std::min(s.cols, i + (s.cols - s.rows) + 1) : s.cols;
}

}  // namespace

namespace {

class CpuAttention final : public sdk::AttentionFacet {
 public:
  explicit CpuAttention(CpuContext& context) : context_(context) {}

  // Every op of the SDK's table, the flash ones included (the base answers false for those).
  bool supports(sdk::AttentionOp op, std::span<const DType> dtypes) const override {
    return sdk::signature_accepts(op, dtypes);
  }

  void split_heads(sdk::TensorView x, const sdk::HeadLayout& layout, sdk::TensorView y) override;
  void merge_heads(sdk::TensorView y, const sdk::HeadLayout& layout, sdk::TensorView x) override;
  void softmax_forward(sdk::TensorView scores, const sdk::SoftmaxShape& shape, float scale,
                       sdk::TensorView probs) override;
  void softmax_backward(sdk::TensorView probs, sdk::TensorView dprobs,
                        const sdk::SoftmaxShape& shape, float scale,
                        sdk::TensorView dscores) override;
  void flash_forward(sdk::TensorView qkv, const sdk::HeadLayout& layout, float scale,
                     sdk::TensorView out, sdk::TensorView lse) override;
  void flash_backward(sdk::TensorView qkv, sdk::TensorView out, sdk::TensorView dout,
                      sdk::TensorView lse, const sdk::HeadLayout& layout, float scale,
                      sdk::TensorView dqkv) override;
  void flash_decode(sdk::TensorView cache, const sdk::HeadLayout& layout, float scale,
                    sdk::TensorView out) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::AttentionFacet, CpuAttention> kRegistration;

}  // namespace

void CpuAttention::split_heads(TensorView x, const sdk::HeadLayout& layout, TensorView y) {
  context_.use_threads();
  checks().head_permute("split_heads", x, layout, y);
  permute(x, layout, y, true);
}

void CpuAttention::merge_heads(TensorView y, const sdk::HeadLayout& layout, TensorView x) {
  context_.use_threads();
  checks().head_permute("merge_heads", x, layout, y);
  permute(x, layout, y, false);
}

void CpuAttention::softmax_forward(TensorView scores, const sdk::SoftmaxShape& shape, float scale,
                                   TensorView probs) {
  context_.use_threads();
  const std::int64_t total = checks().softmax_forward(scores, shape, probs);
  const std::int64_t rows = shape.rows, cols = shape.cols, n_rows = shape.batch * rows;
  const float* in = scores.as<const float>();
  float* out = probs.as<float>();
  // Three passes, so that the exponentials run through oneDNN's vectorised exp over the whole
  // tensor (a scalar std::exp per score was most of the softmax's time): z = scale·s − max per
  // row (masked entries −inf), exp, then the row sums in double and the division.
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t q = 0; q < n_rows; ++q) {
    // s is [cols] (one query's scores), z its shifted scores; z may be s itself.
    const float* s = in + q * cols;
    float* z = out + q * cols;
    const std::int64_t visible = visible_keys(shape, q % rows);
    float max_z = -std::numeric_limits<float>::infinity();
    // A select, not std::max, so that GCC vectorises the reduction (the same max of the non-NaN
    // values; cpu_flash_attention.cpp's softmax_step measured the difference).
#pragma omp simd reduction(max : max_z)
    for (std::int64_t j = 0; j < visible; ++j) {
      const float v = scale * s[j];
      max_z = v > max_z ? v : max_z;
    }
#pragma omp simd
    for (std::int64_t j = 0; j < visible; ++j) z[j] = scale * s[j] - max_z;  // NaN stays NaN
    std::fill(z + visible, z + cols, -std::numeric_limits<float>::infinity());
  }
  if (!context_.eltwise().try_exp(out, total)) {
#pragma omp parallel for schedule(static) if (parallel_worth(total))
    for (std::int64_t i = 0; i < total; ++i) out[i] = std::exp(out[i]);
  }
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t q = 0; q < n_rows; ++q) {
    float* p = out + q * cols;
    const std::int64_t visible = visible_keys(shape, q % rows);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t j = 0; j < visible; ++j) sum += static_cast<double>(p[j]);
    // Shifted scores are <= 0, so only a NaN score (or +inf, shifted to inf − inf) makes the sum
    // non-finite, and oneDNN's exp takes NaN to +inf: the whole row is NaN then, as PyTorch's
    // softmax and the CUDA backend make it, not NaN at one key and 0 at the others.
    if (!std::isfinite(sum)) sum = std::numeric_limits<double>::quiet_NaN();
#pragma omp simd
    for (std::int64_t j = 0; j < visible; ++j)
      p[j] = static_cast<float>(static_cast<double>(p[j]) / sum);
    std::fill(p + visible, p + cols, 0.0f);  // exact +0 whatever exp(−inf) came out as
  }
}

void CpuAttention::softmax_backward(TensorView probs, TensorView dprobs,
                                    const sdk::SoftmaxShape& shape, float scale,
                                    TensorView dscores) {
  context_.use_threads();
  const std::int64_t total = checks().softmax_backward(probs, dprobs, shape, dscores);
  const std::int64_t rows = shape.rows, cols = shape.cols;
  const float* p_all = probs.as<const float>();
  const float* dp_all = dprobs.as<const float>();
  float* ds_all = dscores.as<float>();
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t q = 0; q < shape.batch * rows; ++q) {
    // One query's row [cols]; ds may be dp itself: the dot product is done before any write.
    const float* p = p_all + q * cols;
    const float* dp = dp_all + q * cols;
    float* ds = ds_all + q * cols;
    const std::int64_t visible = visible_keys(shape, q % rows);
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t j = 0; j < visible; ++j) dot += static_cast<double>(dp[j]) * p[j];
#pragma omp simd
    for (std::int64_t j = 0; j < visible; ++j)
      ds[j] = static_cast<float>(static_cast<double>(scale) * p[j] * (dp[j] - dot));
    std::fill(ds + visible, ds + cols, 0.0f);
  }
}

void CpuAttention::flash_forward(TensorView qkv, const sdk::HeadLayout& layout, float scale,
                                 TensorView out, TensorView lse) {
  context_.use_threads();
  checks().flash_forward(qkv, layout, out, lse);
  flash_attention_forward(qkv, layout, scale, out, lse, context_.flash_products(qkv.dtype));
}

void CpuAttention::flash_backward(TensorView qkv, TensorView out, TensorView dout, TensorView lse,
                                  const sdk::HeadLayout& layout, float scale, TensorView dqkv) {
  context_.use_threads();
  checks().flash_backward(qkv, out, dout, lse, layout, dqkv);
  flash_attention_backward(qkv, out, dout, lse, layout, scale, dqkv,
                           context_.flash_products(qkv.dtype));
}

void CpuAttention::flash_decode(TensorView cache, const sdk::HeadLayout& layout, float scale,
                                TensorView out) {
  context_.use_threads();
  checks().flash_decode(cache, layout, out);
  flash_attention_decode(cache, layout, scale, out);
}

}  // namespace mixtrain::backend_cpu
