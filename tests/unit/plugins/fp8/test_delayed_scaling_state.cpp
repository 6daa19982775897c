// fp8-delayed checkpoints: round-trip, scale_inv recomputed on load, the history-length resume
// rule, recipe changes, and malformed states.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <variant>

#include "fp8_test_support.h"

namespace mixtrain::fp8 {
namespace {

using namespace testing;

// A few steps over two layers with varying amaxes, so every slot has a non-trivial history.
void train(sdk::PrecisionPolicy& p, int steps, float seed) {
  for (int i = 0; i < steps; ++i) {
    const float t = seed + static_cast<float>(i);
    for (const char* layer : {"fc1", "head"}) {
      p.operand_scaling(operand(layer, OperandRole::input));
      p.record_amax(operand(layer, OperandRole::input), 1.0f + std::fmod(t * 0.7f, 3.0f));
      p.operand_scaling(operand(layer, OperandRole::weight));
      p.record_amax(operand(layer, OperandRole::weight), 0.25f + std::fmod(t * 0.3f, 1.0f));
      p.operand_scaling(operand(layer, OperandRole::grad_output));
      p.record_amax(operand(layer, OperandRole::grad_output), 1e-3f * (1.0f + std::fmod(t, 5.0f)));
    }
    p.on_step_end(i % 4 != 3);  // every fourth step skipped
  }
}

void expect_same_scaling(sdk::PrecisionPolicy& a, sdk::PrecisionPolicy& b) {
  for (const char* layer : {"fc1", "head"})
    for (auto role : {OperandRole::input, OperandRole::weight, OperandRole::grad_output}) {
      const auto x = a.operand_scaling(operand(layer, role));
      const auto y = b.operand_scaling(operand(layer, role));
      EXPECT_EQ(x.dtype, y.dtype);
      EXPECT_EQ(x.scale, y.scale) << layer << "." << sdk::operand_role_name(role);
      EXPECT_EQ(x.scale_inv, y.scale_inv) << layer << "." << sdk::operand_role_name(role);
    }
}

const Values kShortHistory{{"amax_history_len", std::int64_t{4}}, {"interval", std::int64_t{2}}};

TEST(fp8_delayed_state, RoundTripGivesIdenticalScalesAndFutureBehaviour) {
  test::CapturingSink sink;
  auto a = make_delayed(sink, kShortHistory);
  train(*a, 11, 0.0f);
  const auto state = a->save_state();
  EXPECT_EQ(state.version, 2);
  for (const auto& [key, value] : state.values)
    EXPECT_EQ(key.find("scale_inv"), std::string::npos) << "scale_inv is recomputed, not stored";

  auto b = make_delayed(sink, kShortHistory);
  b->load_state(state);
  EXPECT_EQ(b->slot_names(), a->slot_names());
  EXPECT_EQ(b->applied_steps(), a->applied_steps());
  expect_same_scaling(*a, *b);
  for (const auto& name : a->slot_names()) {
    EXPECT_EQ(b->slot(name)->history.ring(), a->slot(name)->history.ring()) << name;
    EXPECT_EQ(b->slot(name)->history.position(), a->slot(name)->history.position()) << name;
  }
  train(*a, 9, 100.0f);
  train(*b, 9, 100.0f);
  expect_same_scaling(*a, *b);
  EXPECT_EQ(b->save_state().values, a->save_state().values);
  EXPECT_FALSE(sink.contains(sdk::LogLevel::warn, "amax_history_len"));
}

// What the previous version wrote: the same entries, slots named "<layer>.<role>".
sdk::ComponentState as_version_1(sdk::ComponentState state) {
  state.version = 1;
  for (auto& [key, value] : state.values)
    if (key.ends_with(".name")) {
      auto& name = std::get<std::string>(value);
      name.erase(name.find(".matmul"), std::string(".matmul").size());
    }
  return state;
}

TEST(fp8_delayed_state, AVersion1StateResumesWithEachSlotRenamedToItsLinearsMatmul) {
  test::CapturingSink sink;
  auto a = make_delayed(sink, kShortHistory);
  train(*a, 11, 0.0f);
  const auto v1 = as_version_1(a->save_state());
  ASSERT_EQ(v1.get<std::string>("slot.0.name"), "fc1.grad_output");

  auto b = make_delayed(sink, kShortHistory);
  b->load_state(v1);
  EXPECT_EQ(b->slot_names(),
            (std::vector<std::string>{"fc1.matmul.grad_output", "fc1.matmul.input",
                                      "fc1.matmul.weight", "head.matmul.grad_output",
                                      "head.matmul.input", "head.matmul.weight"}));
  EXPECT_EQ(b->applied_steps(), a->applied_steps());
  expect_same_scaling(*a, *b);
  for (const auto& name : a->slot_names()) {
    EXPECT_EQ(b->slot(name)->history.ring(), a->slot(name)->history.ring()) << name;
    EXPECT_EQ(b->slot(name)->history.position(), a->slot(name)->history.position()) << name;
  }
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info,
                            "policy fp8-delayed: the checkpoint's state has version 1, which named "
                            "scaling slots \"<layer>.<role>\"; renamed its 6 slots to "
                            "\"<layer>.matmul.<role>\" (version 2)"));
  // The resumed run goes on exactly as the uninterrupted one, and saves version 2.
  train(*a, 9, 100.0f);
  train(*b, 9, 100.0f);
  expect_same_scaling(*a, *b);
  EXPECT_EQ(b->save_state().version, 2);
  EXPECT_EQ(b->save_state().values, a->save_state().values);
}

