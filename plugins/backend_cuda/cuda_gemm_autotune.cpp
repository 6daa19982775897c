#include "cuda_gemm_autotune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mixtrain::backend_cuda {

float autotune_score(std::span<const float> ms) {
  if (ms.empty()) return -1.0f;
  for (float t : ms)
    if (!std::isfinite(t) || t < 0.0f) return -1.0f;
  std::vector<float> sorted(ms.begin(), ms.end());
  std::sort(sorted.begin(), sorted.end());
  const std::size_t mid = sorted.size() / 2;
  return sorted.size() % 2 == 1 ? sorted[mid] : 0.5f * (sorted[mid - 1] + sorted[mid]);
}

int pick_autotuned_candidate(std::span<const std::vector<float>> times, float tolerance) {
  const float keep = std::isfinite(tolerance) && tolerance > 0.0f ? 1.0f - tolerance : 1.0f;
  int best = -1;
  float best_score = 0.0f;
  for (std::size_t i = 0; i < times.size(); ++i) {
    const float score = autotune_score(times[i]);
    if (score < 0.0f) continue;
    if (best < 0 || score < best_score * keep) {
      best = static_cast<int>(i);
      best_score = score;
    }
  }
  return best;
}

std::string autotune_summary(std::span<const std::vector<float>> times, int pick, int rounds) {
  char text[160];
  std::snprintf(text, sizeof text, "autotuned over %zu candidates x %d rounds: #%d %.4f ms",
                times.size(), rounds, pick,
                static_cast<double>(autotune_score(times[static_cast<std::size_t>(pick)])));
  std::string summary = text;
  if (pick != 0 && autotune_score(times[0]) >= 0.0f) {
    std::snprintf(text, sizeof text, ", #0 %.4f ms", static_cast<double>(autotune_score(times[0])));
    summary += text;
  }
  return summary;
}

}  // namespace mixtrain::backend_cuda
