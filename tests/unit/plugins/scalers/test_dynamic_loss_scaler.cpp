// DynamicLossScaler: exact scale trajectories (PyTorch GradScaler, DeepSpeed hysteresis, clamps)
// and checkpoint round trips.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <memory>

#include "dynamic_loss_scaler.h"
#include "mixtrain/sdk/error.h"
#include "plugin_test_support.h"

namespace mixtrain::scalers {
namespace {

using sdk::OptionValue;
using Values = std::vector<std::pair<std::string, OptionValue>>;

struct Trajectory {
  std::vector<float> scales;  // scale_after of each step
  std::vector<bool> applied;
};

class DynamicLossScalerTest : public ::testing::Test {
 protected:
  std::unique_ptr<DynamicLossScaler> make(Values values) {
    auto options = test::resolve("scaler", DynamicLossScaler::option_schema(), std::move(values));
    return std::make_unique<DynamicLossScaler>(
        options, test::context(&sink, "scalers", "scaler", "dynamic"));
  }

  // Runs a pattern of found_inf flags; checks that each step starts from the previous scale.
  static Trajectory run(DynamicLossScaler& scaler, const std::vector<bool>& found_inf) {
    Trajectory t;
    for (bool inf : found_inf) {
      const float before = scaler.scale();
      const auto d = scaler.update(inf);
      EXPECT_EQ(d.scale_before, before);
      EXPECT_EQ(d.scale_after, scaler.scale());
      t.scales.push_back(d.scale_after);
      t.applied.push_back(d.apply_step);
    }
    return t;
  }

  test::CapturingSink sink;
};

constexpr bool T = true;
constexpr bool F = false;

// Suite names start with the plugin name so `ctest -R scalers` selects them.
using scalers_dynamic = DynamicLossScalerTest;

TEST_F(scalers_dynamic, DefaultsArePyTorchGradScaler) {
  auto scaler = make({});
  EXPECT_EQ(scaler->scale(), 65536.0f);
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(scaler->update(false).apply_step);
  EXPECT_EQ(scaler->scale(), 65536.0f);
  EXPECT_EQ(scaler->growth_tracker(), 1999);
  EXPECT_EQ(scaler->update(false).scale_after, 131072.0f);  // 2000th finite step grows x2
  EXPECT_EQ(scaler->growth_tracker(), 0);
  const auto d = scaler->update(true);  // one overflow backs off x0.5 (hysteresis 1)
  EXPECT_FALSE(d.apply_step);
  EXPECT_EQ(d.scale_after, 65536.0f);
}

TEST_F(scalers_dynamic, GrowthIntervalThreeTrajectory) {
  auto scaler = make({{"growth_interval", std::int64_t{3}}});
  const auto t = run(*scaler, {F, F, F, T, F, F, F, F, T, T});
  EXPECT_EQ(t.scales, (std::vector<float>{65536, 65536, 131072, 65536, 65536, 65536, 131072, 131072,
                                          65536, 32768}));
  EXPECT_EQ(t.applied, (std::vector<bool>{T, T, T, F, T, T, T, T, F, F}));
  EXPECT_EQ(scaler->skipped_steps(), 3);
  EXPECT_EQ(scaler->steps(), 10);
}

TEST_F(scalers_dynamic, OverflowResetsGrowthTracker) {
  auto scaler = make({{"growth_interval", std::int64_t{3}}});
  const auto t = run(*scaler, {F, F, T, F, F, F});
  // The overflow at step 3 restarts the count: growth comes 3 finite steps later, at step 6.
  EXPECT_EQ(t.scales, (std::vector<float>{65536, 65536, 32768, 32768, 32768, 65536}));
}

TEST_F(scalers_dynamic, NonPowerOfTwoFactors) {
  auto scaler = make({{"init_scale", 1000.0},
                      {"growth_factor", 1.5},
                      {"backoff_factor", 0.25},
                      {"growth_interval", std::int64_t{1}}});
  const auto t = run(*scaler, {F, T, F});
  EXPECT_EQ(t.scales, (std::vector<float>{1500.0f, 375.0f, 562.5f}));
}

TEST_F(scalers_dynamic, HysteresisTwoIsRestoredOnlyByGrowth) {
  auto scaler = make({{"growth_interval", std::int64_t{3}}, {"hysteresis", std::int64_t{2}}});
  const auto t = run(*scaler, {T, F, T, T, F, F, F, T, T});
  // Step 1 tolerated; step 2 does not restore the counter, so step 3 and 4 back off. Steps 5-7
  // grow (tracker reaches 3) and restore the counter: step 8 is tolerated again, step 9 is not.
  EXPECT_EQ(t.scales,
            (std::vector<float>{65536, 65536, 32768, 16384, 16384, 16384, 32768, 32768, 16384}));
  EXPECT_EQ(t.applied, (std::vector<bool>{F, T, F, F, T, T, T, F, F}));
  EXPECT_EQ(scaler->hysteresis_left(), 1);
}

TEST_F(scalers_dynamic, HysteresisTwoConsecutive) {
  auto scaler = make({{"growth_interval", std::int64_t{3}},
                      {"hysteresis", std::int64_t{2}},
                      {"consecutive_hysteresis", true}});
  const auto t = run(*scaler, {T, F, T, T, F, T});
  // Every finite step restores the counter: only the second of two back-to-back overflows
  // backs off.
  EXPECT_EQ(t.scales, (std::vector<float>{65536, 65536, 65536, 32768, 32768, 32768}));
  EXPECT_EQ(t.applied, (std::vector<bool>{F, T, F, F, T, F}));
}

TEST_F(scalers_dynamic, HysteresisThree) {
  auto scaler = make({{"growth_interval", std::int64_t{4}}, {"hysteresis", std::int64_t{3}}});
  const auto t = run(*scaler, {T, T, T, T, F, F, F, F, T, T, F, T});
  EXPECT_EQ(t.scales, (std::vector<float>{65536, 65536, 32768, 16384,  // 2 tolerated, then back off
                                          16384, 16384, 16384, 32768,  // growth restores 3
                                          32768, 32768, 32768, 16384}));
  EXPECT_EQ(t.applied, (std::vector<bool>{F, F, F, F, T, T, T, T, F, F, T, F}));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "hysteresis keeps scale 65536"));
}

