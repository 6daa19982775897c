// fp8-current: the scale of the amax recorded for the tensor being cast, the fallback to the
// previous cast, skipped steps, formats and checkpoints.
#include <gtest/gtest.h>

#include <limits>

#include "fp8_test_support.h"

namespace mixtrain::fp8 {
namespace {

using namespace testing;
using sdk::DType;

TEST(fp8_current, AmaxRecordedBeforeTheCastGivesThatTensorsOwnScale) {
  test::CapturingSink sink;
  auto p = make_current(sink);
  EXPECT_TRUE(p->uses_scaled_operands());
  // Host protocol for true current scaling: measure amax, record it, then ask and cast.
  p->record_amax(operand("fc1", OperandRole::input), 2.0f);
  auto in = p->operand_scaling(operand("fc1", OperandRole::input));
  EXPECT_EQ(in.dtype, DType::fp8_e4m3);
  EXPECT_EQ(in.scale, 224.0f);
  EXPECT_EQ(in.scale_inv, 1.0f / 224.0f);
  p->record_amax(operand("fc1", OperandRole::input), 0.5f);
  EXPECT_EQ(input_scale(*p), 896.0f) << "the same step, a new tensor: no max, no delay";

  p->record_amax(operand("fc1", OperandRole::grad_output), 4.0f);
  const auto go = p->operand_scaling(operand("fc1", OperandRole::grad_output));
  EXPECT_EQ(go.dtype, DType::fp8_e5m2);
  EXPECT_EQ(go.scale, 14336.0f);
}

TEST(fp8_current, WithoutAnAmaxFirstTheScaleIsThePreviousCasts) {
  test::CapturingSink sink;
  auto p = make_current(sink, {{"margin", std::int64_t{2}}});
  EXPECT_EQ(input_scale(*p), 1.0f) << "first cast ever: scale 1";
  step(*p, 2.0f);  // SDK order: ask, cast, record
  EXPECT_EQ(input_scale(*p), 56.0f) << "(448 / 2) / 2^2, from the previous cast";
}

TEST(fp8_current, ZeroInfAndNanAmaxKeepThePreviousScale) {
  test::CapturingSink sink;
  auto p = make_current(sink);
  step(*p, 2.0f);
  for (float bad :
       {0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    step(*p, bad);
    EXPECT_EQ(input_scale(*p), 224.0f) << bad;
  }
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "fc1.matmul.input: non-finite amax"));
}

TEST(fp8_current, SkippedStepsRestoreTheLastAppliedStep) {
  test::CapturingSink sink;
  auto p = make_current(sink);
  step(*p, 2.0f);
  const auto before = p->save_state();
  step(*p, 4.0f, /*applied=*/false);
  EXPECT_EQ(input_scale(*p), 224.0f);
  EXPECT_EQ(p->save_state().values, before.values);
}

TEST(fp8_current, E4m3FormatCastsGradientsToE4m3) {
  test::CapturingSink sink;
  auto p = make_current(sink, {{"fp8_format", std::string("e4m3")}});
  p->record_amax(operand("fc1", OperandRole::grad_output), 4.0f);
  const auto go = p->operand_scaling(operand("fc1", OperandRole::grad_output));
  EXPECT_EQ(go.dtype, DType::fp8_e4m3);
  EXPECT_EQ(go.scale, 112.0f);
}

TEST(fp8_current, StateRoundTripsWithScaleInvRecomputed) {
  test::CapturingSink sink;
  auto a = make_current(sink);
  step(*a, 2.0f);
  a->record_amax(operand("fc1", OperandRole::weight), 0.5f);
  a->on_step_end(true);
  const auto state = a->save_state();
  for (const auto& [key, value] : state.values) EXPECT_EQ(key.find("scale_inv"), std::string::npos);
  EXPECT_EQ(state.get<std::int64_t>("slots"), 2);

  auto b = make_current(sink);
  b->load_state(state);
  EXPECT_EQ(b->slot_names(), a->slot_names());
  for (auto role : {OperandRole::input, OperandRole::weight}) {
    EXPECT_EQ(b->operand_scaling(operand("fc1", role)).scale,
              a->operand_scaling(operand("fc1", role)).scale);
    EXPECT_EQ(b->operand_scaling(operand("fc1", role)).scale_inv,
              a->operand_scaling(operand("fc1", role)).scale_inv);
  }
  step(*a, 8.0f);
  step(*b, 8.0f);
  EXPECT_EQ(b->save_state().values, a->save_state().values);
}

TEST(fp8_current, MalformedStatesThrowCheckpointError) {
  test::CapturingSink sink;
  auto a = make_current(sink);
  step(*a, 2.0f);
  const auto good = a->save_state();
  auto b = make_current(sink);
  auto broken = [&](auto mutate) {
    auto s = good;
    mutate(s);
    return checkpoint_error([&] { b->load_state(s); });
  };
  EXPECT_TRUE(
      has(broken([](auto& s) { s.values.erase("slot.0.amax"); }), "no entry 'slot.0.amax'"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values["slot.0.amax"] = -1.0; }), "is negative"));
  EXPECT_TRUE(has(broken([](auto& s) { s.values["slot.0.scale"] = 0.0; }),
                  "is not a positive finite float"));
  EXPECT_TRUE(has(broken([](auto& s) { s.version = 7; }),
                  "policy 'fp8-current' state has version 7, this build reads 1..2"));
  EXPECT_EQ(input_scale(*b), 1.0f);
}

// A state as the previous version (1) wrote it: slots "<layer>.<role>".
TEST(fp8_current, AVersion1StateLoadsWithEachSlotRenamedToItsLinearsMatmul) {
  sdk::ComponentState v1;
  v1.version = 1;
  v1.values = {{"fp8_format", std::string("hybrid")},
               {"margin", std::int64_t{0}},
               {"base", std::string("bf16-mixed")},
               {"slots", std::int64_t{2}},
               {"slot.0.name", std::string("fc1.input")},
               {"slot.0.amax", 2.0},
               {"slot.0.scale", 224.0},
               {"slot.1.name", std::string("head.grad_output")},
               {"slot.1.amax", 4.0},
               {"slot.1.scale", 14336.0}};
  test::CapturingSink sink;
  auto p = make_current(sink);
  p->load_state(v1);
  EXPECT_EQ(p->slot_names(),
            (std::vector<std::string>{"fc1.matmul.input", "head.matmul.grad_output"}));
  EXPECT_EQ(input_scale(*p), 224.0f);
  const auto go = p->operand_scaling(operand("head", OperandRole::grad_output));
  EXPECT_EQ(go.dtype, DType::fp8_e5m2);
  EXPECT_EQ(go.scale, 14336.0f);
  EXPECT_EQ(go.scale_inv, 1.0f / 14336.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "renamed its 2 slots"));
  const auto saved = p->save_state();
  EXPECT_EQ(saved.version, 2);
  EXPECT_EQ(saved.get<std::string>("slot.0.name"), "fc1.matmul.input");
}

}  // namespace
}  // namespace mixtrain::fp8
