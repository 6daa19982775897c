// fp8-delayed: the scale formula, both amax algorithms over the history, the roll, non-finite
// and zero amaxes, interval, skipped steps, per-role formats, the plan and adapt_to.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "fp8_test_support.h"

namespace mixtrain::fp8 {
namespace {

using namespace testing;
using sdk::DType;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(fp8_scale_formula, FpMaxOverAmaxOverTwoToTheMargin) {
  EXPECT_EQ(compute_scale(448.0f, DType::fp8_e4m3, 0), 1.0f);
  EXPECT_EQ(compute_scale(1.0f, DType::fp8_e4m3, 0), 448.0f);
  EXPECT_EQ(compute_scale(1.0f, DType::fp8_e4m3, 2), 112.0f);
  EXPECT_EQ(compute_scale(2.0f, DType::fp8_e4m3, 2), 56.0f);
  EXPECT_EQ(compute_scale(57344.0f, DType::fp8_e5m2, 0), 1.0f);
  EXPECT_EQ(compute_scale(2.0f, DType::fp8_e5m2, 0), 28672.0f);
  EXPECT_EQ(compute_scale(2.0f, DType::fp8_e5m2, 2), 7168.0f);
  EXPECT_EQ(compute_scale(3.0f, DType::fp8_e4m3, 0), static_cast<float>(448.0 / 3.0));
}

TEST(fp8_scale_formula, NoScaleForZeroInfNanAndClampedForTinyAmax) {
  EXPECT_FALSE(compute_scale(0.0f, DType::fp8_e4m3, 0));
  EXPECT_FALSE(compute_scale(kInf, DType::fp8_e4m3, 0));
  EXPECT_FALSE(compute_scale(kNaN, DType::fp8_e5m2, 0));
  EXPECT_FALSE(compute_scale(-1.0f, DType::fp8_e4m3, 0));
  EXPECT_EQ(compute_scale(1e-40f, DType::fp8_e5m2, 0), FLT_MAX) << "an infinite scale is clamped";
  EXPECT_GT(*compute_scale(FLT_MAX, DType::fp8_e4m3, 32), 0.0f) << "never a zero scale";
}

TEST(fp8_delayed, ScaleFollowsTheFormulaPerRoleAndMargin) {
  for (int margin : {0, 2}) {
    test::CapturingSink sink;
    auto p = make_delayed(sink, {{"margin", std::int64_t{margin}}});
    const float divisor = static_cast<float>(1 << margin);
    p->record_amax(operand("fc1", OperandRole::input), 2.0f);
    p->record_amax(operand("fc1", OperandRole::weight), 0.5f);
    p->record_amax(operand("fc1", OperandRole::grad_output), 4.0f);
    const auto before = p->operand_scaling(operand("fc1", OperandRole::input));
    EXPECT_EQ(before.scale, 1.0f) << "delayed: this step's amax is used from the next step";
    p->on_step_end(true);

    const auto in = p->operand_scaling(operand("fc1", OperandRole::input));
    EXPECT_EQ(in.dtype, DType::fp8_e4m3);
    EXPECT_EQ(in.scale, 224.0f / divisor);
    EXPECT_EQ(in.scale_inv, 1.0f / (224.0f / divisor));
    EXPECT_EQ(p->operand_scaling(operand("fc1", OperandRole::weight)).scale, 896.0f / divisor);
    const auto go = p->operand_scaling(operand("fc1", OperandRole::grad_output));
    EXPECT_EQ(go.dtype, DType::fp8_e5m2);
    EXPECT_EQ(go.scale, 14336.0f / divisor);
    EXPECT_EQ(go.scale_inv, 1.0f / (14336.0f / divisor));
  }
}

TEST(fp8_delayed, FormatsChooseTheDtypePerRole) {
  test::CapturingSink sink;
  auto hybrid = make_delayed(sink);
  EXPECT_EQ(hybrid->operand_scaling(operand("fc1", OperandRole::input)).dtype, DType::fp8_e4m3);
  EXPECT_EQ(hybrid->operand_scaling(operand("fc1", OperandRole::weight)).dtype, DType::fp8_e4m3);
  EXPECT_EQ(hybrid->operand_scaling(operand("fc1", OperandRole::grad_output)).dtype,
            DType::fp8_e5m2);

  auto e4m3 = make_delayed(sink, {{"fp8_format", std::string("e4m3")}});
  EXPECT_EQ(e4m3->operand_scaling(operand("fc1", OperandRole::grad_output)).dtype, DType::fp8_e4m3);
  e4m3->record_amax(operand("fc1", OperandRole::grad_output), 4.0f);
  e4m3->on_step_end(true);
  EXPECT_EQ(e4m3->operand_scaling(operand("fc1", OperandRole::grad_output)).scale, 112.0f)
      << "E4M3's 448, not E5M2's 57344";
}

TEST(fp8_delayed, SlotsAreCreatedLazilyAndNamedLayerDotRole) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, {{"amax_history_len", std::int64_t{16}}});
  EXPECT_TRUE(p->slot_names().empty());
  p->operand_scaling(operand("fc1", OperandRole::input));
  p->record_amax(operand("head", OperandRole::grad_output), 1.0f);
  EXPECT_EQ(p->slot_names(),
            (std::vector<std::string>{"fc1.matmul.input", "head.matmul.grad_output"}));
  const auto* s = p->slot("fc1.matmul.input");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->history.length(), 16u);
  EXPECT_EQ(s->history.max(), 0.0f);
  EXPECT_EQ(s->scale, 1.0f);
  EXPECT_EQ(s->scale_inv, 1.0f);
}

