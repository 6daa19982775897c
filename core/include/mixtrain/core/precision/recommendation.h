// Recommendation: from a calibration's measurements (calibration.h), the precision each op
// should run in under the config's policy, the loss scale an fp16 policy needs, and the TOML block
// that says so (docs/precision-autopilot.md, "Calibration", states the rules).
//
// Contract
// - recommend() is a pure function of the Calibration: same input, same output, no I/O.
// - Rungs: the ladder automatic escalation uses, fp8 → bf16 → fp32 and fp16 → fp32. An op's
//   planned rung is the narrowest dtype of its plan (fp8 if any field is fp8, else fp16, else
//   bf16, else fp32; tf32 counts as fp32). It is recommended the first rung, from the planned
//   one up, at which every measured tensor is safe in the dtype it is stored in at that rung
//   (raising a rung raises only the fields narrower than it). Precision-sensitive ops and ops
//   planned fp32 get no override.
// - Safety, with the thresholds below: a tensor stored in fp16/bf16 is unsafe when any value
//   saturates or more than kMaxFlushShare of its non-zero values flush to zero; fp16 gradients
//   are judged at the recommended loss scale. A GEMM op's output_grad is stored in the dtype its
//   backward casts dy to: gemm_input (linear, conv2d), activation_grad (attention). An FP8 GEMM
//   (gemm_input fp8) casts gemm_input and weight to e4m3 and output_grad to e5m2 with per-tensor
//   scaling; it is unsafe when a scaled cast flushes more than kMaxFlushShare or saturates, or when
//   one step's amax exceeds kMaxAmaxGrowth × the largest amax of the steps before it: a tolerance
//   (delayed scaling clamps the top values from about 1.04×, e4m3's 464/448; up to 2× they lose
//   less than half).
// - Loss scale (policies that need loss scaling): S = 2^s, the largest s in [0, 24] with
//   (largest gradient amax) · 2^s · 2^kLossScaleMarginLog2 < 65504, then within the
//   Calibration's min_scale and max_scale. A dynamic scaler with init_scale S is recommended when
//   some gradient stored in fp16 (an input gradient, or an output gradient cast for a GEMM)
//   flushes more than kMaxFlushShare at scale 1, unless the rules at scale 1 recommend every op
//   the same rung as at S (the scale keeps nothing narrower); otherwise no loss scale is needed
//   and S = 1 for the rules.
// - Under a block-scaled policy (Calibration::block_format) an FP8 GEMM's operands are judged by
//   their per-block counts in that policy's format instead (gemm_input, weight, output_grad:
//   unsafe past block_limits(): more values saturated or flushed than the format loses of normal
//   values, with a margin); no amax-growth rule, as
//   every block's scale comes from its own current amax.
// - Block policies (with the block report): per format, the first tensor unsafe with a
//   per-tensor scale (kMaxFlushShare) and the first unsafe with per-block scales
//   (block_limits()), and the
//   policy's plan-time refusal. A block policy is named in the file (its [precision] policy, the
//   ops' rungs redone under its plan with its per-block rule) when the calibrated policy is a
//   per-tensor FP8 one needing no loss scale, some op with a block-scaled path was raised off
//   fp8, the policy plans the model (no refusal), every measured operand is safe per block, and
//   some is unsafe per tensor; the first such in kBlockFormats order. Otherwise the report says
//   which policy would qualify and why not, and the file is as without the report.
// - recommendation_toml() renders [precision] policy, the config's own [[precision.override]]
//   entries first (merging replaces the config's array whole, and the plan the rules judged
//   had them), then one [[precision.override]] per op whose rung changes (compute = "fp32", or
//   the individual fields that change; later entries win), and, when a loss
//   scale is needed, [scaler] type = "dynamic" with [scaler.dynamic] init_scale = S (when none
//   is needed the config's scaler is left alone and a comment says so); every entry carries a
//   comment with the measured number that decided it. Deterministic: the same Recommendation
//   gives the same bytes.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/precision/calibration.h"

