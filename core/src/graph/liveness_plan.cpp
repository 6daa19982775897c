// Greedy-by-size arena planning over live intervals; see graph/liveness_plan.h for the contract.
#include "mixtrain/core/graph/liveness_plan.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <utility>

namespace mixtrain::core {
namespace {

// `bytes` rounded up to a multiple of `alignment`, or nullopt when that does not fit in size_t.
std::optional<std::size_t> round_up(std::size_t bytes, std::size_t alignment) {
  const std::size_t rem = bytes % alignment;
  if (rem == 0) return bytes;
  const std::size_t pad = alignment - rem;
  if (bytes > std::numeric_limits<std::size_t>::max() - pad) return std::nullopt;
  return bytes + pad;
}

std::string describe(const BufferLife& buffer, std::size_t index) {
  return "liveness plan: buffer '" + buffer.name + "' (#" + std::to_string(index) + ")";
}

bool lives_overlap(const BufferLife& a, const BufferLife& b) {
  return a.first_step <= b.last_step && b.first_step <= a.last_step;
}

// Max over steps of the bytes live at that step: a sweep over interval ends and starts.
std::size_t peak_live(std::span<const BufferLife> buffers, const std::vector<std::size_t>& size) {
  // (position, +size or -size); an interval [first, last] ends at last + 1 (int64: no overflow).
  struct Event {
    std::int64_t at;
    bool starts;
    std::size_t bytes;
  };
  std::vector<Event> events;
  events.reserve(2 * buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (size[i] == 0) continue;
    events.push_back({buffers[i].first_step, true, size[i]});
    events.push_back({std::int64_t{buffers[i].last_step} + 1, false, size[i]});
  }
  // At one position, ends before starts: a buffer that ends frees its bytes before the next
  // step's buffers are counted, and the running total never exceeds what is truly live.
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.at != b.at ? a.at < b.at : (!a.starts && b.starts);
  });
  std::size_t live = 0, peak = 0;
  for (const Event& e : events) {
    if (e.starts) {
      live += e.bytes;  // <= sum of aligned sizes, checked to fit
      peak = std::max(peak, live);
    } else {
      live -= e.bytes;
    }
  }
  return peak;
}

}  // namespace

std::size_t aligned_buffer_bytes(std::size_t bytes, std::size_t alignment) {
  if (alignment == 0) throw std::invalid_argument("liveness plan: alignment must be at least 1");
  const auto aligned = round_up(bytes, alignment);
  if (!aligned) {
    throw std::invalid_argument("liveness plan: " + std::to_string(bytes) +
                                " bytes rounded up to alignment " + std::to_string(alignment) +
                                " overflow size_t");
  }
  return *aligned;
}

LivenessPlan plan_liveness(std::span<const BufferLife> buffers, std::size_t alignment) {
  if (alignment == 0) throw std::invalid_argument("liveness plan: alignment must be at least 1");

  LivenessPlan plan;
  const std::size_t n = buffers.size();
  std::vector<std::size_t> size(n);
  for (std::size_t i = 0; i < n; ++i) {
    const BufferLife& b = buffers[i];
    if (b.first_step < 0 || b.last_step < 0) {
      throw std::invalid_argument(describe(b, i) + ": steps must be >= 0, got first_step " +
                                  std::to_string(b.first_step) + ", last_step " +
                                  std::to_string(b.last_step));
    }
    if (b.last_step < b.first_step) {
      throw std::invalid_argument(describe(b, i) + ": last_step " + std::to_string(b.last_step) +
                                  " is before first_step " + std::to_string(b.first_step));
    }
    const auto aligned = round_up(b.bytes, alignment);
    if (!aligned || *aligned > std::numeric_limits<std::size_t>::max() - plan.sum_bytes) {
      throw std::invalid_argument(describe(b, i) + ": " + std::to_string(b.bytes) +
                                  " bytes make the aligned sum of all buffers overflow size_t");
    }
    size[i] = *aligned;
    plan.sum_bytes += *aligned;
  }

  // Largest first; ties by earlier first_step, then input order (stable), so the plan is a
  // function of the input alone.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (size[a] != size[b]) return size[a] > size[b];
    return buffers[a].first_step < buffers[b].first_step;
  });

  // Each buffer goes at the lowest offset where it overlaps no placed buffer live at the same
  // time. Offsets and aligned sizes are multiples of `alignment`, so every candidate (0 or the
  // end of a placed buffer) is aligned. By induction the arena never exceeds the sum of the sizes
  // placed so far, so offset + size cannot overflow once sum_bytes fits.
  // The placed buffers are kept in offset order, so the live ones are met in that order without a
  // sort per buffer (a deep model's buffers mostly overlap: sorting them each time was
  // O(n² log n), and 10,000 layers took seconds).
  plan.offset.assign(n, 0);
  std::vector<std::size_t> placed;  // placed buffers with room (size > 0), by (offset, end)
  placed.reserve(n);
  const auto by_offset = [&](std::size_t a, std::size_t b) {
    const std::size_t end_a = plan.offset[a] + size[a], end_b = plan.offset[b] + size[b];
    return plan.offset[a] != plan.offset[b] ? plan.offset[a] < plan.offset[b] : end_a < end_b;
  };
  for (const std::size_t i : order) {
    if (size[i] == 0) continue;  // offset 0; overlaps nothing
    std::size_t candidate = 0;
    for (const std::size_t j : placed) {
      if (!lives_overlap(buffers[i], buffers[j])) continue;
      if (plan.offset[j] >= candidate + size[i]) break;  // the gap before j fits
      candidate = std::max(candidate, plan.offset[j] + size[j]);
    }
    plan.offset[i] = candidate;
    plan.arena_bytes = std::max(plan.arena_bytes, candidate + size[i]);
    placed.insert(std::upper_bound(placed.begin(), placed.end(), i, by_offset), i);
  }

  plan.peak_live_bytes = peak_live(buffers, size);
  return plan;
}

}  // namespace mixtrain::core
