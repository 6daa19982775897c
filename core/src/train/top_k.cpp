#include "train/top_k.h"

#include <cmath>
#include <cstddef>

namespace mixtrain::core {

std::int64_t top_k_hits(std::span<const float> logits, std::span<const std::int32_t> labels,
                        std::int64_t classes, std::int64_t k) {
  std::int64_t hits = 0;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    const float* z = logits.data() + static_cast<std::ptrdiff_t>(r) * classes;
    const std::int64_t y = labels[r];
    const float zy = z[y];
    // The argmax's rule (top_k.h): a NaN z[0] wins, so it ranks first; other NaNs never do.
    const bool first_nan = std::isnan(z[0]);
    if (y == 0 && first_nan) {
      ++hits;
      continue;
    }
    if (std::isnan(zy)) continue;
    std::int64_t rank = first_nan ? 1 : 0;
    // Counting stops at k: only whether the label is among the first k matters.
    for (std::int64_t j = first_nan ? 1 : 0; j < classes && rank < k; ++j)
      if (z[j] > zy || (z[j] == zy && j < y)) ++rank;
    if (rank < k) ++hits;
  }
  return hits;
}

}  // namespace mixtrain::core