namespace mixtrain::core {

// The rules' thresholds, quoted by docs/precision-autopilot.md.
inline constexpr double kMaxFlushShare = 0.01;  // of a tensor's non-zero values
// A block format loses some of any data by design (E2M1 per 16 flushes about 7% of normal values,
// and NVFP4's rounded E4M3 block scales put some blocks' largest value past 6), so its per-block
// limits are kBlockOverNormal times what its layout loses of normal values
// (normal_block_shares), and at least kMaxFlushShare for flushes: nvfp4's about 10% flushed for
// activations and gradients and 15% for its 16x16 weight blocks, and 0.1% saturated (its E4M3
// block scales round down coarsely where subnormal); fp8-block's and mxfp8's 1% flushed and no
// value saturated, as for a per-tensor scale.
inline constexpr double kBlockOverNormal = 1.5;
BlockShares block_limits(BlockFormat format, CalibratedTensor tensor);
inline constexpr double kMaxAmaxGrowth = 2.0;   // step amax over the previous steps' max, tolerated
inline constexpr int kLossScaleMarginLog2 = 1;  // headroom under fp16's max for the loss scale
inline constexpr int kLossScaleCapLog2 = kMaxLossScaleLog2;  // S <= 2^24

struct OpRecommendation {
  std::string node;
  sdk::DType planned = sdk::DType::fp32;      // the planned rung
  sdk::DType recommended = sdk::DType::fp32;  // the rung recommended
  // The override's fields, in TOML order: {"compute", fp32} or the individual fields; empty when
  // the plan stands.
  std::vector<std::pair<std::string, sdk::DType>> fields;
  std::string reason;  // why each rung below the recommended one was unsafe, or why it is safe
  // The format its fp8 rung's GEMM is block-scaled in; nullopt for per-tensor FP8 (or no GEMM).
  std::optional<BlockFormat> block_format;
};

// A rung's name as the table, the reasons and the file's comments print it: the low rung is
// "fp8" under per-tensor scaling and the block format's name ("nvfp4", "mxfp8", "fp8-block")
// when block-scaled, since nvfp4's E2M1 elements are not an fp8 format.
std::string rung_name(sdk::DType rung, std::optional<BlockFormat> block_format);

struct ScalerRecommendation {
  bool applies = false;  // the policy needs loss scaling
  bool needed = false;
  int scale_log2 = 0;  // S = 2^scale_log2 (0 when not needed)
  std::string reason;
};

// One measured operand in one block format.
struct BlockTensorRow {
  std::string node;
  CalibratedTensor tensor = CalibratedTensor::gemm_input;
  BlockFormat format = BlockFormat::fp8_block;
  std::int64_t nonzero = 0;
  BlockCounts per_tensor, per_block;
};

struct BlockFormatVerdict {
  BlockFormat format = BlockFormat::fp8_block;
  bool available = false;         // the registry has the policy
  std::string refused;            // its plan-time refusal
  std::string per_tensor_unsafe;  // the first operand unsafe per tensor, why; empty: none
  std::string per_block_unsafe;   // the first operand unsafe per block, why; empty: none
};

struct BlockRecommendation {
  bool applies = false;  // the block report was measured
  std::int64_t steps = 0;
  std::vector<BlockTensorRow> rows;
  std::vector<BlockFormatVerdict> formats;
  std::optional<BlockFormat> named;  // the block policy the file names
  std::string reason;                // why it is named, or why none is
};

struct Recommendation {
  std::string policy;
  std::int64_t steps = 0;
  std::vector<OpRecommendation> ops;  // every op of the calibration, in order
  ScalerRecommendation scaler;
  BlockRecommendation blocks;
  std::vector<PrecisionOverride> carried;  // the config's overrides, written before the new ones
};

Recommendation recommend(const Calibration& calibration);

// A tensor's largest step-to-step amax growth: over steps k >= 2, step k's amax over the largest
// amax of steps 1..k-1 (steps whose predecessors are all zero are skipped), and that step
// (1-based); {0, 0} with fewer than two steps.
struct AmaxJump {
  double growth = 0.0;
  std::size_t step = 0;
};
AmaxJump largest_amax_jump(const RangeStatistics& stats);

// `header`: comment lines written at the top of the file (the config, how to merge it).
std::string recommendation_toml(const Recommendation& r, const std::vector<std::string>& header);

// Shares as the table and the comments print them: "0%", "0.3%", "12%", "100%"; a share above 0
// never prints as 0 ("<0.1%").
std::string format_share(double share);

}  // namespace mixtrain::core
