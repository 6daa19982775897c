#include "cpu_sum_of_squares.h"

#include <numeric>
#include <string>
#include <vector>

#include "cpu_access.h"
#include "cpu_isa.h"
#include "cpu_pieces.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

[[gnu::always_inline]] inline void chunk_sum_kernel(const float* x, std::int64_t len, double* out) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t i = 0; i < len; ++i) sum += static_cast<double>(x[i]) * x[i];
  *out = sum;
}

MIXTRAIN_ISA_VARIANTS(chunk_sum_kernel)

}  // namespace

double chunk_sum_of_squares(const float* x, std::int64_t len) {
  double sum = 0.0;
  chunk_sum_kernel_best(x, len, &sum);
  return sum;
}

double sum_of_squares(const CpuContext& context, std::span<const TensorView> tensors) {
  context.use_threads();
  for (std::size_t i = 0; i < tensors.size(); ++i)
    require_storage("sum_of_squares", "tensors[" + std::to_string(i) + "]", tensors[i]);
  const auto pieces = split(tensors.size(), [&](std::size_t t) { return tensors[t].numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
  std::vector<double> piece_sum(pieces.size());
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces)))
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    double local = 0.0;
    for (std::int64_t c0 = 0; c0 < pc.len; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, pc.len - c0);
      float buf[kChunk];
      local += chunk_sum_of_squares(read_chunk(tensors[pc.tensor], pc.begin + c0, len, buf), len);
    }
    piece_sum[static_cast<std::size_t>(k)] = local;
  }
  return std::accumulate(piece_sum.begin(), piece_sum.end(), 0.0);
}

}  // namespace mixtrain::backend_cpu
