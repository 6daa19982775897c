// Pieces: a list of tensors cut into ranges of at most kPiece elements, so that one parallel
// region spreads many small tensors and a few huge ones over the OpenMP team (the gradient check
// and the fused optimizer updates).
//
// Contract
// - split(count, numel_of) returns the pieces of tensors 0..count-1 in order, each tensor's
//   ranges consecutive; a tensor of no elements has no piece.
// - nonfinite_flag(v) is 1 for inf and NaN, else 0, branch-free (so loops over it vectorise).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mixtrain::backend_cpu {

inline constexpr std::int64_t kPiece = 1 << 15;

struct Piece {
  std::size_t tensor;
  std::int64_t begin;
  std::int64_t len;
};

inline std::int64_t total_len(const std::vector<Piece>& pieces) {
  std::int64_t n = 0;
  for (const Piece& p : pieces) n += p.len;
  return n;
}

template <class NumelOf>
std::vector<Piece> split(std::size_t count, NumelOf numel_of) {
  std::vector<Piece> pieces;
  for (std::size_t t = 0; t < count; ++t) {
    const std::int64_t n = numel_of(t);
    for (std::int64_t b = 0; b < n; b += kPiece) pieces.push_back({t, b, std::min(kPiece, n - b)});
  }
  return pieces;
}

inline int nonfinite_flag(float v) {
  return static_cast<int>((std::bit_cast<std::uint32_t>(v) & 0x7F800000u) == 0x7F800000u);
}

}  // namespace mixtrain::backend_cpu
