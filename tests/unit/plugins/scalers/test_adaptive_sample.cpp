// samples/custom_scaler's adaptive loss scaler, compiled against the in-tree SDK: its trajectory
// (growth, a premature growth doubling the interval, a long clean period halving it) and the host's
// gated update, which asks update(false) before it reads the check and takes it back with
// load_state() when the gradients were not finite: the log then says only what stood.
#include <gtest/gtest.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "adaptive_loss_scaler.h"
#include "plugin_test_support.h"

namespace mixtrain_samples {
namespace {

namespace sdk = mixtrain::sdk;
namespace test = mixtrain::test;

struct Scaler {
  test::CapturingSink sink;
  std::unique_ptr<AdaptiveLossScaler> s;
  explicit Scaler(std::int64_t min_interval) {
    s = std::make_unique<AdaptiveLossScaler>(
        test::resolve("scaler.adaptive", AdaptiveLossScaler::option_schema(),
                      {{"init_scale", 1024.0}, {"min_interval", min_interval}}),
        test::context(&sink, "adaptive_scaler", "scaler", "adaptive"));
  }
  // The gated host: update(false) first, taken back when the step overflowed.
  sdk::ScalerDecision gated(bool found_inf) {
    const auto before = s->save_state();
    const auto tentative = s->update(false);
    if (!found_inf) return tentative;
    s->load_state(before);
    return s->update(true);
  }
};

TEST(AdaptiveSample, GrowsAfterItsIntervalAndBacksOffAtOnce) {
  Scaler a(2);
  EXPECT_EQ(a.s->update(false).scale_after, 1024.0f);
  EXPECT_EQ(a.s->update(false).scale_after, 2048.0f);  // a streak of 2
  const auto skipped = a.s->update(true);
  EXPECT_FALSE(skipped.apply_step);
  EXPECT_EQ(skipped.scale_after, 1024.0f);
  EXPECT_EQ(a.s->interval(), 4);  // the growth was premature: the interval doubles
}

// With min_interval 2: steps 1-2 grow the scale, the overflow at 3 comes one step after the growth
// (the interval doubles to 4), and the clean steps after it reach a long clean period (16 steps
// without overflow, 4 intervals) at step 19, where update(false) halves the interval.
std::vector<bool> overflow_at(std::initializer_list<int> steps, int count) {
  std::vector<bool> out(static_cast<std::size_t>(count), false);
  for (int s : steps) out[static_cast<std::size_t>(s - 1)] = true;
  return out;
}

std::vector<std::string> info_lines(const test::CapturingSink& sink) {
  std::vector<std::string> out;
  for (const auto& l : sink.lines)
    if (l.level == sdk::LogLevel::info) out.push_back(l.message);
  return out;
}

TEST(AdaptiveSample, TheGatedHostsTakenBackUpdateLeavesNoTraceInStateOrLog) {
  // Twin scalers: one driven as the ungated host drives it, one as the gated host does. Step 19
  // overflows, so the gated host takes back a tentative update that halved the interval.
  for (const auto& overflows : {overflow_at({3}, 24), overflow_at({3, 19}, 40)}) {
    Scaler plain(2), gated(2);
    for (bool found_inf : overflows) {
      const auto p = plain.s->update(found_inf);
      const auto g = gated.gated(found_inf);
      ASSERT_EQ(p.apply_step, g.apply_step);
      ASSERT_EQ(p.scale_after, g.scale_after);
    }
    EXPECT_EQ(plain.s->save_state().values, gated.s->save_state().values);
    plain.s.reset();  // a last step's lines are written when the scaler goes
    gated.s.reset();
    EXPECT_EQ(info_lines(plain.sink), info_lines(gated.sink));
    EXPECT_TRUE(plain.sink.contains(sdk::LogLevel::info, "overflow soon after growth"));
  }
}

TEST(AdaptiveSample, ALineOfATakenBackUpdateIsNeverWritten) {
  Scaler a(2);
  for (bool found_inf : overflow_at({3}, 18)) a.gated(found_inf);
  EXPECT_EQ(a.s->interval(), 4);
  const auto state = a.s->save_state();
  a.s->update(false);  // step 19, tentative: a long clean period halves the interval
  EXPECT_EQ(a.s->interval(), 2);
  a.s->load_state(state);
  EXPECT_EQ(a.s->interval(), 4);
  a.s->update(true);  // what stands: an overflow
  a.s.reset();
  EXPECT_FALSE(a.sink.contains(sdk::LogLevel::info, "long clean period"));
  EXPECT_TRUE(a.sink.contains(sdk::LogLevel::info, "step 19: non-finite gradients"));

  // Without the overflow the same step says it, once the next update confirms it.
  Scaler b(2);
  for (bool found_inf : overflow_at({3}, 19)) b.gated(found_inf);
  EXPECT_FALSE(b.sink.contains(sdk::LogLevel::info, "long clean period"));
  b.gated(false);
  EXPECT_TRUE(
      b.sink.contains(sdk::LogLevel::info, "step 19: long clean period, growth interval 4 -> 2"));
}

}  // namespace
}  // namespace mixtrain_samples
