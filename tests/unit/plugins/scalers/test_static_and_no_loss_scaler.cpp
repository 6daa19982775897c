// StaticLossScaler and NoLossScaler: constant scales, skipped non-finite steps, state.
#include <gtest/gtest.h>

#include <limits>

#include "mixtrain/sdk/error.h"
#include "no_loss_scaler.h"
#include "plugin_test_support.h"
#include "static_loss_scaler.h"

namespace mixtrain::scalers {
namespace {

using Values = std::vector<std::pair<std::string, sdk::OptionValue>>;

class StaticLossScalerTest : public ::testing::Test {
 protected:
  StaticLossScaler make(Values values) {
    return StaticLossScaler(
        test::resolve("scaler", StaticLossScaler::option_schema(), std::move(values)),
        test::context(&sink, "scalers", "scaler", "static"));
  }
  test::CapturingSink sink;
};

// Suite names start with the plugin name so `ctest -R scalers` selects them.
using scalers_static = StaticLossScalerTest;

TEST_F(scalers_static, DefaultScale) {
  auto scaler = make({});
  EXPECT_EQ(scaler.scale(), 65536.0f);
}

TEST_F(scalers_static, SkipsNonFiniteStepsAndNeverChangesScale) {
  auto scaler = make({{"scale", std::int64_t{1024}}});  // integers are accepted for numbers
  const std::vector<bool> pattern{false, true, false, true, true, false};
  std::vector<bool> applied;
  for (bool inf : pattern) {
    const auto d = scaler.update(inf);
    EXPECT_EQ(d.scale_before, 1024.0f);
    EXPECT_EQ(d.scale_after, 1024.0f);
    applied.push_back(d.apply_step);
  }
  EXPECT_EQ(applied, (std::vector<bool>{true, false, true, false, false, true}));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_EQ(scaler.steps(), 6);
  EXPECT_EQ(scaler.skipped_steps(), 3);
  EXPECT_TRUE(
      sink.contains(sdk::LogLevel::warn, "step 2: non-finite gradients at static scale 1024"));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "step 5:"));
}

TEST_F(scalers_static, SaveLoadRoundTrip) {
  auto original = make({{"scale", 128.0}});
  original.update(true);
  original.update(false);
  const auto state = original.save_state();
  EXPECT_EQ(state.get<double>("scale"), 128.0);

  auto resumed = make({{"scale", 128.0}});
  resumed.load_state(state);
  EXPECT_EQ(resumed.steps(), 2);
  EXPECT_EQ(resumed.skipped_steps(), 1);
  EXPECT_EQ(resumed.save_state().values, state.values);
}

TEST_F(scalers_static, ConfiguredScaleWinsOverSavedOne) {
  auto original = make({{"scale", 128.0}});
  auto resumed = make({{"scale", 512.0}});
  resumed.load_state(original.save_state());
  EXPECT_EQ(resumed.scale(), 512.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "written with static scale 128"));
}

TEST_F(scalers_static, MalformedStateIsRejected) {
  auto scaler = make({});
  auto state = scaler.save_state();
  state.values["steps"] = std::int64_t{-3};
  EXPECT_THROW(scaler.load_state(state), sdk::CheckpointError);
  state = scaler.save_state();
  state.values["scale"] = std::string("big");
  EXPECT_THROW(scaler.load_state(state), sdk::CheckpointError);
  state = scaler.save_state();
  state.version = 0;
  EXPECT_THROW(scaler.load_state(state), sdk::CheckpointError);
}

class NoLossScalerTest : public ::testing::Test {
 protected:
  NoLossScaler make() {
    return NoLossScaler(test::resolve("scaler", NoLossScaler::option_schema(), {}),
                        test::context(&sink, "scalers", "scaler", "none"));
  }
  test::CapturingSink sink;
};

// Suite names start with the plugin name so `ctest -R scalers` selects them.
using scalers_none = NoLossScalerTest;

TEST_F(scalers_none, ScaleOneAndNeverAppliesNonFiniteSteps) {
  auto scaler = make();
  EXPECT_EQ(scaler.scale(), 1.0f);
  auto d = scaler.update(false);
  EXPECT_TRUE(d.apply_step);
  EXPECT_EQ(d.scale_before, 1.0f);
  EXPECT_EQ(d.scale_after, 1.0f);
  d = scaler.update(true);
  EXPECT_FALSE(d.apply_step);
  EXPECT_EQ(d.scale_after, 1.0f);
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "step 2: non-finite gradients"));
}

TEST_F(scalers_none, SaveLoadRoundTrip) {
  auto original = make();
  original.update(true);
  original.update(false);
  original.update(true);
  auto resumed = make();
  resumed.load_state(original.save_state());
  EXPECT_EQ(resumed.steps(), 3);
  EXPECT_EQ(resumed.skipped_steps(), 2);

  auto bad = original.save_state();
  bad.values.erase("steps");
  EXPECT_THROW(resumed.load_state(bad), sdk::CheckpointError);
}

TEST_F(scalers_none, CountsRestoredAtTheTopStopThere) {
  // A checkpoint may hold INT64_MAX (the largest valid count): counting on must not overflow.
  auto scaler = make();
  auto state = scaler.save_state();
  state.values["steps"] = std::numeric_limits<std::int64_t>::max();
  state.values["skipped_steps"] = std::numeric_limits<std::int64_t>::max();
  scaler.load_state(state);
  EXPECT_TRUE(scaler.update(true).apply_step == false);
  EXPECT_TRUE(scaler.update(false).apply_step);
  EXPECT_EQ(scaler.steps(), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(scaler.skipped_steps(), std::numeric_limits<std::int64_t>::max());
}

TEST_F(scalers_static, CountsRestoredAtTheTopStopThere) {
  auto scaler = make({});
  auto state = scaler.save_state();
  state.values["steps"] = std::numeric_limits<std::int64_t>::max();
  state.values["skipped_steps"] = std::numeric_limits<std::int64_t>::max();
  scaler.load_state(state);
  scaler.update(true);
  EXPECT_EQ(scaler.steps(), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(scaler.skipped_steps(), std::numeric_limits<std::int64_t>::max());
}

}  // namespace
}  // namespace mixtrain::scalers