TEST(fp8_delayed_state, SavedStateNamesEverySlotAndTheRecipe) {
  test::CapturingSink sink;
  auto a = make_delayed(sink, kShortHistory);
  train(*a, 3, 0.0f);
  const auto s = a->save_state();
  EXPECT_EQ(s.get<std::string>("fp8_format"), "hybrid");
  EXPECT_EQ(s.get<std::int64_t>("margin"), 0);
  EXPECT_EQ(s.get<std::int64_t>("amax_history_len"), 4);
  EXPECT_EQ(s.get<std::string>("amax_compute_algo"), "max");
  EXPECT_EQ(s.get<std::int64_t>("interval"), 2);
  EXPECT_EQ(s.get<std::string>("base"), "bf16-mixed");
  EXPECT_EQ(s.get<std::int64_t>("slots"), 6);
  EXPECT_EQ(s.get<std::string>("slot.0.name"), "fc1.matmul.grad_output");
  EXPECT_EQ(s.get<std::vector<float>>("slot.0.amax_history").size(), 4u);
  EXPECT_TRUE(s.has("slot.5.position"));
  EXPECT_TRUE(s.has("slot.5.scale"));
}

// Four completed steps with fc1.input amaxes 1, 2, 3, 4, saved from a ring of 6.
sdk::ComponentState state_with_history_1234(test::CapturingSink& sink) {
  auto a = make_delayed(sink, {{"amax_history_len", std::int64_t{6}}});
  for (float amax : {1.0f, 2.0f, 3.0f, 4.0f}) step(*a, amax);
  return a->save_state();
}

TEST(fp8_delayed_state, ShorterConfiguredHistoryKeepsTheMostRecentEntriesAndWarns) {
  test::CapturingSink sink;
  const auto state = state_with_history_1234(sink);
  auto b = make_delayed(sink, {{"amax_history_len", std::int64_t{3}}});
  b->load_state(state);
  const auto* s = b->slot("fc1.matmul.input");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->history.chronological(), (std::vector<float>{3.0f, 4.0f, 0.0f}));
  EXPECT_EQ(s->scale, 112.0f) << "the saved scale (448 / 4) is kept";
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn,
                            "checkpoint has amax_history_len 6, the config says 3; kept the most "
                            "recent 3 amaxes of each of 1 slots, dropped the 3 oldest"));
  step(*b, 0.5f);
  EXPECT_EQ(input_scale(*b), 112.0f) << "max over {3, 4, 0.5}";
  step(*b, 0.5f);
  step(*b, 0.5f);
  EXPECT_EQ(input_scale(*b), 896.0f) << "3 and 4 have aged out of the shorter ring";
}

TEST(fp8_delayed_state, LongerConfiguredHistoryPadsTheOldestSideWithZerosAndWarns) {
  test::CapturingSink sink;
  const auto state = state_with_history_1234(sink);
  auto b = make_delayed(sink, {{"amax_history_len", std::int64_t{8}}});
  b->load_state(state);
  EXPECT_EQ(b->slot("fc1.matmul.input")->history.chronological(),
            (std::vector<float>{0.0f, 0.0f, 0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 0.0f}));
  EXPECT_EQ(input_scale(*b), 112.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "kept the most recent 6 amaxes"));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "padded with zeros on the oldest side"));
}

TEST(fp8_delayed_state, ChangedMarginOrFormatRecomputesScalesFromTheHistory) {
  test::CapturingSink sink;
  const auto state = state_with_history_1234(sink);
  auto b = make_delayed(sink, {{"amax_history_len", std::int64_t{6}}, {"margin", std::int64_t{1}}});
  b->load_state(state);
  EXPECT_EQ(input_scale(*b), 56.0f) << "(448 / 4) / 2^1";
  EXPECT_EQ(b->operand_scaling(operand("fc1", OperandRole::input)).scale_inv, 1.0f / 56.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "checkpoint used margin 0, the config says 1"));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "scales were recomputed"));
}

