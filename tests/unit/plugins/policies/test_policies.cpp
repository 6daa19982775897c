// The precision policies' plans: recipe per GEMM / element-wise op, precision-sensitive ops left
// to the host, and `auto` choosing from the backend's capabilities.
#include <gtest/gtest.h>

#include "plugin_test_support.h"
#include "table_precision_policy.h"

namespace mixtrain::policies {
namespace {

using sdk::DType;

sdk::PluginContext context(test::CapturingSink& sink) {
  return {sdk::Logger(&sink, "policy.test"), "policies", "test"};
}

using sdk::OperandRole;

sdk::OpDescription linear() {
  return {"fc1",
          "linear",
          8,
          16,
          {{"matmul", {OperandRole::input, OperandRole::weight, OperandRole::grad_output}}},
          false};
}
sdk::OpDescription relu() {
  return {"relu1", "relu", 16, 16, {}, false};
}
sdk::OpDescription layernorm() {
  return {"ln", "layernorm", 16, 16, {}, true};
}

TEST(policies_plans, MixedPoliciesPutGemmsAndActivationsIn16Bits) {
  test::CapturingSink sink;
  Bf16MixedPolicy bf16({}, context(sink));
  auto p = bf16.plan(linear());
  EXPECT_EQ(p.weight, DType::bf16);
  EXPECT_EQ(p.gemm_input, DType::bf16);
  EXPECT_EQ(p.activation, DType::bf16);
  EXPECT_EQ(p.activation_grad, DType::bf16);
  EXPECT_FALSE(bf16.needs_loss_scaling());

  Fp16MixedPolicy fp16({}, context(sink));
  auto r = fp16.plan(relu());
  EXPECT_EQ(r.weight, DType::fp32) << "no GEMM, no working weights";
  EXPECT_EQ(r.activation, DType::fp16);
  EXPECT_EQ(r.activation_grad, DType::fp16);
  EXPECT_TRUE(fp16.needs_loss_scaling());
}

// Pinning is the host's job (core's precision planning, tested there): the policy plans a
// precision-sensitive op like any other op without GEMMs, and keeps no list of op kinds.
TEST(policies_plans, PlanASensitiveOpLikeAnyOtherOpWithoutGemms) {
  test::CapturingSink sink;
  Bf16MixedPolicy bf16({}, context(sink));
  const auto ln = bf16.plan(layernorm());
  const auto r = bf16.plan(relu());
  EXPECT_EQ(ln.weight, r.weight);
  EXPECT_EQ(ln.gemm_input, r.gemm_input);
  EXPECT_EQ(ln.activation, r.activation);
  EXPECT_EQ(ln.activation_grad, r.activation_grad);
}

TEST(policies_plans, AnOpKindThePolicyHasNeverHeardOfIsPlannedFromItsGemms) {
  test::CapturingSink sink;
  Fp16MixedPolicy fp16({}, context(sink));
  sdk::OpDescription attention{"attn",
                               "attention",
                               64,
                               64,
                               {{"qkv", {OperandRole::input, OperandRole::weight}},
                                {"scores", {OperandRole::input, OperandRole::grad_output}}},
                               false};
  const auto p = fp16.plan(attention);
  EXPECT_EQ(p.weight, DType::fp16);
  EXPECT_EQ(p.gemm_input, DType::fp16);
}

TEST(policies_plans, Tf32RoundsOnlyGemmInputs) {
  test::CapturingSink sink;
  Tf32Policy tf32({}, context(sink));
  auto p = tf32.plan(linear());
  EXPECT_EQ(p.gemm_input, DType::tf32);
  EXPECT_EQ(p.weight, DType::fp32);
  EXPECT_EQ(p.activation, DType::fp32);
  EXPECT_FALSE(tf32.needs_loss_scaling());
}

// Fake capabilities, so the outcome never depends on the CPU running the test (AVX2 only,
// AVX512-BF16 or AMX).
sdk::BackendCapabilities capabilities(bool bf16_native, bool fp16_native) {
  sdk::BackendCapabilities caps;
  caps.kind = "fake";
  caps.gemm_inputs = {{DType::fp32, true, ""},
                      {DType::bf16, bf16_native, bf16_native ? "native" : "emulated"},
                      {DType::fp16, fp16_native, fp16_native ? "native" : "emulated"}};
  return caps;
}

TEST(policies_auto, ChoosesBf16WhereTheBackendRunsItNatively) {
  for (bool fp16_native : {false, true}) {
    test::CapturingSink sink;
    AutoPrecisionPolicy a({}, context(sink));
    a.adapt_to(capabilities(/*bf16_native=*/true, fp16_native));
    EXPECT_EQ(a.recipe().name, "bf16-mixed");
    EXPECT_EQ(a.plan(linear()).gemm_input, DType::bf16);
    EXPECT_FALSE(a.needs_loss_scaling());
    EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "auto policy chose bf16-mixed"));
  }
}

TEST(policies_auto, ChoosesFp16WhereOnlyFp16IsNative) {
  test::CapturingSink sink;
  AutoPrecisionPolicy a({}, context(sink));
  a.adapt_to(capabilities(/*bf16_native=*/false, /*fp16_native=*/true));
  EXPECT_EQ(a.recipe().name, "fp16-mixed");
  EXPECT_EQ(a.plan(linear()).gemm_input, DType::fp16);
  EXPECT_TRUE(a.needs_loss_scaling()) << "fp16 needs a scaler; check warns without one";
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "auto policy chose fp16-mixed"));
}

TEST(policies_auto, StaysFp32WhereEvery16BitFormatIsEmulated) {
  test::CapturingSink sink;
  AutoPrecisionPolicy a({}, context(sink));
  a.adapt_to(capabilities(/*bf16_native=*/false, /*fp16_native=*/false));
  EXPECT_EQ(a.recipe().name, "fp32");
  const auto p = a.plan(linear());
  EXPECT_EQ(p.weight, DType::fp32);
  EXPECT_EQ(p.gemm_input, DType::fp32);
  EXPECT_EQ(p.activation, DType::fp32);
  EXPECT_FALSE(a.needs_loss_scaling());
  EXPECT_TRUE(
      sink.contains(sdk::LogLevel::info,
                    "auto policy chose fp32: the fake backend runs no 16-bit GEMM natively"));
  EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "name a policy"))
      << "the line says how to get an emulated policy";
}

TEST(policies_auto, LogsExactlyOneLineAboutItsChoice) {
  test::CapturingSink sink;
  AutoPrecisionPolicy a({}, context(sink));
  a.adapt_to(capabilities(false, false));
  int count = 0;
  for (const auto& line : sink.lines)
    count += line.message.find("auto policy chose") != std::string::npos;
  EXPECT_EQ(count, 1);
}

}  // namespace
}  // namespace mixtrain::policies