TEST_F(scalers_dynamic, MinScaleFloor) {
  auto scaler = make({{"init_scale", 3.0}, {"min_scale", 1.0}});
  const auto t = run(*scaler, {T, T, T});
  EXPECT_EQ(t.scales, (std::vector<float>{1.5f, 1.0f, 1.0f}));
  EXPECT_EQ(t.applied, (std::vector<bool>{F, F, F}));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "scale 1 -> 1 (at its floor)"));
}

TEST_F(scalers_dynamic, NoFloorByDefault) {
  auto scaler = make({{"init_scale", 1.0}});
  run(*scaler, std::vector<bool>(10, T));
  EXPECT_EQ(scaler->scale(), 1.0f / 1024.0f);
}

// Without min_scale the scale still stays a positive float: backing off from the smallest one
// keeps it, and that state saves and loads (a scale rounded to 0 would be refused on load).
TEST_F(scalers_dynamic, BackingOffNeverReachesZeroAndEveryStateItReachesLoads) {
  auto scaler = make({{"init_scale", 1e-40}});
  run(*scaler, std::vector<bool>(20, T));
  EXPECT_EQ(scaler->scale(), std::numeric_limits<float>::denorm_min());
  auto resumed = make({});
  resumed->load_state(scaler->save_state());
  EXPECT_EQ(resumed->scale(), scaler->scale());
}

TEST_F(scalers_dynamic, MaxScaleCap) {
  auto scaler = make({{"growth_interval", std::int64_t{1}}, {"max_scale", 200000.0}});
  const auto t = run(*scaler, {F, F, F});
  EXPECT_EQ(t.scales, (std::vector<float>{131072, 200000, 200000}));
}

TEST_F(scalers_dynamic, NeverGrowsIntoInfinity) {
  const double big = std::ldexp(1.0, 127);
  auto scaler = make({{"init_scale", big}, {"growth_interval", std::int64_t{1}}});
  run(*scaler, {F, F});
  EXPECT_EQ(scaler->scale(), static_cast<float>(big));
  EXPECT_TRUE(std::isfinite(scaler->scale()));
}

TEST_F(scalers_dynamic, LogsBackoffAndGrowthWithBeforeAndAfter) {
  auto scaler = make({{"growth_interval", std::int64_t{1}}});
  scaler->update(false);
  scaler->update(true);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::debug, "scale 65536 -> 131072"));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info,
                            "step 2: non-finite gradients, step skipped; "
                            "scale 131072 -> 65536"));
}

// The gated host asks update(false) before it reads the check and, when the step overflowed,
// takes it back with load_state() and asks update(true): the growth it took back is never logged.
TEST_F(scalers_dynamic, AGrowthTakenBackByLoadStateIsNeverLogged) {
  auto scaler = make({{"growth_interval", std::int64_t{1}}});
  const auto before = scaler->save_state();
  scaler->update(false);  // tentative: would grow to 131072
  scaler->load_state(before);
  scaler->update(true);   // what stands
  scaler->update(false);  // grows from the backed-off 32768
  scaler.reset();         // a last step's growth is written when the scaler goes
  EXPECT_FALSE(sink.contains(sdk::LogLevel::debug, "scale 65536 -> 131072"));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info,
                            "step 1: non-finite gradients, step skipped; "
                            "scale 65536 -> 32768"));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::debug, "step 2: 1 finite steps, scale 32768 -> 65536"));
}

