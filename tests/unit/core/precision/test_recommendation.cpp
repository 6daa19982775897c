// The calibration rules on synthetic measurements: a tensor that saturates fp16 sends its op to
// fp32; gradients that flush at scale 1 call for a dynamic scaler whose init_scale follows from
// the largest gradient amax; an FP8 GEMM whose operands are safe stays fp8 while one whose amax
// jumps between steps goes to bf16; precision-sensitive ops are never overridden. The measurements
// are made by measure_range on generated tensors, so the rules see what calibration would.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/precision/calibration_table.h"
#include "mixtrain/core/precision/recommendation.h"

namespace mixtrain::core {
namespace {

using sdk::DType;

// n values spread evenly in log space over [lo, hi] (both > 0).
std::vector<float> logspace(double lo, double hi, std::size_t n = 1000) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(lo * std::pow(hi / lo, static_cast<double>(i) / (n - 1)));
  return v;
}

// Measurements over steps, one tensor per step.
RangeStatistics over_steps(const std::vector<std::vector<float>>& steps, bool gradient) {
  RangeStatistics total = measure_range(steps.at(0), gradient);
  for (std::size_t k = 1; k < steps.size(); ++k) merge(total, measure_range(steps[k], gradient));
  return total;
}

sdk::OpPrecision all(DType d) {
  return {d, d, d, d};
}

OpCalibration linear(const std::string& name, sdk::OpPrecision planned) {
  OpCalibration op;
  op.node = name;
  op.type = "linear";
  op.has_gemm = true;
  op.planned = planned;
  return op;
}

void add(OpCalibration& op, CalibratedTensor t, RangeStatistics s) {
  op.tensors.push_back({t, std::move(s)});
}

const OpRecommendation& find(const Recommendation& r, const std::string& node) {
  for (const auto& o : r.ops)
    if (o.node == node) return o;
  throw std::runtime_error("no recommendation for " + node);
}

// An op whose tensors are well inside fp16's range (activations ~[1e-3, 10], gradients as given).
OpCalibration healthy(const std::string& name, sdk::OpPrecision planned, double grad_lo,
                      double grad_hi) {
  OpCalibration op = linear(name, planned);
  add(op, CalibratedTensor::gemm_input, over_steps({logspace(1e-3, 10.0)}, false));
  add(op, CalibratedTensor::weight, over_steps({logspace(1e-3, 0.5)}, false));
  add(op, CalibratedTensor::activation, over_steps({logspace(1e-3, 10.0)}, false));
  add(op, CalibratedTensor::activation_grad, over_steps({logspace(grad_lo, grad_hi)}, true));
  add(op, CalibratedTensor::output_grad, over_steps({logspace(grad_lo, grad_hi)}, true));
  return op;
}

// A calibration of one step under fp16-mixed (which needs loss scaling), its ops to be added.
Calibration fp16_calibration() {
  Calibration c;
  c.policy = "fp16-mixed";
  c.policy_needs_loss_scaling = true;
  c.steps = 1;
  return c;
}

TEST(CalibrationRecommendation, ATensorThatSaturatesFp16GoesToFp32) {
  Calibration c = fp16_calibration();
  c.ops.push_back(healthy("fc1", all(DType::fp16), 1e-3, 1e-1));
  OpCalibration big = healthy("fc2", all(DType::fp16), 1e-3, 1e-1);
  big.tensors[2].stats = over_steps({logspace(1.0, 1e5)}, false);  // activation past 65504
  c.ops.push_back(big);
  const Recommendation r = recommend(c);
  EXPECT_EQ(find(r, "fc1").recommended, DType::fp16);
  EXPECT_TRUE(find(r, "fc1").fields.empty());
  const OpRecommendation& fc2 = find(r, "fc2");
  EXPECT_EQ(fc2.planned, DType::fp16);
  EXPECT_EQ(fc2.recommended, DType::fp32);
  ASSERT_EQ(fc2.fields.size(), 1u);
  EXPECT_EQ(fc2.fields[0].first, "compute");
  EXPECT_EQ(fc2.fields[0].second, DType::fp32);
  EXPECT_NE(fc2.reason.find("activation saturates"), std::string::npos) << fc2.reason;
  // bf16 has the range: the same tensor under bf16-mixed keeps the plan.
  c.policy = "bf16-mixed";
  c.policy_needs_loss_scaling = false;
  for (auto& op : c.ops) op.planned = all(DType::bf16);
  EXPECT_EQ(find(recommend(c), "fc2").recommended, DType::bf16);
}

TEST(CalibrationRecommendation, GradientsThatFlushAtScaleOneGetADynamicScalerWithTheComputedScale) {
  Calibration c = fp16_calibration();
  // Gradients around 1e-10: all flush in fp16 unscaled; the largest gradient amax is 3e-3.
  c.ops.push_back(healthy("fc1", all(DType::fp16), 1e-11, 1e-9));
  c.ops.push_back(healthy("fc2", all(DType::fp16), 1e-6, 3e-3));
  const Recommendation r = recommend(c);
  ASSERT_TRUE(r.scaler.applies);
  ASSERT_TRUE(r.scaler.needed) << r.scaler.reason;
  // The largest power of two S with 3e-3 · S · 2 < 65504.
  int expected = 0;
  while (expected < kLossScaleCapLog2 &&
         std::ldexp(static_cast<double>(c.ops[1].tensors[3].stats.amax),
                    expected + 1 + kLossScaleMarginLog2) < 65504.0)
    ++expected;
  EXPECT_EQ(r.scaler.scale_log2, expected);
  EXPECT_LT(std::ldexp(3e-3, r.scaler.scale_log2 + kLossScaleMarginLog2), 65504.0);
  EXPECT_GE(std::ldexp(3e-3, r.scaler.scale_log2 + 1 + kLossScaleMarginLog2), 65504.0);
  // At that scale fc1's gradients (>= 1e-11 · 2^23 ≈ 8e-5) fit fp16: no fp32 needed.
  EXPECT_EQ(find(r, "fc1").recommended, DType::fp16) << find(r, "fc1").reason;

  const std::string toml = recommendation_toml(r, {"header"});
  EXPECT_NE(toml.find("[scaler]\ntype = \"dynamic\""), std::string::npos) << toml;
  EXPECT_NE(toml.find("[scaler.dynamic]\ninit_scale = " +
                      sdk::option_value_to_string(std::ldexp(1.0, r.scaler.scale_log2))),
            std::string::npos)
      << toml;

  // Gradients so small that even 2^S leaves them flushing: that op goes to fp32.
  c.ops.push_back(healthy("fc0", all(DType::fp16), 1e-22, 1e-20));
  const Recommendation deeper = recommend(c);
  EXPECT_EQ(find(deeper, "fc0").recommended, DType::fp32) << find(deeper, "fc0").reason;
  EXPECT_NE(find(deeper, "fc0").reason.find("at loss scale 2^"), std::string::npos);

  // Gradients that fit unscaled: no scaler, and the file says so without a [scaler] table.
  Calibration fine;
  fine.policy = "fp16-mixed";
  fine.policy_needs_loss_scaling = true;
  fine.ops.push_back(healthy("fc1", all(DType::fp16), 1e-4, 1e-1));
  const Recommendation none = recommend(fine);
  EXPECT_FALSE(none.scaler.needed);
  EXPECT_NE(none.scaler.reason.find("no loss scale needed"), std::string::npos);
  EXPECT_EQ(recommendation_toml(none, {}).find("[scaler]"), std::string::npos);
}

TEST(CalibrationRecommendation, AnFp8SafeGemmStaysFp8AndOneWithAJumpingAmaxGoesToBf16) {
  const sdk::OpPrecision fp8_plan = {DType::bf16, DType::fp8_e4m3, DType::bf16, DType::bf16};
  Calibration c;
  c.policy = "fp8-delayed";
  c.steps = 4;
  auto steady = [](double hi) {
    return std::vector<std::vector<float>>{logspace(hi / 50, hi), logspace(hi / 50, hi * 1.1),
                                           logspace(hi / 50, hi * 0.9),
                                           logspace(hi / 50, hi * 1.2)};
  };
  auto op_with_inputs = [&](const std::string& name,
                            const std::vector<std::vector<float>>& inputs) {
    OpCalibration op = linear(name, fp8_plan);
    add(op, CalibratedTensor::gemm_input, over_steps(inputs, false));
    add(op, CalibratedTensor::weight, over_steps(steady(0.2), false));
    add(op, CalibratedTensor::activation, over_steps(steady(4.0), false));
    add(op, CalibratedTensor::activation_grad, over_steps(steady(1e-3), true));
    add(op, CalibratedTensor::output_grad, over_steps(steady(1e-3), true));
    return op;
  };
  c.ops.push_back(op_with_inputs("steady", steady(3.0)));
  // The third step's amax is 5x the largest before it: delayed scaling would saturate.
  c.ops.push_back(op_with_inputs("jumpy", {logspace(0.06, 3.0), logspace(0.06, 3.0),
                                           logspace(0.3, 15.0), logspace(0.06, 3.0)}));
  OpCalibration norm;
  norm.node = "norm";
  norm.type = "layernorm";
  norm.precision_sensitive = true;
  norm.planned = all(DType::fp32);
  add(norm, CalibratedTensor::activation, over_steps({logspace(1e-30, 1e30)}, false));
  c.ops.push_back(norm);
  // A layer norm whose output the planner stores in bf16 for its bf16 GEMM readers: left as
  // planned, and the reason says so.
  OpCalibration stored = norm;
  stored.node = "stored";
  stored.planned.activation = DType::bf16;
  c.ops.push_back(stored);

  const Recommendation r = recommend(c);
  EXPECT_EQ(find(r, "steady").planned, DType::fp8_e4m3);
  EXPECT_EQ(find(r, "steady").recommended, DType::fp8_e4m3) << find(r, "steady").reason;
  EXPECT_TRUE(find(r, "steady").fields.empty());
  const OpRecommendation& jumpy = find(r, "jumpy");
  EXPECT_EQ(jumpy.recommended, DType::bf16) << jumpy.reason;
  EXPECT_NE(jumpy.reason.find("amax grows 5"), std::string::npos) << jumpy.reason;
  EXPECT_NE(jumpy.reason.find("step 3"), std::string::npos) << jumpy.reason;
  // Only the fp8 field is raised: the bf16 base of the plan stays.
  ASSERT_EQ(jumpy.fields.size(), 1u);
  EXPECT_EQ(jumpy.fields[0].first, "gemm_input");
  EXPECT_EQ(jumpy.fields[0].second, DType::bf16);
  EXPECT_EQ(find(r, "norm").recommended, DType::fp32);
  EXPECT_TRUE(find(r, "norm").fields.empty());
  EXPECT_EQ(find(r, "norm").reason, "precision-sensitive: always fp32");
  EXPECT_EQ(find(r, "stored").recommended, DType::bf16);
  EXPECT_TRUE(find(r, "stored").fields.empty());
  EXPECT_EQ(find(r, "stored").reason,
            "precision-sensitive: fp32 math, its output stored in bf16 for its bf16 GEMM readers");
  EXPECT_FALSE(r.scaler.applies);

  const std::string toml = recommendation_toml(r, {"calibrated"});
  EXPECT_EQ(toml.rfind("# calibrated\n[precision]\npolicy = \"fp8-delayed\"\n", 0), 0u) << toml;
  EXPECT_NE(toml.find("[[precision.override]]\nlayers = \"jumpy\"\ngemm_input = \"bf16\"\n"),
            std::string::npos)
      << toml;
  EXPECT_EQ(toml.find("\"steady\""), std::string::npos) << toml;
  EXPECT_EQ(toml, recommendation_toml(recommend(c), {"calibrated"}));
  // The table names every op and tensor, one line each.
  const std::string table = calibration_table(c, r);
  EXPECT_NE(table.find("jumpy"), std::string::npos);
  EXPECT_NE(table.find("x5.00"), std::string::npos) << table;
}

// Gradients over 7 decades fit e5m2 with a per-tensor scale (the hybrid format's gradient
// operand) but flush in e4m3, which fp8_format = "e4m3" casts them to: judged in that format.
TEST(CalibrationRecommendation, Fp8GradientsAreJudgedInTheFormatThePolicyCastsThemTo) {
  const sdk::OpPrecision fp8_plan = {DType::bf16, DType::fp8_e4m3, DType::bf16, DType::bf16};
  Calibration c;
  c.policy = "fp8-delayed";
  c.steps = 1;
  OpCalibration op = linear("wide_grads", fp8_plan);
  add(op, CalibratedTensor::gemm_input, over_steps({logspace(0.06, 3.0)}, false));
  add(op, CalibratedTensor::weight, over_steps({logspace(4e-3, 0.2)}, false));
  add(op, CalibratedTensor::output_grad, over_steps({logspace(1e-10, 1e-3)}, true));
  c.ops.push_back(op);
  const Recommendation hybrid = recommend(c);
  EXPECT_EQ(find(hybrid, "wide_grads").recommended, DType::fp8_e4m3);
  c.fp8_gradient = DType::fp8_e4m3;
  const Recommendation e4m3 = recommend(c);
  const auto& raised = find(e4m3, "wide_grads");
  EXPECT_EQ(raised.recommended, DType::bf16) << raised.reason;
  EXPECT_NE(raised.reason.find("output_grad flushes"), std::string::npos) << raised.reason;
}

// Under a block-scaled policy the low rung is the block format, not "fp8": nvfp4's elements are
// E2M1. The reason, the table and the file's comment name it so, while a per-tensor FP8 policy's
// rung stays "fp8".
TEST(CalibrationRecommendation, ABlockScaledRungIsNamedAfterItsFormat) {
  const sdk::OpPrecision fp8_plan = {DType::bf16, DType::fp8_e4m3, DType::bf16, DType::bf16};
  Calibration c;
  c.policy = "nvfp4";
  c.block_format = BlockFormat::nvfp4;
  c.steps = 1;
  OpCalibration op = linear("fc", fp8_plan);
  op.block_path = true;
  BlockRangeStatistics flushing;
  flushing.nonzero = 1000;
  for (std::size_t f = 0; f < kBlockFormats.size(); ++f) flushing.per_block[f].flushed = 150;
  op.tensors.push_back(
      {CalibratedTensor::gemm_input, measure_range(logspace(0.06, 3.0), false), flushing});
  c.ops.push_back(op);
  const Recommendation r = recommend(c);
  const OpRecommendation& fc = find(r, "fc");
  EXPECT_EQ(fc.recommended, DType::bf16) << fc.reason;
  ASSERT_TRUE(fc.block_format.has_value());
  EXPECT_EQ(fc.reason.rfind("nvfp4: gemm_input flushes 15%", 0), 0u) << fc.reason;
  EXPECT_NE(calibration_table(c, r).find("fc    nvfp4    bf16"), std::string::npos)
      << calibration_table(c, r);
  EXPECT_NE(recommendation_toml(r, {}).find("# fc: nvfp4 -> bf16: nvfp4: "), std::string::npos)
      << recommendation_toml(r, {});
  EXPECT_EQ(rung_name(DType::fp8_e5m2, std::nullopt), "fp8");
  EXPECT_EQ(rung_name(DType::fp8_e4m3, BlockFormat::mxfp8), "mxfp8");
  EXPECT_EQ(rung_name(DType::bf16, BlockFormat::nvfp4), "bf16");
}

// A block format is judged against what it loses of normal values by design: E2M1 in blocks of
// 16 flushes about 7% of them (16x16 weight blocks about 10%), E4M3 with fp32 or E8M0 scales
// almost none. So 8% flushed is nvfp4's normal and safe in it, but unsafe for fp8-block (1%);
// nvfp4 weights may flush 12%; and a few values saturated by NVFP4's coarse subnormal E4M3 block
// scales are tolerated (0.1%), where an E4M3 block format may saturate none. (Calibrating the
// quickstart under nvfp4 kept every linear in bf16 under the flat 1% rule.)
TEST(CalibrationRecommendation, ABlockFormatIsJudgedAgainstWhatItLosesOfNormalValues) {
  const BlockShares act =
      normal_block_shares(block_layout(BlockFormat::nvfp4, BlockRole::activation));
  const BlockShares weights =
      normal_block_shares(block_layout(BlockFormat::nvfp4, BlockRole::weight));
  EXPECT_GT(act.flushed, 0.05);
  EXPECT_LT(act.flushed, 0.09);
  EXPECT_GT(weights.flushed, act.flushed) << "a 16x16 block's amax is larger than a 1x16 one's";
  EXPECT_LT(weights.flushed, 0.13);
  for (const auto f : {BlockFormat::fp8_block, BlockFormat::mxfp8}) {
    const BlockShares e4m3 = normal_block_shares(block_layout(f, BlockRole::activation));
    EXPECT_LT(e4m3.flushed, 1e-4) << block_format_name(f);
    EXPECT_EQ(e4m3.saturated, 0.0) << block_format_name(f);
  }

  const sdk::OpPrecision fp8_plan = {DType::bf16, DType::fp8_e4m3, DType::bf16, DType::bf16};
  const auto judged = [&](BlockFormat format, CalibratedTensor tensor, std::int64_t flushed,
                          std::int64_t saturated) {
    Calibration c;
    c.policy = block_format_name(format);
    c.block_format = format;
    c.steps = 1;
    OpCalibration op = linear("fc", fp8_plan);
    op.block_path = true;
    BlockRangeStatistics counts;
    counts.nonzero = 10000;
    for (std::size_t f = 0; f < kBlockFormats.size(); ++f) {
      counts.per_block[f].flushed = flushed;
      counts.per_block[f].saturated = saturated;
    }
    op.tensors.push_back({tensor, measure_range(logspace(0.06, 3.0), false), counts});
    c.ops.push_back(op);
    return find(recommend(c), "fc");
  };
  EXPECT_EQ(judged(BlockFormat::nvfp4, CalibratedTensor::gemm_input, 800, 0).recommended,
            DType::fp8_e4m3);
  const auto e4m3 = judged(BlockFormat::fp8_block, CalibratedTensor::gemm_input, 800, 0);
  EXPECT_EQ(e4m3.recommended, DType::bf16);
  EXPECT_NE(e4m3.reason.find("flushes 8.0% to zero"), std::string::npos) << e4m3.reason;
  EXPECT_EQ(judged(BlockFormat::nvfp4, CalibratedTensor::weight, 1200, 0).recommended,
            DType::fp8_e4m3);
  const auto too_many = judged(BlockFormat::nvfp4, CalibratedTensor::gemm_input, 1200, 0);
  EXPECT_EQ(too_many.recommended, DType::bf16);
  EXPECT_NE(too_many.reason.find("over the format's"), std::string::npos) << too_many.reason;
  EXPECT_EQ(judged(BlockFormat::nvfp4, CalibratedTensor::output_grad, 500, 5).recommended,
            DType::fp8_e4m3);
  EXPECT_EQ(judged(BlockFormat::nvfp4, CalibratedTensor::output_grad, 500, 50).recommended,
            DType::bf16);
  EXPECT_EQ(judged(BlockFormat::mxfp8, CalibratedTensor::output_grad, 50, 5).recommended,
            DType::bf16);
}

// A linear after a layer norm: its input gradient is fp32, but its GEMMs read dy cast to their
// fp16 gemm_input. Gradients around 1e-8 all flush there, so the weight gradient is zero: the
// cast is judged, and needs a loss scale (before, "safe in fp16" and "no loss scale needed").
TEST(CalibrationRecommendation, AnOutputGradientCastForTheGemmIsJudgedInThatDtype) {
  Calibration c = fp16_calibration();
  const sdk::OpPrecision after_norm{DType::fp16, DType::fp16, DType::fp32, DType::fp32};
  OpCalibration proj = healthy("proj", after_norm, 1e-4, 1e-1);
  proj.tensors[4].stats = over_steps({logspace(1e-9, 3e-8)}, true);  // output_grad
  c.ops.push_back(proj);
  const Recommendation r = recommend(c);
  ASSERT_TRUE(r.scaler.needed) << r.scaler.reason;
  EXPECT_NE(r.scaler.reason.find("proj's gradient flushes"), std::string::npos) << r.scaler.reason;
  EXPECT_EQ(find(r, "proj").recommended, DType::fp16) << find(r, "proj").reason;  // fits at S
  // Without room for a scale (the config's max_scale = 1), the op goes to fp32.
  c.max_scale = 1.0;
  const Recommendation capped = recommend(c);
  EXPECT_FALSE(capped.scaler.needed);
  EXPECT_NE(capped.scaler.reason.find("max_scale = 1 allows none"), std::string::npos)
      << capped.scaler.reason;
  EXPECT_EQ(find(capped, "proj").recommended, DType::fp32);
  EXPECT_NE(find(capped, "proj").reason.find("output_grad"), std::string::npos)
      << find(capped, "proj").reason;
  // Attention reads its dy cast to its activation_grad dtype, not its gemm_input.
  OpCalibration attention = proj;
  attention.type = "attention";
  c.ops = {attention};
  c.max_scale = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(recommend(c).scaler.needed) << recommend(c).scaler.reason;
}

// The config's [scaler.dynamic] max_scale caps the recommended init_scale, which the merged
// config would refuse above it; the reason says so.
TEST(CalibrationRecommendation, TheInitScaleStaysWithinTheConfigsMaxScale) {
  Calibration c = fp16_calibration();
  c.ops.push_back(healthy("fc1", all(DType::fp16), 1e-9, 1e-7));
  ASSERT_GT(recommend(c).scaler.scale_log2, 16);
  c.max_scale = 65536;
  const Recommendation r = recommend(c);
  ASSERT_TRUE(r.scaler.needed) << r.scaler.reason;
  EXPECT_EQ(r.scaler.scale_log2, 16);
  EXPECT_NE(r.scaler.reason.find("max_scale = 65536"), std::string::npos) << r.scaler.reason;
}

// The scale is judged on the planned dtypes; when the ops it would rescue go to fp32 for another
// reason anyway, it keeps nothing narrower and is not recommended (the file would replace the
// config's scaler, and its comment would blame a gradient no longer in fp16).
TEST(CalibrationRecommendation, AScaleThatKeepsNoOpNarrowerIsNotRecommended) {
  Calibration c = fp16_calibration();
  c.ops.push_back(healthy("fc1", all(DType::fp16), 1e-4, 1e-1));
  OpCalibration r0 = healthy("r0", all(DType::fp16), 1e-11, 1e-9);  // flushes at scale 1
  r0.tensors[2].stats = over_steps({logspace(1.0, 1e5)}, false);    // and saturates: fp32
  c.ops.push_back(r0);
  const Recommendation r = recommend(c);
  EXPECT_EQ(find(r, "r0").recommended, DType::fp32);
  EXPECT_EQ(find(r, "fc1").recommended, DType::fp16);
  EXPECT_FALSE(r.scaler.needed) << r.scaler.reason;
  EXPECT_NE(r.scaler.reason.find("no loss scale needed"), std::string::npos) << r.scaler.reason;
  EXPECT_EQ(recommendation_toml(r, {}).find("[scaler]"), std::string::npos);
  // The reason follows the recommendation in calibrate's table and precedes the overrides in the
  // file: it points at neither place.
  EXPECT_NE(r.scaler.reason.find("are recommended out of fp16"), std::string::npos)
      << r.scaler.reason;
  EXPECT_EQ(r.scaler.reason.find("below"), std::string::npos) << r.scaler.reason;
  EXPECT_EQ(r.scaler.reason.find("above"), std::string::npos) << r.scaler.reason;
}

TEST(CalibrationRecommendation, SharesPrintWithoutRoundingToZeroOrHundred) {
  EXPECT_EQ(format_share(0.0), "0%");
  EXPECT_EQ(format_share(1e-6), "<0.1%");
  EXPECT_EQ(format_share(0.003), "0.3%");
  EXPECT_EQ(format_share(0.12), "12%");
  EXPECT_EQ(format_share(0.9999), ">99%");
  EXPECT_EQ(format_share(1.0), "100%");
}

}  // namespace
}  // namespace mixtrain::core
