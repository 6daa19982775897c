#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/core/graph/liveness_plan.h"

namespace mixtrain::core {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

bool lives_overlap(const BufferLife& a, const BufferLife& b) {
  return a.first_step <= b.last_step && b.first_step <= a.last_step;
}

// Every invariant the header promises, checked against a brute-force peak per step.
void expect_valid_plan(const std::vector<BufferLife>& buffers, const LivenessPlan& plan,
                       std::size_t alignment) {
  ASSERT_EQ(plan.offset.size(), buffers.size());
  std::size_t sum = 0, arena = 0;
  int last = 0;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::size_t size = aligned_buffer_bytes(buffers[i].bytes, alignment);
    EXPECT_EQ(plan.offset[i] % alignment, 0u) << buffers[i].name;
    sum += size;
    if (size > 0) arena = std::max(arena, plan.offset[i] + size);
    last = std::max(last, buffers[i].last_step);
    for (std::size_t j = 0; j < i; ++j) {
      const std::size_t other = aligned_buffer_bytes(buffers[j].bytes, alignment);
      if (size == 0 || other == 0 || !lives_overlap(buffers[i], buffers[j])) continue;
      const bool disjoint =
          plan.offset[i] + size <= plan.offset[j] || plan.offset[j] + other <= plan.offset[i];
      EXPECT_TRUE(disjoint) << buffers[i].name << " and " << buffers[j].name
                            << " are live together and share memory";
    }
  }
  std::size_t peak = 0;
  for (int step = 0; step <= last; ++step) {
    std::size_t live = 0;
    for (const BufferLife& b : buffers) {
      if (b.first_step <= step && step <= b.last_step)
        live += aligned_buffer_bytes(b.bytes, alignment);
    }
    peak = std::max(peak, live);
  }
  EXPECT_EQ(plan.sum_bytes, sum);
  EXPECT_EQ(plan.arena_bytes, arena);
  EXPECT_EQ(plan.peak_live_bytes, peak);
  EXPECT_GE(plan.arena_bytes, plan.peak_live_bytes);
  EXPECT_LE(plan.arena_bytes, plan.sum_bytes);
}

std::vector<BufferLife> random_buffers(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> count(0, 40), step(0, 30), span(0, 8), kind(0, 9);
  std::uniform_int_distribution<std::size_t> bytes(1, 5000);
  std::vector<BufferLife> buffers(static_cast<std::size_t>(count(rng)));
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    BufferLife& b = buffers[i];
    b.name = "b" + std::to_string(i);
    const int k = kind(rng);
    // Some zero-byte buffers, some equal sizes (ties), the rest arbitrary.
    b.bytes = k == 0 ? 0 : k == 1 ? 256 : bytes(rng);
    b.first_step = step(rng);
    b.last_step = b.first_step + span(rng);
  }
  return buffers;
}

TEST(LivenessPlan, BuffersLiveAtTheSameTimeNeverOverlap) {
  std::mt19937_64 rng(20240611);
  const std::size_t alignments[] = {1, 8, 64, 256};
  for (int trial = 0; trial < 400; ++trial) {
    const std::vector<BufferLife> buffers = random_buffers(rng);
    const std::size_t alignment = alignments[trial % 4];
    SCOPED_TRACE("trial " + std::to_string(trial) + ", alignment " + std::to_string(alignment));
    expect_valid_plan(buffers, plan_liveness(buffers, alignment), alignment);
    if (testing::Test::HasFailure()) return;
  }
}

TEST(LivenessPlan, ChainReusesMemoryAsTwoBuffers) {
  // Each activation is written at step k and read at step k + 1, as in an inference chain.
  std::vector<BufferLife> buffers;
  for (int k = 0; k < 12; ++k) buffers.push_back({"act" + std::to_string(k), kMiB, k, k + 1});
  const LivenessPlan plan = plan_liveness(buffers);
  expect_valid_plan(buffers, plan, kDefaultBufferAlignment);
  EXPECT_EQ(plan.arena_bytes, 2 * kMiB);
  EXPECT_EQ(plan.peak_live_bytes, 2 * kMiB);
  EXPECT_EQ(plan.sum_bytes, 12 * kMiB);
}

TEST(LivenessPlan, ChainOfMixedSizesStaysNearTwoOfTheLargest) {
  std::vector<BufferLife> buffers;
  const std::size_t sizes[] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  for (int k = 0; k < 12; ++k) {
    buffers.push_back({"act" + std::to_string(k), sizes[k] * kMiB, k, k + 1});
  }
  const LivenessPlan plan = plan_liveness(buffers);
  expect_valid_plan(buffers, plan, kDefaultBufferAlignment);
  EXPECT_LE(plan.arena_bytes, 2 * 9 * kMiB);
  EXPECT_LT(plan.arena_bytes, plan.sum_bytes / 2);
}