TEST_F(scalers_dynamic, SaveLoadMidTrajectoryContinuesIdentically) {
  const Values config{
      {"growth_interval", std::int64_t{3}}, {"hysteresis", std::int64_t{3}}, {"min_scale", 256.0}};
  const std::vector<bool> prefix{F, F, T, F, T, F};  // tracker 1, counter 1 at the save point
  const std::vector<bool> suffix{T, F, F, F, T, T, F, F, T, T, T, T, T, T, T, T, F};

  auto original = make(config);
  run(*original, prefix);
  const auto state = original->save_state();
  EXPECT_EQ(state.version, 1);
  EXPECT_EQ(state.get<std::int64_t>("growth_tracker"), 1);
  EXPECT_EQ(state.get<std::int64_t>("hysteresis_left"), 1);

  auto resumed = make(config);
  resumed->load_state(state);
  EXPECT_EQ(resumed->scale(), original->scale());
  const auto expected = run(*original, suffix);
  const auto actual = run(*resumed, suffix);
  EXPECT_EQ(actual.scales, expected.scales);
  EXPECT_EQ(actual.applied, expected.applied);
  EXPECT_EQ(resumed->save_state().values, original->save_state().values);
}

TEST_F(scalers_dynamic, LoadClampsToChangedConfig) {
  auto original = make({{"growth_interval", std::int64_t{10}}, {"hysteresis", std::int64_t{4}}});
  run(*original, std::vector<bool>(5, F));
  auto state = original->save_state();  // tracker 5, counter 4

  auto resumed = make({{"growth_interval", std::int64_t{3}},
                       {"hysteresis", std::int64_t{2}},
                       {"max_scale", 1024.0},
                       {"init_scale", 1024.0}});
  resumed->load_state(state);
  EXPECT_EQ(resumed->growth_tracker(), 2);
  EXPECT_EQ(resumed->hysteresis_left(), 2);
  EXPECT_EQ(resumed->scale(), 1024.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "clamped to 1024"));
}

TEST_F(scalers_dynamic, StateWithoutTheSavedHysteresisStillLoadsAndClamps) {
  // Checkpoints written before "hysteresis" was saved: the counter is checked against the config.
  auto original = make({{"hysteresis", std::int64_t{4}}});
  auto state = original->save_state();
  EXPECT_EQ(state.get<std::int64_t>("hysteresis"), 4);
  state.values.erase("hysteresis");
  auto resumed = make({{"hysteresis", std::int64_t{2}}});
  resumed->load_state(state);
  EXPECT_EQ(resumed->hysteresis_left(), 2);
}

TEST_F(scalers_dynamic, MalformedStateIsRejected) {
  auto scaler = make({});
  const auto good = scaler->save_state();
  auto expect_rejected = [&](const sdk::ComponentState& bad, const std::string& fragment) {
    try {
      scaler->load_state(bad);
      ADD_FAILURE() << "accepted state, expected error containing: " << fragment;
    } catch (const sdk::CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_FALSE(e.hint().empty());
    }
  };
  auto with = [&](const std::string& key, sdk::StateValue v) {
    auto s = good;
    s.values[key] = std::move(v);
    return s;
  };
  auto without = [&](const std::string& key) {
    auto s = good;
    s.values.erase(key);
    return s;
  };
  expect_rejected(without("scale"), "'scale'");
  expect_rejected(without("hysteresis_left"), "'hysteresis_left'");
  expect_rejected(with("scale", std::int64_t{4}), "unexpected type");
  expect_rejected(with("scale", std::numeric_limits<double>::quiet_NaN()), "'scale'");
  expect_rejected(with("scale", std::numeric_limits<double>::infinity()), "'scale'");
  expect_rejected(with("scale", 0.0), "'scale'");
  expect_rejected(with("scale", -2.0), "'scale'");
  expect_rejected(with("scale", 1e300), "'scale'");
  expect_rejected(with("growth_tracker", std::int64_t{-1}), "'growth_tracker' = -1");
  expect_rejected(with("hysteresis_left", std::int64_t{0}), "'hysteresis_left' = 0");
  expect_rejected(with("skipped_steps", std::int64_t{1}), "'skipped_steps' = 1");  // > steps
  // The tracker counts steps taken (none yet) and never reaches INT64_MAX; the hysteresis
  // counter counts down from the saved budget (1 by default).
  expect_rejected(with("growth_tracker", std::int64_t{1}), "'growth_tracker' = 1");
  auto everywhere_max = with("steps", std::numeric_limits<std::int64_t>::max());
  everywhere_max.values["growth_tracker"] = std::numeric_limits<std::int64_t>::max();
  expect_rejected(everywhere_max, "'growth_tracker'");
  expect_rejected(with("hysteresis_left", std::int64_t{2}), "'hysteresis_left' = 2");
  expect_rejected(with("hysteresis", std::int64_t{0}), "'hysteresis' = 0");
  auto newer = good;
  newer.version = 2;
  expect_rejected(newer, "version 2");
  // A rejected load leaves the scaler untouched.
  EXPECT_EQ(scaler->save_state().values, good.values);
}

}  // namespace
}  // namespace mixtrain::scalers
