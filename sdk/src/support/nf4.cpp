#include "mixtrain/sdk/support/nf4.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mixtrain::sdk {

namespace {

// The exact midpoints between neighbouring code values: the sum of two fp32 values of these
// magnitudes is exact in double, and so is halving it.
struct Midpoints {
  double at[15];
  constexpr Midpoints() : at{} {
    for (int k = 0; k < 15; ++k)
      at[k] = (static_cast<double>(kNf4Codebook[k]) + static_cast<double>(kNf4Codebook[k + 1])) / 2;
  }
};
constexpr Midpoints kMidpoints;

}  // namespace

std::uint8_t nf4_code(float v) {
  // v above the midpoint below code k + 1 moves up; one exactly on it stays (ties to the lower).
  std::uint8_t k = 0;
  while (k < 15 && static_cast<double>(v) > kMidpoints.at[k]) ++k;
  return k;
}

void nf4_check_sizes(std::int64_t numel, std::int64_t block, std::size_t code_bytes,
                     std::size_t absmax_count) {
  if (block < 1) throw std::invalid_argument("nf4: block size " + std::to_string(block) + " < 1");
  if (numel < 0) throw std::invalid_argument("nf4: negative element count");
  const auto want_codes = static_cast<std::size_t>(nf4_code_bytes(numel));
  const auto want_scales = static_cast<std::size_t>(nf4_block_count(numel, block));
  if (code_bytes != want_codes || absmax_count != want_scales)
    throw std::invalid_argument("nf4: " + std::to_string(numel) + " elements in blocks of " +
                                std::to_string(block) + " need " + std::to_string(want_codes) +
                                " code bytes and " + std::to_string(want_scales) +
                                " absmax values, got " + std::to_string(code_bytes) + " and " +
                                std::to_string(absmax_count));
}

Nf4Tensor nf4_quantize(std::span<const float> x, std::int64_t block) {
  if (block < 1) throw std::invalid_argument("nf4: block size " + std::to_string(block) + " < 1");
  Nf4Tensor t;
  t.numel = static_cast<std::int64_t>(x.size());
  t.block = block;
  t.codes.assign(static_cast<std::size_t>(nf4_code_bytes(t.numel)), 0);
  t.absmax.assign(static_cast<std::size_t>(nf4_block_count(t.numel, block)), 0.0f);
  for (std::int64_t b0 = 0; b0 < t.numel; b0 += block) {
    const std::int64_t end = std::min(t.numel, b0 + block);
    float absmax = 0.0f;
    for (std::int64_t i = b0; i < end; ++i) {
      const float v = x[static_cast<std::size_t>(i)];
      if (!std::isfinite(v))
        throw std::invalid_argument("nf4: element " + std::to_string(i) + " is " +
                                    std::to_string(v) + ", which has no NF4 code");
      absmax = std::max(absmax, std::fabs(v));
    }
    t.absmax[static_cast<std::size_t>(b0 / block)] = absmax;
    const float r = 1.0f / absmax;
    for (std::int64_t i = b0; i < end; ++i) {
      const std::uint8_t code = absmax == 0.0f ? 7 : nf4_code(x[static_cast<std::size_t>(i)] * r);
      auto& byte = t.codes[static_cast<std::size_t>(i / 2)];
      byte = static_cast<std::uint8_t>(byte | (i % 2 == 0 ? code << 4 : code));
    }
  }
  return t;
}

std::vector<float> nf4_dequantize(const Nf4Tensor& t) {
  nf4_check_sizes(t.numel, t.block, t.codes.size(), t.absmax.size());
  std::vector<float> out(static_cast<std::size_t>(t.numel));
  for (std::int64_t i = 0; i < t.numel; ++i)
    out[static_cast<std::size_t>(i)] = nf4_value(t.codes, t.absmax, t.block, i);
  return out;
}

}  // namespace mixtrain::sdk
