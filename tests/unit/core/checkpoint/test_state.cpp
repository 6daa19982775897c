// The checkpoint's JSON codec of component state: every value comes back as it was saved,
// non-finite floats included (an FP8 amax history may hold NaN, inf or -inf, and the scale
// rules treat each differently).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "checkpoint/state.h"

namespace mixtrain::core {
namespace {

TEST(core_CheckpointState, ComponentStateRoundTripsNonFiniteValues) {
  const float inf = std::numeric_limits<float>::infinity();
  sdk::ComponentState st;
  st.version = 3;
  st.values["history"] = std::vector<float>{1.5f, std::nanf(""), inf, -inf, -0.0f, 0.0f};
  st.values["loss"] = -std::numeric_limits<double>::infinity();
  st.values["nan"] = std::nan("");
  st.values["steps"] = std::int64_t{7};
  // Through text, as the checkpoint stores it.
  const auto text = component_state_to_json("fp8-delayed", st).dump();
  const auto back =
      component_state_from_json(nlohmann::json::parse(text), "policy", "fp8-delayed", "ck.mxt");
  EXPECT_EQ(back.version, 3);
  const auto& h = back.get<std::vector<float>>("history");
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[0], 1.5f);
  EXPECT_TRUE(std::isnan(h[1]));
  EXPECT_EQ(h[2], inf);
  EXPECT_EQ(h[3], -inf);
  EXPECT_TRUE(std::signbit(h[4]));
  EXPECT_EQ(back.get<double>("loss"), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(back.get<double>("nan")));
  EXPECT_EQ(back.get<std::int64_t>("steps"), 7);
}

TEST(core_CheckpointState, NullFromOlderCheckpointsReadsAsNanAndOtherStringsAreRejected) {
  auto j = nlohmann::json::parse(
      R"({"component":"x","version":1,"values":{"h":{"floats":[null, 2.0]}}})");
  const auto st = component_state_from_json(j, "policy", "x", "ck.mxt");
  EXPECT_TRUE(std::isnan(st.get<std::vector<float>>("h")[0]));
  j["values"]["h"]["floats"][0] = "infinity";
  EXPECT_THROW(component_state_from_json(j, "policy", "x", "ck.mxt"), sdk::UserError);
}

// The watched metrics ("watch": early stopping, the best checkpoint) come back as saved, and every
// field is range-checked against the checkpoint's step.
TEST(core_CheckpointState, WatchedMetricRoundTripsAndRefusesWhatCannotBe) {
  WatchedMetric w;
  w.metric = "eval_accuracy";
  w.has_best = true;
  w.best = 0.8125;
  w.best_step = 40;
  w.bad_evals = 2;
  w.last_eval_step = 60;
  const auto text = watched_metric_to_json(w).dump();
  const auto back =
      read_watched_metric(nlohmann::json::parse(text), "watch.early_stopping", 60, "ck.mxt");
  EXPECT_EQ(back.metric, "eval_accuracy");
  EXPECT_TRUE(back.has_best);
  EXPECT_EQ(back.best, 0.8125);
  EXPECT_EQ(back.best_step, 40);
  EXPECT_EQ(back.bad_evals, 2);
  EXPECT_EQ(back.last_eval_step, 60);
  // No best yet: best is NaN, written as "nan".
  WatchedMetric fresh;
  fresh.metric = "eval_loss";
  fresh.best = std::nan("");
  const auto again = read_watched_metric(watched_metric_to_json(fresh), "watch.x", 0, "ck.mxt");
  EXPECT_FALSE(again.has_best);

  auto refused = [&](const char* key, nlohmann::json value, const std::string& says) {
    auto j = nlohmann::json::parse(text);
    j[key] = value;
    try {
      read_watched_metric(j, "watch.early_stopping", 60, "ck.mxt");
      ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
    } catch (const sdk::CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("ck.mxt"), std::string::npos) << e.what();
    }
  };
  refused("last_eval_step", 61, "watch.early_stopping.last_eval_step = 61 is outside [0, 60]");
  refused("best_step", 61, "watch.early_stopping.best_step = 61 is outside [0, 60]");
  refused("bad_evals", -1, "watch.early_stopping.bad_evals = -1 is outside [0, 60]");
  refused("bad_evals", 1.5, "is not an integer");
  refused("best", "nan", "a NaN evaluation never becomes the best");
  refused("best", "high", "is not a number");
  refused("has_best", 1, "is not a boolean");
  refused("metric", 3, "is not a string");
  auto missing = nlohmann::json::parse(text);
  missing.erase("best_step");
  EXPECT_THROW(read_watched_metric(missing, "watch.x", 60, "ck.mxt"), sdk::CheckpointError);
}

}  // namespace
}  // namespace mixtrain::core
