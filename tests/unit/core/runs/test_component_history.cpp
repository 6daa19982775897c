// A run's components by range of steps (runs/component_history.h): the chain a label shows, the
// JSON a checkpoint and summary.json hold, and what an older or damaged checkpoint falls back to.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "mixtrain/core/runs/component_history.h"
#include "runs/component_history_json.h"

namespace mixtrain::core {
namespace {

TEST(ComponentHistory, ARepeatMergesAndEachPartShowsOnlyItsOwnChanges) {
  ComponentHistory h;
  extend_history(h, {1, "fp32", "", "none", "adamw"});
  extend_history(h, {11, "fp32", "", "none", "adamw"});  // a resume without a switch
  ASSERT_EQ(h.size(), 1u);
  extend_history(h, {21, "fp16-mixed", "", "dynamic", "adamw"});
  extend_history(h, {31, "auto", "bf16-mixed", "dynamic", "adamw"});
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(history_text(h, HistoryPart::policy),
            "fp32\u2192fp16-mixed@21\u2192auto\u2192bf16-mixed@31");
  EXPECT_EQ(history_text(h, HistoryPart::scaler), "none\u2192dynamic@21");
  EXPECT_EQ(history_text(h, HistoryPart::optimizer), "adamw");
}

TEST(ComponentHistory, JsonRoundTripsAndRefusesWhatItDidNotWrite) {
  const ComponentHistory h = {{1, "auto", "bf16-mixed", "none", "sgd"},
                              {7, "fp8-delayed", "", "none", "sgd"}};
  const auto back = component_history_from_json(component_history_to_json(h));
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].resolved_policy, "bf16-mixed");
  EXPECT_EQ((*back)[1].first_step, 7);
  EXPECT_TRUE((*back)[1].same_components(h[1]));
  using nlohmann::json;
  for (const json& bad :
       {json::array(), json::object(), json::parse(R"([{"first_step": 0, "policy": "fp32",
          "scaler": "none", "optimizer": "sgd"}])"),
        json::parse(R"([{"first_step": 5, "policy": "a", "scaler": "b", "optimizer": "c"},
                        {"first_step": 5, "policy": "d", "scaler": "b", "optimizer": "c"}])"),
        json::parse(R"([{"first_step": 1, "policy": 3, "scaler": "b", "optimizer": "c"}])")})
    EXPECT_FALSE(component_history_from_json(bad)) << bad.dump();
}

TEST(ComponentHistory, ACheckpointWithoutOneFallsBackToItsComponentsStates) {
  const std::map<std::string, std::string> older = {
      {"policy", R"({"component": "auto", "resolved": "fp32", "version": 1, "values": {}})"},
      {"scaler", R"({"component": "dynamic", "version": 1, "values": {}})"},
      {"optimizer", R"({"component": "adamw", "version": 1, "values": {}})"},
      {"history", "not json"}};
  const auto h = history_of_checkpoint(older);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].first_step, 1);
  EXPECT_EQ(h[0].policy, "auto");
  EXPECT_EQ(h[0].resolved_policy, "fp32");
  EXPECT_EQ(h[0].scaler, "dynamic");
  EXPECT_TRUE(history_of_checkpoint({}).empty());
}

}  // namespace
}  // namespace mixtrain::core
