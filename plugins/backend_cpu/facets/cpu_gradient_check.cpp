// CpuGradientCheck: the CPU backend's GradientCheckFacet: the unscale, the finite check and the
// sum of squares (cpu_sum_of_squares.h) in one pass over the gradients, and the first non-finite
// tensor. Each works on a flat list of pieces (cpu_pieces.h) so many small tensors and a few huge
// ones share one parallel region.
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_access.h"
#include "cpu_context.h"
#include "cpu_pieces.h"
#include "cpu_sum_of_squares.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

class CpuGradientCheck final : public sdk::GradientCheckFacet {
 public:
  explicit CpuGradientCheck(CpuContext& context) : context_(context) {}

  bool unscale_and_check_finite(std::span<const sdk::TensorView> grads, float inv_scale) override;
  GradientCheck unscale_check_and_sum_squares(std::span<const sdk::TensorView> grads,
                                              float inv_scale) override;
  int first_nonfinite(std::span<const sdk::TensorView> tensors) override;
  void queue_unscale_check(std::span<const sdk::TensorView> grads, float inv_scale,
                           bool sum_squares, sdk::TensorView status) override;
  GradientCheck queued_check_result() override;
  sdk::UnderflowTally count_underflow(TensorView values, float threshold) override;

 private:
  CpuContext& context_;
  // The last queued check's outcome: a synchronous backend has it when the call returns.
  std::optional<GradientCheck> queued_;
};

const sdk::FacetRegistration<CpuContext, sdk::GradientCheckFacet, CpuGradientCheck> kRegistration;

}  // namespace

namespace {

// One pass over fp32 gradients: g *= inv_scale in place (skipped at 1), the finite check and, when
// asked, Σ g² of the unscaled values. A chunk is summed right after it is scaled, while it is still
// in L1, so the gradients cross memory once whatever is asked.
sdk::GradientCheckFacet::GradientCheck unscale_check_pass(std::span<const TensorView> grads,
                                                          float inv_scale, bool sum_squares) {
  // fp32, present and apart from each other: the pieces of one tensor listed twice would be
  // scaled on two threads at once (the foreach ops' rule for the lists they update).
  checks().foreach_lists("unscale_and_check_finite", grads);
  const auto pieces = split(grads.size(), [&](std::size_t t) { return grads[t].numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
  // Each piece's Σ g², added in order below: the same bits on any number of threads, and the
  // same as sum_of_squares() of the unscaled gradients (cpu_sum_of_squares.h).
  std::vector<double> piece_sum(sum_squares ? pieces.size() : 0);
  int found = 0;
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces))) \
    reduction(|                                                                  \
              : found)
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    int local = 0;
    double local_sum = 0.0;
    for (std::int64_t c0 = 0; c0 < pc.len; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, pc.len - c0);
      float* g = grads[pc.tensor].as<float>() + pc.begin + c0;
      // inf or NaN before scaling stays inf/NaN after (inf*0 is NaN), so one check suffices; at
      // scale 1 the pass only reads, half the memory traffic.
      const ChunkCheck c = chunk_scale_and_check(g, len, inv_scale, sum_squares);
      local |= c.nonfinite;
      local_sum += c.sum_of_squares;
    }
    found |= local;
    if (sum_squares) piece_sum[static_cast<std::size_t>(k)] = local_sum;
  }
  sdk::GradientCheckFacet::GradientCheck r;
  r.found_inf = found != 0;
  r.sum_of_squares = std::accumulate(piece_sum.begin(), piece_sum.end(), 0.0);
  return r;
}

}  // namespace

bool CpuGradientCheck::unscale_and_check_finite(std::span<const TensorView> grads,
                                                float inv_scale) {
  context_.use_threads();
  return unscale_check_pass(grads, inv_scale, false).found_inf;
}

sdk::GradientCheckFacet::GradientCheck CpuGradientCheck::unscale_check_and_sum_squares(
    std::span<const TensorView> grads, float inv_scale) {
  context_.use_threads();
  return unscale_check_pass(grads, inv_scale, true);
}

void CpuGradientCheck::queue_unscale_check(std::span<const TensorView> grads, float inv_scale,
                                           bool sum_squares, TensorView status) {
  checks().gradient_status("queue_unscale_check", status);
  GradientCheck r;
  if (sum_squares)
    r = unscale_check_and_sum_squares(grads, inv_scale);
  else
    r.found_inf = unscale_and_check_finite(grads, inv_scale);
  sdk::GradientStatus written;
  written.sum_of_squares = r.sum_of_squares;
  written.found_inf = r.found_inf ? 1 : 0;
  std::memcpy(status.data, &written, sizeof written);
  queued_ = r;
}

sdk::GradientCheckFacet::GradientCheck CpuGradientCheck::queued_check_result() {
  if (!queued_)
    throw std::logic_error(
        "backend_cpu.queued_check_result: no queue_unscale_check to read (each is read once)");
  const GradientCheck r = *queued_;
  queued_.reset();
  return r;
}

int CpuGradientCheck::first_nonfinite(std::span<const TensorView> tensors) {
  context_.use_threads();
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TensorView& v = tensors[t];
    require_storage("first_nonfinite", "tensors[" + std::to_string(t) + "]", v);
    const std::int64_t total = v.numel();
    int found = 0;
#pragma omp parallel for schedule(static) if (parallel_worth(total)) reduction(| : found)
    for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, total - c0);
      float buf[kChunk];
      const float* x = read_chunk(v, c0, len, buf);
      int local = 0;
#pragma omp simd reduction(| : local)
      for (std::int64_t i = 0; i < len; ++i) local |= nonfinite_flag(x[i]);
      found |= local;
    }
    if (found != 0) return static_cast<int>(t);
  }
  return -1;
}

sdk::UnderflowTally CpuGradientCheck::count_underflow(TensorView values, float threshold) {
  checks().count_underflow(values, threshold);
  context_.use_threads();
  // values is [n] fp32, contiguous
  const auto* x = static_cast<const float*>(values.data);
  const std::int64_t total = values.numel();
  std::int64_t nonzero = 0, flushed = 0;
#pragma omp parallel for schedule(static) if (parallel_worth(total)) reduction(+ : nonzero, flushed)
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    std::int64_t kept = 0, zeroed = 0;
#pragma omp simd reduction(+ : kept, zeroed)
    for (std::int64_t i = 0; i < len; ++i) {
      const float v = x[c0 + i];
      const bool not_zero = v != 0.0f;  // a NaN is not zero, and compares false below
      kept += not_zero;
      zeroed += not_zero & (std::fabs(v) <= threshold);
    }
    nonzero += kept;
    flushed += zeroed;
  }
  return {nonzero, flushed};
}

}  // namespace mixtrain::backend_cpu
