// fp8-delayed against Transformer Engine's amax-and-scale update at the edges: zero, -0, NaN and
// +inf amaxes, alone and mixed, under "max" and "most_recent", history lengths 1 and 3, a margin,
// E5M2, and interval 2, for both amax_update values.
//
// The expected scales and histories are worked out by hand from TE's rules, step by step:
// - fused (TE's default, delayed_scaling.cu kernel_bulk): if this step's amax is 0 (== 0.0f,
//   so -0 too) the slot is left alone. Otherwise the history rolls, "max" is an fmaxf reduction
//   starting at 0 over the whole ring before the roll (NaN skipped, inf kept), "most_recent" is
//   this step's amax, and scale = (fp8_max / 2^margin) / amax if amax is finite and > 0, else
//   the previous scale.
// - unfused (TE's torch fallback): the history always rolls, "max" is torch.max (NaN wins),
//   same scale rule.
// Histories are listed oldest first, the (zeroed) step in progress last.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fp8_test_support.h"

namespace mixtrain::fp8 {
namespace {

using namespace testing;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Expected {
  float amax;                  // recorded for the operand this step
  float scale;                 // the operand's scale after on_step_end(true)
  std::vector<float> history;  // its ring afterwards, oldest first
};

std::string show(const std::vector<float>& v) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << v[i];
  return out.str() + ']';
}

// Element-wise equality in which NaN matches NaN: TE keeps NaN amaxes in its history.
::testing::AssertionResult same_amaxes(const std::vector<float>& actual,
                                       const std::vector<float>& expected) {
  bool same = actual.size() == expected.size();
  for (std::size_t i = 0; same && i < actual.size(); ++i)
    same = std::isnan(expected[i]) ? std::isnan(actual[i]) : actual[i] == expected[i];
  if (same) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "history " << show(actual) << ", expected " << show(expected);
}

void run_sequence(DelayedScalingPolicy& p, const std::vector<Expected>& steps,
                  OperandRole role = OperandRole::input) {
  const std::string name = operand("fc1", role).name();
  for (std::size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1) + ", amax " + std::to_string(steps[i].amax));
    p.operand_scaling(operand("fc1", role));
    p.record_amax(operand("fc1", role), steps[i].amax);
    p.on_step_end(true);
    const auto s = p.operand_scaling(operand("fc1", role));
    EXPECT_EQ(s.scale, steps[i].scale);
    EXPECT_EQ(s.scale_inv, 1.0f / steps[i].scale);
    EXPECT_TRUE(same_amaxes(p.slot(name)->history.chronological(), steps[i].history));
  }
}

Values options(std::int64_t len, const char* algo, const char* update) {
  return {{"amax_history_len", len},
          {"amax_compute_algo", std::string(algo)},
          {"amax_update", std::string(update)}};
}

TEST(fp8_te_edges, ZeroAmaxStepsLeaveTheFusedSlotAloneUnderMax) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, options(3, "max", "fused"));
  run_sequence(*p, {{2.0f, 224.0f, {0, 2, 0}},
                    {0.0f, 224.0f, {0, 2, 0}},  // no roll, no recompute
                    {0.0f, 224.0f, {0, 2, 0}},
                    {4.0f, 112.0f, {2, 4, 0}},
                    {1.0f, 112.0f, {4, 1, 0}},
                    {0.0f, 112.0f, {4, 1, 0}},
                    {1.0f, 112.0f, {1, 1, 0}},  // 4 is still one of the three
                    {1.0f, 448.0f, {1, 1, 0}}});
}

TEST(fp8_te_edges, ZeroAmaxStepsRollTheUnfusedHistoryUnderMax) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, options(3, "max", "unfused"));
  run_sequence(*p, {{2.0f, 224.0f, {0, 2, 0}},
                    {0.0f, 224.0f, {2, 0, 0}},
                    {0.0f, 224.0f, {0, 0, 0}},
                    {4.0f, 112.0f, {0, 4, 0}},
                    {1.0f, 112.0f, {4, 1, 0}},
                    {0.0f, 112.0f, {1, 0, 0}},
                    {1.0f, 448.0f, {0, 1, 0}},  // the zero step pushed 4 out
                    {1.0f, 448.0f, {1, 1, 0}}});
}

TEST(fp8_te_edges, NanIsSkippedByTheFusedMaxButStaysInTheHistory) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, options(3, "max", "fused"));
  run_sequence(*p, {{2.0f, 224.0f, {0, 2, 0}},
                    {kNaN, 224.0f, {2, kNaN, 0}},  // NaN != 0: it rolls; fmaxf skips it
                    {4.0f, 112.0f, {kNaN, 4, 0}},
                    {4.0f, 112.0f, {4, 4, 0}},
                    {4.0f, 112.0f, {4, 4, 0}}});
}