// A residual MLP trained for one step: block i computes h = x W1, a = relu(h), y = a W2,
// x' = x + y. Training keeps x, h and a until their backward use; y, da, dh and the incoming
// gradient dx die within the block.
std::vector<BufferLife> residual_mlp_schedule(int blocks, std::size_t width_bytes,
                                              std::size_t hidden_bytes) {
  std::vector<BufferLife> buffers;
  std::vector<std::size_t> x, h, a;  // indices into buffers
  int step = 0;
  buffers.push_back({"x0", width_bytes, step, step});
  x.push_back(0);
  for (int i = 1; i <= blocks; ++i) {
    const std::string p = "block" + std::to_string(i) + ".";
    buffers[x.back()].last_step = ++step;  // h = x W1 reads x
    h.push_back(buffers.size());
    buffers.push_back({p + "h", hidden_bytes, step, step});
    buffers[h.back()].last_step = ++step;  // a = relu(h)
    a.push_back(buffers.size());
    buffers.push_back({p + "a", hidden_bytes, step, step});
    buffers[a.back()].last_step = ++step;  // y = a W2
    buffers.push_back({p + "y", width_bytes, step, step + 1});
    ++step;  // x' = x + y
    x.push_back(buffers.size());
    buffers.push_back({p + "x", width_bytes, step, step});
  }
  buffers[x.back()].last_step = ++step;  // the loss reads the output and writes its gradient
  std::size_t dx = buffers.size();
  buffers.push_back({"loss.dx", width_bytes, step, step});
  for (int i = blocks; i >= 1; --i) {
    const std::string p = "block" + std::to_string(i) + ".";
    const auto k = static_cast<std::size_t>(i - 1);
    buffers[a[k]].last_step = ++step;  // da = dx W2^T, dW2 = a^T dx
    const std::size_t da = buffers.size();
    buffers.push_back({p + "da", hidden_bytes, step, step});
    buffers[h[k]].last_step = buffers[da].last_step = ++step;  // dh = da * relu'(h)
    const std::size_t dh = buffers.size();
    buffers.push_back({p + "dh", hidden_bytes, step, step});
    // dx_in = dh W1^T + dx (residual), dW1 = x^T dh
    buffers[x[k]].last_step = buffers[dh].last_step = buffers[dx].last_step = ++step;
    dx = buffers.size();
    buffers.push_back({p + "dx_in", width_bytes, step, step});
  }
  buffers[dx].last_step = step + 1;  // read by whatever precedes the first block
  return buffers;
}

TEST(LivenessPlan, ResidualMlpTrainingStepReusesBackwardBuffers) {
  const std::vector<BufferLife> buffers = residual_mlp_schedule(20, 1 * kMiB, 4 * kMiB);
  const LivenessPlan plan = plan_liveness(buffers);
  expect_valid_plan(buffers, plan, kDefaultBufferAlignment);
  EXPECT_LE(plan.arena_bytes, plan.sum_bytes);
  const double ratio = static_cast<double>(plan.arena_bytes) / static_cast<double>(plan.sum_bytes);
  const double peak_ratio =
      static_cast<double>(plan.peak_live_bytes) / static_cast<double>(plan.sum_bytes);
  std::cout << "residual MLP, 20 blocks: arena " << plan.arena_bytes / kMiB << " MiB, sum "
            << plan.sum_bytes / kMiB << " MiB, peak live " << plan.peak_live_bytes / kMiB
            << " MiB, arena/sum " << ratio << ", peak/sum " << peak_ratio << "\n";
}

TEST(LivenessPlan, SameInputGivesSameOffsets) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<BufferLife> buffers = random_buffers(rng);
    const LivenessPlan first = plan_liveness(buffers);
    const LivenessPlan second = plan_liveness(buffers);
    EXPECT_EQ(first.offset, second.offset);
    EXPECT_EQ(first.arena_bytes, second.arena_bytes);
  }
}

// The greedy placement the header describes, written the obvious way: largest first (ties by
// first step, then input order), each at the lowest offset below, between or above its live
// neighbours, sorted afresh for every buffer.
std::vector<std::size_t> greedy_offsets(const std::vector<BufferLife>& buffers,
                                        std::size_t alignment) {
  const std::size_t n = buffers.size();
  std::vector<std::size_t> size(n), order(n), offset(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    size[i] = aligned_buffer_bytes(buffers[i].bytes, alignment);
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return size[a] != size[b] ? size[a] > size[b] : buffers[a].first_step < buffers[b].first_step;
  });
  std::vector<std::size_t> placed;
  for (const std::size_t i : order) {
    if (size[i] == 0) continue;
    std::vector<std::pair<std::size_t, std::size_t>> busy;
    for (const std::size_t j : placed)
      if (lives_overlap(buffers[i], buffers[j])) busy.emplace_back(offset[j], offset[j] + size[j]);
    std::sort(busy.begin(), busy.end());
    std::size_t candidate = 0;
    for (const auto& [begin, end] : busy) {
      if (begin >= candidate + size[i]) break;
      candidate = std::max(candidate, end);
    }
    offset[i] = candidate;
    placed.push_back(i);
  }
  return offset;
}

