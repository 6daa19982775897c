// Where each activation buffer lives in one arena allocated up front, from the buffers' live
// intervals in a schedule (forward then backward of a graph), so that buffers whose last use has
// passed are reused.
//
// Contract:
// - Takes buffers {name, bytes, first_step, last_step}: a buffer is live from the step that writes
//   it to the last step that reads it, both inclusive. Steps are positions in one schedule; only
//   their order matters. Each size is rounded up to `alignment` (its aligned size).
// - Returns one offset per buffer, in input order. Every offset is a multiple of `alignment`, and
//   two buffers whose live intervals share a step never share a byte: their ranges
//   [offset, offset + aligned size) are disjoint. Zero-byte buffers get an offset (0) and take no
//   room.
// - peak_live_bytes <= arena_bytes <= sum_bytes: peak_live_bytes (the most aligned bytes live at
//   one step) is a lower bound for any plan, sum_bytes (all aligned sizes, no reuse) is what a
//   plan without reuse would take. arena_bytes is the end of the highest buffer.
// - Greedy by size (Pisarchyk & Lee 2020, "Efficient Memory Management for Deep Neural Net
//   Inference"): largest first (ties: earlier first_step, then input order), each at the lowest
//   aligned offset clear of every placed buffer live at the same time. Not optimal in general,
//   but deterministic: the same input gives the same plan. O(n^2 log n) for n buffers.
// - Bad input is a programming error of the caller, who builds the list: std::invalid_argument,
//   naming the buffer (name and index), for a negative step, last_step < first_step, or sizes
//   whose aligned sum overflows size_t; and for alignment 0.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace mixtrain::core {

struct BufferLife {
  std::string name;  // for messages only; names need not be unique
  std::size_t bytes = 0;
  int first_step = 0;  // step that writes the buffer
  int last_step = 0;   // last step that reads it (inclusive)
};

struct LivenessPlan {
  std::vector<std::size_t> offset;  // byte offset of buffers[i] in the arena
  std::size_t arena_bytes = 0;      // bytes to allocate: max over buffers of offset + aligned size
  std::size_t sum_bytes = 0;        // sum of aligned sizes (no reuse)
  std::size_t peak_live_bytes = 0;  // max over steps of the aligned bytes live at that step
};

inline constexpr std::size_t kDefaultBufferAlignment = 64;

// `bytes` rounded up to a multiple of `alignment` (>= 1); throws std::invalid_argument on
// overflow.
std::size_t aligned_buffer_bytes(std::size_t bytes, std::size_t alignment);

LivenessPlan plan_liveness(std::span<const BufferLife> buffers,
                           std::size_t alignment = kDefaultBufferAlignment);

}  // namespace mixtrain::core