// "most_recent" reads the last completed step's amax: the checkpoint, written after that step's
// roll, holds it one entry before the (empty) entry in progress. Recomputing from the empty entry
// kept the old constants' scale, 2^margin or fp8_max-ratio off for a step.
TEST(fp8_delayed_state, ChangedMarginUnderMostRecentRecomputesFromTheLastCompletedStep) {
  test::CapturingSink sink;
  auto recent = [](std::int64_t length, std::int64_t margin) {
    return Values{{"amax_history_len", length},
                  {"amax_compute_algo", std::string("most_recent")},
                  {"margin", margin}};
  };
  auto a = make_delayed(sink, recent(6, 0));
  for (float amax : {4.0f, 2.0f}) step(*a, amax);
  ASSERT_EQ(input_scale(*a), 224.0f) << "448 / 2, the most recent";
  auto b = make_delayed(sink, recent(6, 1));
  b->load_state(a->save_state());
  EXPECT_EQ(input_scale(*b), 112.0f) << "(448 / 2) / 2^1";
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "1 of the 1 scales were recomputed"));
  // A history of one entry keeps no completed amax: the saved scale stays, and the warning says so.
  auto c = make_delayed(sink, recent(1, 0));
  step(*c, 2.0f);
  auto d = make_delayed(sink, recent(1, 1));
  d->load_state(c->save_state());
  EXPECT_EQ(input_scale(*d), 224.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "1 kept the saved scale until the next update"));
}

TEST(fp8_delayed_state, MalformedStatesThrowCheckpointErrorAndChangeNothing) {
  test::CapturingSink sink;
  const auto good = state_with_history_1234(sink);
  auto b = make_delayed(sink, {{"amax_history_len", std::int64_t{6}}});
  b->load_state(good);
  ASSERT_EQ(input_scale(*b), 112.0f);

  auto broken = [&](auto mutate) {
    auto s = good;
    mutate(s);
    return checkpoint_error([&] { b->load_state(s); });
  };
  EXPECT_TRUE(
      has(broken([](auto& s) { s.values.erase("slot.0.scale"); }), "no entry 'slot.0.scale'"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values.erase("amax_history_len"); }),
                  "no entry 'amax_history_len'"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values["slot.0.position"] = std::int64_t{-1}; }),
                  "'slot.0.position' = -1 is outside [0, 5]"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values["slot.0.position"] = std::int64_t{6}; }),
                  "'slot.0.position' = 6 is outside [0, 5]"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values["slot.0.amax_history"] = std::vector<float>(5); }),
                  "holds 5 amaxes, but the state's amax_history_len is 6"));
  EXPECT_TRUE(has(broken([](auto& s) {
                    s.values["slot.0.amax_history"] = std::vector<float>{0, 0, -1, 0, 0, 0};
                  }),
                  "negative amax"));
  for (double bad : {0.0, -2.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN(), 1e39}) {
    EXPECT_TRUE(has(broken([&](auto& s) { s.values["slot.0.scale"] = bad; }),
                    "is not a positive finite float"))
        << bad;
  }
  EXPECT_TRUE(has(broken([](auto& s) { s.values["slot.0.scale"] = std::string("big"); }),
                  "'slot.0.scale' has an unexpected type"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values["slot.0.name"] = std::string("fc1"); }),
                  "is not a slot name"));
  EXPECT_TRUE(
      has(broken([](auto& s) { s.values["slots"] = std::int64_t{2}; }), "no entry 'slot.1.name'"));
  EXPECT_TRUE(has(broken([](auto& s) { s.version = 3; }), "version 3, this build reads 1..2"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values["slot.0.name"] = std::string("fc1.input"); }),
                  "is not a slot name \"<node>.<gemm>.<input|weight|grad_output>\""))
      << "version 2 names have a GEMM";
  EXPECT_TRUE(has(broken([](auto& s) {
                    s.version = 1;
                    s.values["slot.0.name"] = std::string("fc1.matmul");
                  }),
                  "is not a version-1 slot name"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values["fp8_format"] = std::string("e3m4"); }),
                  "'fp8_format' = 'e3m4'"));

  EXPECT_EQ(input_scale(*b), 112.0f) << "a failed load leaves the policy as it was";
  EXPECT_EQ(b->slot("fc1.matmul.input")->history.chronological().back(), 0.0f);
}

TEST(fp8_delayed_state, AnAppliedCountRestoredAtTheTopStopsThere) {
  // INT64_MAX is a valid saved count; the next applied step must not overflow it.
  test::CapturingSink sink;
  auto a = make_delayed(sink, kShortHistory);
  train(*a, 3, 0.0f);
  auto state = a->save_state();
  state.values["applied_steps"] = std::numeric_limits<std::int64_t>::max();
  auto b = make_delayed(sink, kShortHistory);
  b->load_state(state);
  train(*b, 3, 3.0f);
  EXPECT_EQ(b->applied_steps(), std::numeric_limits<std::int64_t>::max());
}

TEST(fp8_delayed_state, DuplicateSlotsAreRejected) {
  test::CapturingSink sink;
  auto a = make_delayed(sink, kShortHistory);
  train(*a, 2, 0.0f);
  auto s = a->save_state();
  s.values["slot.1.name"] = s.values["slot.0.name"];
  auto b = make_delayed(sink, kShortHistory);
  EXPECT_TRUE(has(checkpoint_error([&] { b->load_state(s); }), "appears twice"));
}

}  // namespace
}  // namespace mixtrain::fp8
