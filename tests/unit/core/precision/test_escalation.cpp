// Automatic escalation's bookkeeping (core/src/precision/escalation.h): the ladder, the K-th blame
// within the window, forgetting, the op that cannot widen, de-escalation, and the checkpoint form
// (a round trip, and every malformed field refused by name), and a resume under a config that
// plans a promoted node otherwise.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "precision/escalation.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using sdk::OpPrecision;

constexpr OpPrecision kFp16{DType::fp16, DType::fp16, DType::fp16, DType::fp16};
constexpr OpPrecision kFp8{DType::bf16, DType::fp8_e4m3, DType::bf16, DType::bf16};

EscalationSettings on(std::int64_t after, std::int64_t window, std::int64_t deescalate = 0) {
  return {true, after, window, deescalate};
}

bool same(const OpPrecision& a, const OpPrecision& b) {
  return a.weight == b.weight && a.gemm_input == b.gemm_input && a.activation == b.activation &&
         a.activation_grad == b.activation_grad;
}

TEST(Escalation, TheLadderWidensEveryFieldOneRung) {
  EXPECT_TRUE(same(widen(kFp16), {DType::fp32, DType::fp32, DType::fp32, DType::fp32}));
  EXPECT_TRUE(same(widen(kFp8), {DType::fp32, DType::bf16, DType::fp32, DType::fp32}));
  EXPECT_TRUE(same(widen(widen(kFp8)), {DType::fp32, DType::fp32, DType::fp32, DType::fp32}));
  EXPECT_TRUE(same(widen({DType::tf32, DType::tf32, DType::fp32, DType::fp32}), OpPrecision{}));
  EXPECT_TRUE(can_widen(kFp8));
  EXPECT_FALSE(can_widen(OpPrecision{}));
  EXPECT_EQ(precision_text(kFp16), "fp16");
  EXPECT_EQ(precision_text(kFp8),
            "weight=bf16 gemm_input=fp8_e4m3 activation=bf16 activation_grad=bf16");
}

// A resume under a config that plans a promoted node otherwise (an override added since): the
// config's plan stands, the node's promotion is dropped and so never demoted "back" to a format
// it no longer has; a node planned as before keeps its state.
TEST(Escalation, ANodeTheConfigNowPlansOtherwiseIsDroppedOthersStand) {
  Escalation esc(on(1, 10));
  esc.start_from("proj", kFp16);
  esc.start_from("fc1", kFp16);
  ASSERT_TRUE(esc.observe(1, true, "proj"));
  ASSERT_TRUE(esc.observe(2, true, "fc1"));
  const OpPrecision fp32{};
  const auto dropped =
      esc.drop_replanned([&](const std::string& node) -> std::optional<OpPrecision> {
        return node == "proj" ? fp32 : kFp16;
      });
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].node, "proj");
  EXPECT_TRUE(same(dropped[0].started_from, kFp16));
  EXPECT_TRUE(same(dropped[0].promoted, widen(kFp16)));
  EXPECT_TRUE(same(dropped[0].planned_now, fp32));
  const auto o = esc.overrides();
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(o[0].pattern, "fc1");
  EXPECT_EQ(esc.promotions_standing(), 1);
}

TEST(Escalation, FiresExactlyOnTheKthBlameWithinTheWindow) {
  Escalation esc(on(3, 10));
  esc.start_from("fc1", kFp16);
  EXPECT_FALSE(esc.observe(1, true, "fc1"));
  EXPECT_FALSE(esc.observe(2, false, ""));
  EXPECT_FALSE(esc.observe(5, true, "fc1"));
  EXPECT_TRUE(esc.overrides().empty());
  const auto e = esc.observe(7, true, "fc1");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, Escalation::Event::Kind::promote);
  EXPECT_EQ(e->step, 7);
  EXPECT_EQ(e->node, "fc1");
  EXPECT_EQ(e->blames, (std::vector<std::int64_t>{1, 5, 7}));
  EXPECT_TRUE(same(e->from, kFp16));
  EXPECT_TRUE(same(e->to, widen(kFp16)));
  const auto o = esc.overrides();
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(o[0].pattern, "fc1");
  EXPECT_EQ(o[0].activation, DType::fp32);
  EXPECT_EQ(o[0].gemm_input, DType::fp32);
  EXPECT_EQ(esc.promotions_standing(), 1);
}

