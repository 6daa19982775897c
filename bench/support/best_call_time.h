// best_ms: the fastest of `reps` timed calls, after two untimed warm-up calls, in milliseconds.
// On a shared machine the fastest call is the best estimate of what the code does with the cores
// to itself (the CNN kernel benchmarks' convention).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>

namespace mixtrain::bench {

inline double best_ms(const std::function<void()>& call, int reps) {
  call();
  call();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    call();
    const auto b = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(b - a).count());
  }
  return best;
}

}  // namespace mixtrain::bench