TEST(fp8_te_edges, NanFreezesTheUnfusedMaxUntilItAgesOut) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, options(3, "max", "unfused"));
  run_sequence(*p, {{2.0f, 224.0f, {0, 2, 0}},
                    {kNaN, 224.0f, {2, kNaN, 0}},
                    {4.0f, 224.0f, {kNaN, 4, 0}},
                    {4.0f, 224.0f, {4, 4, 0}},
                    {4.0f, 112.0f, {4, 4, 0}}});
}

TEST(fp8_te_edges, NanFirstThenZeroThenAmaxes) {
  for (const char* update : {"fused", "unfused"}) {
    SCOPED_TRACE(update);
    test::CapturingSink sink;
    auto p = make_delayed(sink, options(3, "max", update));
    if (std::string(update) == "fused")
      run_sequence(*p, {{kNaN, 1.0f, {0, kNaN, 0}},  // fmaxf over {0, 0, NaN} is 0: scale kept
                        {0.0f, 1.0f, {0, kNaN, 0}},
                        {8.0f, 56.0f, {kNaN, 8, 0}},
                        {8.0f, 56.0f, {8, 8, 0}}});
    else
      run_sequence(*p, {{kNaN, 1.0f, {0, kNaN, 0}},
                        {0.0f, 1.0f, {kNaN, 0, 0}},
                        {8.0f, 1.0f, {0, 8, 0}},
                        {8.0f, 56.0f, {8, 8, 0}}});
  }
}

TEST(fp8_te_edges, InfFreezesTheMaxUntilItAgesOutUnderBothUpdates) {
  for (const char* update : {"fused", "unfused"}) {
    SCOPED_TRACE(update);
    test::CapturingSink sink;
    auto p = make_delayed(sink, options(3, "max", update));
    run_sequence(*p, {{2.0f, 224.0f, {0, 2, 0}},
                      {kInf, 224.0f, {2, kInf, 0}},
                      {1.0f, 224.0f, {kInf, 1, 0}},
                      {1.0f, 224.0f, {1, 1, 0}},
                      {1.0f, 448.0f, {1, 1, 0}}});
    EXPECT_TRUE(
        sink.contains(sdk::LogLevel::warn,
                      "fc1.matmul.input: non-finite amax inf observed; the scale stays at 224 "
                      "while it is in the amax history"));
  }
}

TEST(fp8_te_edges, MostRecentMixUnderTheFusedUpdate) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, options(3, "most_recent", "fused"));
  run_sequence(*p, {{2.0f, 224.0f, {0, 2, 0}},
                    {0.0f, 224.0f, {0, 2, 0}},
                    {kNaN, 224.0f, {2, kNaN, 0}},
                    {kInf, 224.0f, {kNaN, kInf, 0}},
                    {4.0f, 112.0f, {kInf, 4, 0}},
                    {-0.0f, 112.0f, {kInf, 4, 0}},  // -0 == 0: left alone
                    {1.0f, 448.0f, {4, 1, 0}}});
  EXPECT_TRUE(
      sink.contains(sdk::LogLevel::warn,
                    "fc1.matmul.input: non-finite amax nan observed; the scale stays at 224 for "
                    "this step"));
}

TEST(fp8_te_edges, MostRecentMixUnderTheUnfusedUpdate) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, options(3, "most_recent", "unfused"));
  run_sequence(*p, {{2.0f, 224.0f, {0, 2, 0}},
                    {0.0f, 224.0f, {2, 0, 0}},
                    {kNaN, 224.0f, {0, kNaN, 0}},
                    {kInf, 224.0f, {kNaN, kInf, 0}},
                    {4.0f, 112.0f, {kInf, 4, 0}},
                    {-0.0f, 112.0f, {4, 0, 0}},
                    {1.0f, 448.0f, {0, 1, 0}}});
}

TEST(fp8_te_edges, OneEntryHistoriesAgreeUnderBothUpdatesAndAlgos) {
  for (const char* algo : {"max", "most_recent"})
    for (const char* update : {"fused", "unfused"}) {
      SCOPED_TRACE(std::string(algo) + ", " + update);
      test::CapturingSink sink;
      auto p = make_delayed(sink, options(1, algo, update));
      run_sequence(*p, {{2.0f, 224.0f, {0}},
                        {0.0f, 224.0f, {0}},
                        {kNaN, 224.0f, {0}},  // fmaxf(0, NaN) = 0 and max(0, NaN) = NaN: both keep
                        {kInf, 224.0f, {0}},
                        {-0.0f, 224.0f, {0}},
                        {4.0f, 112.0f, {0}}});
    }
}