TEST(Escalation, BlamesOlderThanTheWindowAreForgottenAndOtherNodesCountApart) {
  Escalation esc(on(2, 5));
  esc.start_from("a", kFp16);
  esc.start_from("b", kFp16);
  EXPECT_FALSE(esc.observe(1, true, "a"));
  EXPECT_FALSE(esc.observe(3, true, "b"));
  // Step 6: a's blame at step 1 is 5 steps old, outside a window of 5.
  EXPECT_FALSE(esc.observe(6, true, "a"));
  const auto e = esc.observe(7, true, "b");  // b's blames at 3 and 7 are within 5 steps
  ASSERT_TRUE(e);
  EXPECT_EQ(e->node, "b");
  const auto f = esc.observe(8, true, "a");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->node, "a");
  EXPECT_EQ(f->blames, (std::vector<std::int64_t>{6, 8}));
}

TEST(Escalation, SkipsWithoutANodeAndDisabledSettingsNeverFire) {
  Escalation off(EscalationSettings{false, 1, 10, 0});
  off.start_from("fc1", kFp16);
  EXPECT_FALSE(off.observe(1, true, "fc1"));
  Escalation esc(on(1, 10));
  EXPECT_FALSE(esc.observe(1, true, ""));  // the loss or the input batch: no op to widen
  EXPECT_THROW(esc.observe(2, true, "never-started"), std::logic_error);
}

TEST(Escalation, AnOpAlreadyInFp32IsReportedOnceAndNeverPromoted) {
  Escalation esc(on(1, 10));
  esc.start_from("norm", OpPrecision{});
  const auto e = esc.observe(1, true, "norm");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, Escalation::Event::Kind::stuck);
  EXPECT_FALSE(esc.observe(2, true, "norm"));
  EXPECT_TRUE(esc.overrides().empty());
  EXPECT_FALSE(esc.any_promoted());
}

TEST(Escalation, PromotesRungByRungThenDemotesTheLatestAfterACleanStretch) {
  Escalation esc(on(1, 10, 3));
  esc.start_from("fc1", kFp8);
  esc.start_from("fc2", kFp16);
  ASSERT_TRUE(esc.observe(1, true, "fc1"));  // fp8 -> bf16
  ASSERT_TRUE(esc.observe(2, true, "fc2"));  // fp16 -> fp32
  ASSERT_TRUE(esc.observe(3, true, "fc1"));  // bf16 -> fp32
  EXPECT_EQ(esc.promotions_standing(), 3);
  EXPECT_FALSE(esc.observe(4, false, ""));
  EXPECT_FALSE(esc.observe(5, false, ""));
  const auto d = esc.observe(6, false, "");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, Escalation::Event::Kind::demote);
  EXPECT_EQ(d->node, "fc1");  // the latest promotion goes first
  EXPECT_TRUE(same(d->to, widen(kFp8)));
  // A skip restarts the clean count.
  EXPECT_FALSE(esc.observe(7, false, ""));
  EXPECT_FALSE(esc.observe(8, true, ""));
  EXPECT_FALSE(esc.observe(9, false, ""));
  EXPECT_FALSE(esc.observe(10, false, ""));
  const auto d2 = esc.observe(11, false, "");
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->node, "fc2");
  EXPECT_EQ(esc.promotions_standing(), 1);
}

