// Portable, seeded pseudo-random numbers for parameter initialisation.
//
// std::uniform_real_distribution differs across standard libraries; these do not, so a seed
// gives the same weights on every machine (and resumed runs are reproducible).
#pragma once

#include <cstdint>

namespace mixtrain::core {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

 private:
  std::uint64_t state_;
};

// A seed for a named stream derived from a base seed (FNV-1a of the name mixed in).
inline std::uint64_t derive_seed(std::uint64_t base, const char* name) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char* p = name; *p != 0; ++p)
    h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return SplitMix64(base ^ h).next();
}

}  // namespace mixtrain::core