// plan_liveness keeps its placed buffers in offset order instead of sorting the live ones for
// each buffer: the same offsets as the obvious greedy, on random buffers and on a deep chain
// whose outputs all live until their backward (nested intervals, every buffer live with all).
TEST(LivenessPlan, OffsetsAreTheGreedyPlacementSortedAfreshForEachBuffer) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<BufferLife> buffers = random_buffers(rng);
    for (const std::size_t alignment : {std::size_t{1}, std::size_t{64}, std::size_t{4096}}) {
      const LivenessPlan plan = plan_liveness(buffers, alignment);
      ASSERT_EQ(plan.offset, greedy_offsets(buffers, alignment)) << "trial " << trial;
      expect_valid_plan(buffers, plan, alignment);
    }
  }
  std::vector<BufferLife> nested;
  for (int i = 0; i < 300; ++i)
    nested.push_back(
        {"n" + std::to_string(i), 64 * static_cast<std::size_t>(1 + i % 3), i, 600 - i});
  EXPECT_EQ(plan_liveness(nested).offset, greedy_offsets(nested, 64));
}

TEST(LivenessPlan, EqualSizesArePlacedByFirstStepThenInputOrder) {
  // All live at step 2, all the same size: b (first_step 0) goes first, then a and c in order.
  const std::vector<BufferLife> buffers = {{"a", 64, 1, 2}, {"b", 64, 0, 2}, {"c", 64, 1, 2}};
  const LivenessPlan plan = plan_liveness(buffers);
  EXPECT_EQ(plan.offset, (std::vector<std::size_t>{64, 0, 128}));
}

TEST(LivenessPlan, SizesAreRoundedUpToTheAlignment) {
  const std::vector<BufferLife> buffers = {{"a", 1, 0, 0}, {"b", 65, 0, 0}};
  const LivenessPlan plan = plan_liveness(buffers);
  EXPECT_EQ(plan.sum_bytes, 64u + 128u);
  EXPECT_EQ(plan.arena_bytes, 192u);
  EXPECT_EQ(plan.offset, (std::vector<std::size_t>{128, 0}));
  EXPECT_EQ(plan_liveness(buffers, 1).arena_bytes, 66u);
}

TEST(LivenessPlan, ZeroByteBuffersGetAnOffsetButTakeNoRoom) {
  const std::vector<BufferLife> buffers = {{"empty", 0, 0, 5}, {"a", 100, 0, 5}, {"b", 0, 2, 3}};
  const LivenessPlan plan = plan_liveness(buffers);
  ASSERT_EQ(plan.offset.size(), 3u);
  EXPECT_EQ(plan.arena_bytes, 128u);
  EXPECT_EQ(plan.sum_bytes, 128u);
  EXPECT_EQ(plan.peak_live_bytes, 128u);
  EXPECT_EQ(plan_liveness(std::vector<BufferLife>{}).arena_bytes, 0u);
}

void expect_rejected(const std::vector<BufferLife>& buffers, const std::string& name,
                     std::size_t alignment = kDefaultBufferAlignment) {
  try {
    plan_liveness(buffers, alignment);
    ADD_FAILURE() << "expected std::invalid_argument naming '" << name << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
  }
}

TEST(LivenessPlan, LastStepBeforeFirstStepIsRejectedNamingTheBuffer) {
  expect_rejected({{"ok", 8, 0, 1}, {"block3.h", 8, 5, 4}}, "block3.h");
}

TEST(LivenessPlan, NegativeStepIsRejectedNamingTheBuffer) {
  expect_rejected({{"early", 8, -1, 2}}, "early");
  expect_rejected({{"ok", 8, 0, 1}, {"both", 8, -3, -2}}, "both");
}

TEST(LivenessPlan, SizesOverflowingSizeTAreRejectedNamingTheBuffer) {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  expect_rejected({{"huge", kMax, 0, 0}}, "huge");  // rounding up alone overflows
  expect_rejected({{"half", kMax / 2 + 1, 0, 0}, {"other half", kMax / 2 + 1, 3, 4}}, "other half",
                  1);
}

TEST(LivenessPlan, ZeroAlignmentIsRejected) {
  EXPECT_THROW(plan_liveness(std::vector<BufferLife>{{"a", 8, 0, 0}}, 0), std::invalid_argument);
  EXPECT_THROW(aligned_buffer_bytes(8, 0), std::invalid_argument);
}

}  // namespace
}  // namespace mixtrain::core