// A node that overflows again after its de-escalation was no transient: promoted back, it stays
// (de-escalation passes over it to the promotion before), where each demote-and-fail cycle would
// cost `after` skipped steps and as many halvings of a dynamic loss scale. The state round-trips
// through a checkpoint, and one written before pinning (no such fields) still loads.
TEST(Escalation, ANodePromotedAgainAfterItsDemotionStaysPromoted) {
  Escalation esc(on(1, 10, 2));
  esc.start_from("fc1", kFp16);
  esc.start_from("fc2", kFp16);
  ASSERT_TRUE(esc.observe(1, true, "fc2"));  // fc2 fp16 -> fp32
  ASSERT_TRUE(esc.observe(2, true, "fc1"));  // fc1 fp16 -> fp32
  EXPECT_FALSE(esc.observe(3, false, ""));
  auto d = esc.observe(4, false, "");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->node, "fc1");
  const auto again = esc.observe(5, true, "fc1");  // it overflows in fp16 again
  ASSERT_TRUE(again);
  EXPECT_EQ(again->kind, Escalation::Event::Kind::promote);
  EXPECT_TRUE(again->pinned);
  EXPECT_EQ(escalation_event_json(*again).value("pinned", false), true);
  const auto saved = esc.to_json();
  Escalation back = Escalation::from_json(saved, on(1, 10, 2), "ck.mxt");
  EXPECT_EQ(back.to_json(), saved);
  for (Escalation* e : {&esc, &back}) {
    EXPECT_FALSE(e->observe(6, false, ""));
    d = e->observe(7, false, "");
    ASSERT_TRUE(d);
    EXPECT_EQ(d->node, "fc2") << "the pinned fc1 was demoted again";
    for (std::int64_t step = 8; step < 40; ++step) EXPECT_FALSE(e->observe(step, false, ""));
    EXPECT_EQ(e->promotions_standing(), 1);
    ASSERT_EQ(e->overrides().size(), 1u);
    EXPECT_EQ(e->overrides()[0].pattern, "fc1");
  }
  // A node promoted for the first time is not pinned.
  EXPECT_FALSE(esc.events().front().pinned);
  auto old = saved;
  for (auto& [name, node] : old["nodes"].items()) {
    node.erase("demoted_from");
    node.erase("pinned_size");
  }
  EXPECT_NO_THROW(Escalation::from_json(old, on(1, 10, 2), "old.mxt"));
}

TEST(Escalation, TheCheckpointFormRoundTripsAndCountsOn) {
  Escalation esc(on(3, 50));
  esc.start_from("fc1", kFp16);
  esc.start_from("fc2", kFp16);
  esc.observe(1, true, "fc1");
  esc.observe(2, true, "fc1");
  esc.observe(3, true, "fc1");  // promoted
  esc.observe(4, true, "fc2");
  esc.observe(5, true, "fc2");
  const auto saved = esc.to_json();
  Escalation back = Escalation::from_json(saved, on(3, 50), "ck.mxt");
  EXPECT_EQ(back.to_json(), saved);
  // fc2's two blames survive: the third promotes it in both.
  const auto a = esc.observe(6, true, "fc2");
  const auto b = back.observe(6, true, "fc2");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(escalation_event_json(*a), escalation_event_json(*b));
  EXPECT_EQ(back.to_json(), esc.to_json());
}

TEST(Escalation, MalformedCheckpointStateIsRefusedByName) {
  Escalation esc(on(1, 10));
  esc.start_from("fc1", kFp16);
  esc.observe(1, true, "fc1");
  const auto good = esc.to_json();
  auto expect_bad = [](const nlohmann::json& j, const std::string& field) {
    try {
      Escalation::from_json(j, on(1, 10), "ck.mxt");
      ADD_FAILURE() << "accepted a state with a bad " << field;
    } catch (const sdk::CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("ck.mxt"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_bad(nlohmann::json::array(), "escalation");
  auto j = good;
  j.erase("nodes");
  expect_bad(j, "nodes");
  j = good;
  j["nodes"]["fc1"]["stack"][1]["activation"] = "fp64";
  expect_bad(j, "nodes.fc1.stack.1.activation");
  j = good;
  j["nodes"]["fc1"]["stack"][1] = j["nodes"]["fc1"]["stack"][0];  // not one rung wider
  expect_bad(j, "nodes.fc1.stack.1");
  j = good;
  j["promotion_order"] = {"fc1", "fc1"};
  expect_bad(j, "promotion_order");
  j = good;
  j["nodes"]["fc1"]["pinned_size"] = 3;  // above its stack of 2
  expect_bad(j, "nodes.fc1.pinned_size");
  j = good;
  j["nodes"]["fc1"]["demoted_from"] = -1;
  expect_bad(j, "nodes.fc1.demoted_from");
  j = good;
  j["promotion_order"] = nlohmann::json::array();
  expect_bad(j, "nodes.fc1.stack");
  j = good;
  j["clean_steps"] = -1;
  expect_bad(j, "clean_steps");
  j = good;
  j["nodes"]["fc1"]["blames"] = {5, 2};
  expect_bad(j, "nodes.fc1.blames");
  j = good;
  j["events"][0]["kind"] = "explode";
  expect_bad(j, "events.0.kind");
}

}  // namespace
}  // namespace mixtrain::core