TEST(fp8_delayed, MaxAlgoUsesTheWholeHistory) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, {{"amax_history_len", std::int64_t{3}}});
  std::vector<float> scales;
  for (float amax : {8.0f, 2.0f, 1.0f, 1.0f, 1.0f}) {
    step(*p, amax);
    scales.push_back(input_scale(*p));
  }
  // The ring holds the step in progress and two completed ones: 8 ages out after step 3.
  EXPECT_EQ(scales, (std::vector<float>{56.0f, 56.0f, 56.0f, 224.0f, 448.0f}));
}

TEST(fp8_delayed, MostRecentAlgoUsesTheLastStepOnly) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, {{"amax_history_len", std::int64_t{3}},
                               {"amax_compute_algo", std::string("most_recent")}});
  std::vector<float> scales;
  for (float amax : {8.0f, 2.0f, 1.0f, 1.0f}) {
    step(*p, amax);
    scales.push_back(input_scale(*p));
  }
  EXPECT_EQ(scales, (std::vector<float>{56.0f, 224.0f, 448.0f, 448.0f}));
}

TEST(fp8_delayed, HistoryRollsOncePerAppliedStepAndKeepsItsLength) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, {{"amax_history_len", std::int64_t{4}}});
  for (float amax : {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}) {
    p->record_amax(operand("fc1", OperandRole::input), amax);
    p->record_amax(operand("fc1", OperandRole::input), amax / 2);  // a second cast in the same step
    p->on_step_end(true);
  }
  const auto& h = p->slot("fc1.matmul.input")->history;
  EXPECT_EQ(h.length(), 4u);
  EXPECT_EQ(h.position(), 6u % 4u);
  EXPECT_EQ(h.chronological(), (std::vector<float>{4.0f, 5.0f, 6.0f, 0.0f}));
  EXPECT_EQ(p->applied_steps(), 6);
}

TEST(fp8_delayed, ZeroInfAndNanAmaxKeepThePreviousScale) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, {{"amax_history_len", std::int64_t{1}}});
  step(*p, 2.0f);
  ASSERT_EQ(input_scale(*p), 224.0f);
  p->on_step_end(true);  // no cast at all: amax 0
  EXPECT_EQ(input_scale(*p), 224.0f);
  step(*p, 0.0f);
  EXPECT_EQ(input_scale(*p), 224.0f);
  step(*p, kInf);
  EXPECT_EQ(input_scale(*p), 224.0f);
  step(*p, kNaN);
  EXPECT_EQ(input_scale(*p), 224.0f);
  EXPECT_EQ(p->operand_scaling(operand("fc1", OperandRole::input)).scale_inv, 1.0f / 224.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn, "fc1.matmul.input: non-finite amax"));
  step(*p, 4.0f);
  EXPECT_EQ(input_scale(*p), 112.0f);
}

TEST(fp8_delayed, NanInTheHistoryIsSkippedByTheFusedMax) {
  test::CapturingSink sink;
  auto p = make_delayed(sink, {{"amax_history_len", std::int64_t{2}}});
  step(*p, 2.0f);
  step(*p, kNaN);
  EXPECT_EQ(input_scale(*p), 224.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn,
                            "fc1.matmul.input: non-finite amax nan observed; the max over the amax "
                            "history skips it"));
  step(*p, 4.0f);
  EXPECT_EQ(input_scale(*p), 112.0f) << "fmaxf(NaN, 4) is 4";
}

TEST(fp8_delayed, NanInTheHistoryFreezesTheUnfusedMaxScaleUntilItAgesOut) {
  test::CapturingSink sink;
  auto p = make_delayed(
      sink, {{"amax_history_len", std::int64_t{2}}, {"amax_update", std::string("unfused")}});
  step(*p, 2.0f);
  step(*p, kNaN);
  EXPECT_EQ(input_scale(*p), 224.0f);
  EXPECT_TRUE(
      sink.contains(sdk::LogLevel::warn,
                    "fc1.matmul.input: non-finite amax nan observed; the scale stays at 224 "
                    "while it is in the amax history"));
  step(*p, 4.0f);
  EXPECT_EQ(input_scale(*p), 224.0f) << "max(NaN, 4) is NaN";
  step(*p, 4.0f);
  EXPECT_EQ(input_scale(*p), 112.0f);
}

