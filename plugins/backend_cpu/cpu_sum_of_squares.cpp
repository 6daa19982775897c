// sum_of_squares over pieces: each piece's partial sum in double, summed by the OpenMP reduction.
#include "cpu_sum_of_squares.h"

#include <string>

#include "cpu_access.h"
#include "cpu_pieces.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

double sum_of_squares(const CpuContext& context, std::span<const TensorView> tensors) {
  context.use_threads();
  for (std::size_t i = 0; i < tensors.size(); ++i)
    require_storage("sum_of_squares", "tensors[" + std::to_string(i) + "]", tensors[i]);
  const auto pieces = split(tensors.size(), [&](std::size_t t) { return tensors[t].numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
  double total = 0.0;
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces))) \
    reduction(+ : total)
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    double local = 0.0;
    for (std::int64_t c0 = 0; c0 < pc.len; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, pc.len - c0);
      float buf[kChunk];
      const float* x = read_chunk(tensors[pc.tensor], pc.begin + c0, len, buf);
#pragma omp simd reduction(+ : local)
      for (std::int64_t i = 0; i < len; ++i) local += static_cast<double>(x[i]) * x[i];
    }
    total += local;
  }
  return total;
}

}  // namespace mixtrain::backend_cpu