TEST(fp8_te_edges, MarginAndE5m2) {
  // grad_output under "hybrid" is E5M2: (57344 / 2^3) / amax = 7168 / amax.
  test::CapturingSink sink;
  Values fused = options(2, "max", "fused");
  fused.emplace_back("margin", std::int64_t{3});
  auto p = make_delayed(sink, fused);
  run_sequence(*p,
               {{0.0f, 1.0f, {0, 0}},
                {7.0f, 1024.0f, {7, 0}},
                {kNaN, 1024.0f, {kNaN, 0}},
                {0.0f, 1024.0f, {kNaN, 0}},
                {14.0f, 512.0f, {14, 0}}},
               OperandRole::grad_output);

  Values unfused = options(2, "max", "unfused");
  unfused.emplace_back("margin", std::int64_t{3});
  auto u = make_delayed(sink, unfused);
  run_sequence(*u,
               {{0.0f, 1.0f, {0, 0}},
                {7.0f, 1024.0f, {7, 0}},
                {kNaN, 1024.0f, {kNaN, 0}},
                {0.0f, 1024.0f, {0, 0}},
                {14.0f, 512.0f, {14, 0}}},
               OperandRole::grad_output);
}

TEST(fp8_te_edges, IntervalCountsAppliedStepsAndZeroSlotsWaitForTheNextRecompute) {
  // interval 2, margin 1 (448 / 2 = 224), two entries: scales are recomputed on applied
  // steps 2, 4, 6 and 8.
  Values fused = options(2, "max", "fused");
  fused.emplace_back("interval", std::int64_t{2});
  fused.emplace_back("margin", std::int64_t{1});
  test::CapturingSink sink;
  auto p = make_delayed(sink, fused);
  run_sequence(*p, {{2.0f, 1.0f, {2, 0}},
                    {0.0f, 1.0f, {2, 0}},  // a recompute step, but amax 0: left alone
                    {4.0f, 1.0f, {4, 0}},
                    {1.0f, 56.0f, {1, 0}},
                    {0.0f, 56.0f, {1, 0}},
                    {0.0f, 56.0f, {1, 0}},
                    {0.5f, 56.0f, {0.5f, 0}},
                    {0.25f, 448.0f, {0.25f, 0}}});
  EXPECT_EQ(p->applied_steps(), 8);

  Values unfused = options(2, "max", "unfused");
  unfused.emplace_back("interval", std::int64_t{2});
  unfused.emplace_back("margin", std::int64_t{1});
  auto u = make_delayed(sink, unfused);
  run_sequence(*u, {{2.0f, 1.0f, {2, 0}},
                    {0.0f, 112.0f, {0, 0}},
                    {4.0f, 112.0f, {4, 0}},
                    {1.0f, 56.0f, {1, 0}},
                    {0.0f, 56.0f, {0, 0}},
                    {0.0f, 56.0f, {0, 0}},
                    {0.5f, 56.0f, {0.5f, 0}},
                    {0.25f, 448.0f, {0.25f, 0}}});
}

TEST(fp8_te_edges, AnOperandNotCastInAStepIsLeftAloneByTheFusedUpdate) {
  // fc1.input is cast every step, fc1.weight only in steps 1 and 3 (e.g. a frozen or skipped
  // branch): under "fused" the weight's ring holds only the steps that cast it.
  for (const char* update : {"fused", "unfused"}) {
    SCOPED_TRACE(update);
    test::CapturingSink sink;
    auto p = make_delayed(sink, options(3, "max", update));
    for (int i = 1; i <= 3; ++i) {
      p->record_amax(operand("fc1", OperandRole::input), 1.0f);
      if (i != 2) p->record_amax(operand("fc1", OperandRole::weight), static_cast<float>(i));
      p->on_step_end(true);
    }
    const bool fused = std::string(update) == "fused";
    EXPECT_TRUE(same_amaxes(p->slot("fc1.matmul.weight")->history.chronological(),
                            fused ? std::vector<float>{1, 3, 0} : std::vector<float>{0, 3, 0}));
    EXPECT_EQ(p->slot("fc1.matmul.weight")->history.position(), fused ? 2u : 0u);
    EXPECT_TRUE(same_amaxes(p->slot("fc1.matmul.input")->history.chronological(), {1, 1, 0}));
  }
}

}  // namespace
}  // namespace mixtrain::fp8
