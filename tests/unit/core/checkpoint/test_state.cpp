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

}  // namespace
}  // namespace mixtrain::core