TEST(fp8_delayed, IntervalRecomputesEveryNthAppliedStepButRollsEveryStep) {
  test::CapturingSink sink;
  auto p = make_delayed(
      sink, {{"interval", std::int64_t{3}}, {"amax_compute_algo", std::string("most_recent")}});
  std::vector<float> scales;
  for (float amax : {1.0f, 1.0f, 1.0f, 2.0f, 2.0f, 2.0f}) {
    step(*p, amax);
    scales.push_back(input_scale(*p));
  }
  EXPECT_EQ(scales, (std::vector<float>{1.0f, 1.0f, 448.0f, 448.0f, 448.0f, 224.0f}));
  EXPECT_EQ(p->slot("fc1.matmul.input")->history.position(), 6u);
}

TEST(fp8_delayed, SkippedStepsChangeNothing) {
  test::CapturingSink sink;
  auto p =
      make_delayed(sink, {{"amax_history_len", std::int64_t{8}}, {"interval", std::int64_t{2}}});
  step(*p, 4.0f);
  const auto before = p->save_state();
  step(*p, 100.0f, /*applied=*/false);
  step(*p, 200.0f, /*applied=*/false);
  const auto after = p->save_state();
  EXPECT_EQ(after.values, before.values) << "history, position, scale and step count untouched";
  EXPECT_EQ(p->applied_steps(), 1);
  step(*p, 2.0f);  // second applied step: recompute from the history {4, 2}, not 100 or 200
  EXPECT_EQ(input_scale(*p), 112.0f);
}

TEST(fp8_delayed, LogsEachScaleUpdateAtDebugLevel) {
  test::CapturingSink sink;
  auto p = make_delayed(sink);
  step(*p, 2.0f);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::debug, "fc1.matmul.input: amax 2 -> scale 224 (was 1)"));
}

TEST(fp8_delayed, PlansFp8GemmsOverTheBaseRecipe) {
  test::CapturingSink sink;
  auto p = make_delayed(sink);
  EXPECT_TRUE(p->uses_scaled_operands());
  EXPECT_FALSE(p->needs_loss_scaling());
  const auto linear = p->plan(linear_op());
  EXPECT_EQ(linear.gemm_input, DType::fp8_e4m3);
  EXPECT_EQ(linear.weight, DType::bf16);
  EXPECT_EQ(linear.activation, DType::bf16);
  EXPECT_EQ(linear.activation_grad, DType::bf16);
  const auto relu = p->plan(op_without_gemm("relu"));
  EXPECT_EQ(relu.gemm_input, DType::fp32);
  EXPECT_EQ(relu.weight, DType::fp32);
  EXPECT_EQ(relu.activation, DType::bf16);
  // A precision-sensitive op is planned like any op without GEMMs: the host pins it to FP32.
  const auto ln = p->plan(op_without_gemm("layernorm", /*sensitive=*/true));
  EXPECT_EQ(ln.gemm_input, relu.gemm_input);
  EXPECT_EQ(ln.activation, relu.activation);

  auto fp16 = make_delayed(sink, {{"base", std::string("fp16-mixed")}});
  EXPECT_TRUE(fp16->needs_loss_scaling());
  EXPECT_EQ(fp16->plan(linear_op()).weight, DType::fp16);
  auto fp32 = make_delayed(sink, {{"base", std::string("fp32")}});
  const auto f = fp32->plan(linear_op());
  EXPECT_EQ(f.weight, DType::fp32);
  EXPECT_EQ(f.gemm_input, DType::fp8_e4m3);
  EXPECT_EQ(f.activation, DType::fp32);
}

TEST(fp8_delayed, AdaptToRejectsABackendWithoutE5m2UnderHybrid) {
  test::CapturingSink sink;
  sdk::BackendCapabilities caps;
  caps.kind = "cpu";
  caps.gemm_inputs = {{DType::fp32, true, ""}, {DType::fp8_e4m3, false, "emulated"}};
  auto hybrid = make_delayed(sink);
  try {
    hybrid->adapt_to(caps);
    ADD_FAILURE() << "no BackendError";
  } catch (const sdk::BackendError& e) {
    EXPECT_TRUE(has(e.what(), "fp8_e5m2")) << e.what();
    EXPECT_TRUE(has(e.hint(), "fp8_format = \"e4m3\"")) << e.hint();
  }
  auto e4m3 = make_delayed(sink, {{"fp8_format", std::string("e4m3")}});
  EXPECT_NO_THROW(e4m3->adapt_to(caps));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "emulates fp8_e4m3"));
}

}  // namespace
}  // namespace mixtrain::fp8
