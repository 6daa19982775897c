// recommend: the calibration rules; see recommendation.h and docs/precision-autopilot.md,
// "Calibration".
#include "mixtrain/core/precision/recommendation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/precision/planning.h"

namespace mixtrain::core {

using sdk::DType;

namespace {

constexpr double kFp16Max = 65504.0;

DType planned_rung(const OpCalibration& op) {
  const sdk::OpPrecision& p = op.planned;
  std::vector<DType> fields = {p.activation, p.activation_grad};
  if (op.has_gemm) {
    fields.push_back(p.weight);
    fields.push_back(p.gemm_input);
  }
  auto any = [&](auto pred) {
    for (DType d : fields)
      if (pred(d)) return true;
    return false;
  };
  if (any([](DType d) { return sdk::is_fp8(d); })) return DType::fp8_e4m3;
  if (any([](DType d) { return d == DType::fp16; })) return DType::fp16;
  if (any([](DType d) { return d == DType::bf16; })) return DType::bf16;
  return DType::fp32;
}

std::optional<DType> next_rung(DType rung) {
  if (sdk::is_fp8(rung)) return DType::bf16;
  if (rung == DType::bf16 || rung == DType::fp16) return DType::fp32;
  return std::nullopt;
}

// The plan at `rung`: fp32 is fp32 throughout; bf16 raises the fp8 fields only; the planned rung
// is the plan itself.
sdk::OpPrecision precision_at(const sdk::OpPrecision& planned, DType rung) {
  if (rung == DType::fp32) return {DType::fp32, DType::fp32, DType::fp32, DType::fp32};
  sdk::OpPrecision q = planned;
  if (rung == DType::bf16)
    for (DType* d : {&q.weight, &q.gemm_input, &q.activation, &q.activation_grad})
      if (sdk::is_fp8(*d)) *d = DType::bf16;
  return q;
}

std::string format_number(const char* fmt, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string scale_text(int log2) {
  return "2^" + std::to_string(log2);
}

// Why a tensor is unsafe stored in a 16-bit `dtype` (fp16 gradients at loss scale 2^scale_log2),
// or nullopt when it is safe.
std::optional<std::string> check_16bit(const TensorCalibration& t, DType dtype, int scale_log2) {
  const RangeStatistics& s = t.stats;
  const FormatCounts& c = s.unscaled[range_format_index(dtype)];
  const bool scaled_gradient = is_gradient(t.tensor) && dtype == DType::fp16;
  // The loss scale is chosen to keep the largest gradient under fp16's max with a margin, so only
  // scale 1 can saturate one.
  const std::int64_t saturated = scaled_gradient && scale_log2 > 0 ? 0 : c.saturated;
  const std::int64_t flushed =
      scaled_gradient ? s.fp16_flushed_at_scale_log2(scale_log2) : c.flushed;
  const std::string at =
      scaled_gradient && scale_log2 > 0 ? " at loss scale " + scale_text(scale_log2) : "";
  const std::string name = calibrated_tensor_name(t.tensor);
  const std::string in = std::string(" in ") + std::string(sdk::dtype_name(dtype));
  if (saturated > 0)
    return name + " saturates" + in + " (" + format_share(s.share(saturated)) +
           " of values, amax " + format_number("%.3g", s.amax) + ")";
  if (s.share(flushed) > kMaxFlushShare)
    return name + " flushes " + format_share(s.share(flushed)) + " to zero" + in + at;
  return std::nullopt;
}

// Why a tensor is unsafe as an FP8 GEMM operand in `format` under delayed per-tensor scaling.
std::optional<std::string> check_fp8(const TensorCalibration& t, DType format) {
  const RangeStatistics& s = t.stats;
  const FormatCounts& c = s.scaled[range_format_index(format)];
  const std::string name = calibrated_tensor_name(t.tensor);
  const std::string in = std::string(" in ") + std::string(sdk::dtype_name(format)) + " (scaled)";
  if (c.saturated > 0) return name + " saturates " + format_share(s.share(c.saturated)) + in;
  if (s.share(c.flushed) > kMaxFlushShare)
    return name + " flushes " + format_share(s.share(c.flushed)) + " to zero" + in;
  const auto [growth, step] = largest_amax_jump(s);
  if (growth > kMaxAmaxGrowth)
    return name + "'s amax grows " + format_number("%.2g", growth) + "x at step " +
           std::to_string(step) + " (delayed scaling absorbs " +
           format_number("%g", kMaxAmaxGrowth) + "x)";
  return std::nullopt;
}

// Why counts of a tensor's values are unsafe (" saturates 1.0% in nvfp4 (per block)"), or
// nullopt.
std::optional<std::string> check_counts(const BlockRangeStatistics& s, const BlockCounts& c,
                                        const std::string& in, const BlockShares& limit) {
  if (c.saturated > 0 && s.share(c.saturated) > limit.saturated)
    return " saturates " + format_share(s.share(c.saturated)) + in +
           (limit.saturated > 0 ? ", over the format's " + format_share(limit.saturated)
                                : std::string());
  if (s.share(c.flushed) > limit.flushed)
    return " flushes " + format_share(s.share(c.flushed)) + " to zero" + in +
           (limit.flushed > kMaxFlushShare ? ", over the format's " + format_share(limit.flushed)
                                           : std::string());
  return std::nullopt;
}

std::size_t block_index(BlockFormat f) {
  for (std::size_t i = 0; i < kBlockFormats.size(); ++i)
    if (kBlockFormats[i] == f) return i;
  return 0;
}

// Why a tensor is unsafe as a block-scaled GEMM operand in `format`, or nullopt (also when it was
// not measured).
std::optional<std::string> check_block(const TensorCalibration& t, BlockFormat format) {
  if (!t.blocks) return std::nullopt;
  const auto why = check_counts(*t.blocks, t.blocks->per_block[block_index(format)],
                                std::string(" in ") + block_format_name(format) + " (per block)",
                                block_limits(format, t.tensor));
  if (!why) return std::nullopt;
  return calibrated_tensor_name(t.tensor) + *why;
}

// What the op's backward stores its output's gradient in before it reads it, when not an FP8
// GEMM operand: a linear's and a convolution's GEMMs read dy cast to their gemm_input dtype,
// attention casts it to its activation_grad dtype (graph/ops).
DType output_grad_storage(const OpCalibration& op, const sdk::OpPrecision& q) {
  return op.type == "attention" ? q.activation_grad : q.gemm_input;
}

// The first reason the op is unsafe under precision `q`, or nullopt. `blocks`: the FP8 GEMM is
// block-scaled in that format.
std::optional<std::string> check_op(const OpCalibration& op, const sdk::OpPrecision& q,
                                    int scale_log2, std::optional<BlockFormat> blocks,
                                    DType fp8_gradient) {
  const bool fp8_gemm = op.has_gemm && sdk::is_fp8(q.gemm_input);
  auto fp8 = [&](const TensorCalibration& t, DType format) {
    return blocks && op.block_path ? check_block(t, *blocks) : check_fp8(t, format);
  };
  auto stored = [&](const TensorCalibration& t, DType d) -> std::optional<std::string> {
    if (d == DType::fp16 || d == DType::bf16) return check_16bit(t, d, scale_log2);
    return std::nullopt;  // fp32, tf32 (fp32's range); fp8 is a GEMM's cast, checked below
  };
  for (const TensorCalibration& t : op.tensors) {
    std::optional<std::string> why;
    switch (t.tensor) {
      case CalibratedTensor::gemm_input:
        why = fp8_gemm ? fp8(t, DType::fp8_e4m3) : stored(t, q.gemm_input);
        break;
      case CalibratedTensor::weight:
        why = stored(t, q.weight);
        if (!why && fp8_gemm) why = fp8(t, DType::fp8_e4m3);
        if (!why && !fp8_gemm) why = stored(t, q.gemm_input);
        break;
      case CalibratedTensor::activation:
        why = stored(t, q.activation);
        break;
      case CalibratedTensor::activation_grad:
        why = stored(t, q.activation_grad);
        break;
      case CalibratedTensor::output_grad:
        why = fp8_gemm ? fp8(t, fp8_gradient) : stored(t, output_grad_storage(op, q));
        break;
    }
    if (why) return why;
  }
  return std::nullopt;
}

ScalerRecommendation recommend_scaler(const Calibration& c) {
  ScalerRecommendation r;
  r.applies = c.policy_needs_loss_scaling;
  if (!r.applies) return r;
  double gmax = 0.0;
  for (const auto& op : c.ops)
    for (const auto& t : op.tensors)
      if (is_gradient(t.tensor)) gmax = std::max(gmax, static_cast<double>(t.stats.amax));
  int s = kLossScaleCapLog2;
  if (gmax > 0.0)
    while (s > 0 && std::ldexp(gmax, s + kLossScaleMarginLog2) >= kFp16Max) --s;
  // The config's [scaler.dynamic] max_scale caps it (a file it refuses to merge helps no one).
  std::string capped;
  if (std::isfinite(c.max_scale) && c.max_scale > 0.0 && std::ldexp(1.0, s) > c.max_scale) {
    s = std::max(0, static_cast<int>(std::floor(std::log2(c.max_scale))));
    capped =
        ", capped by the config's [scaler.dynamic] max_scale = " + format_number("%g", c.max_scale);
  }
  // Its min_scale is a floor the scaler never goes below: the merged file must start there.
  if (c.min_scale > std::ldexp(1.0, s)) {
    s = std::min(kLossScaleCapLog2, static_cast<int>(std::ceil(std::log2(c.min_scale))));
    capped =
        ", raised to the config's [scaler.dynamic] min_scale = " + format_number("%g", c.min_scale);
  }
  // The gradient that flushes most at scale 1 among those the plan stores in fp16: each op's
  // input gradient, and the output gradient its GEMMs read cast to fp16.
  double worst = 0.0;
  std::string worst_op;
  for (const auto& op : c.ops) {
    if (op.precision_sensitive) continue;
    const bool fp8_gemm = op.has_gemm && sdk::is_fp8(op.planned.gemm_input);
    for (const auto& [tensor, stored] :
         {std::pair{CalibratedTensor::activation_grad, op.planned.activation_grad},
          std::pair{CalibratedTensor::output_grad, op.has_gemm && !fp8_gemm
                                                       ? output_grad_storage(op, op.planned)
                                                       : DType::fp32}}) {
      if (stored != DType::fp16) continue;
      if (const TensorCalibration* t = op.find(tensor)) {
        const double share = t->stats.share(t->stats.fp16_flushed_at_scale_log2(0));
        if (share > worst || worst_op.empty()) {
          worst = share;
          worst_op = op.node;
        }
      }
    }
  }
  const std::string largest = "the largest gradient amax is " + format_number("%.3g", gmax);
  if (worst <= kMaxFlushShare) {
    r.reason = "no loss scale needed: the gradients stored in fp16 flush at most " +
               format_share(worst) + (worst_op.empty() ? "" : " (" + worst_op + ")") +
               " at scale 1; " + largest;
    return r;
  }
  if (s == 0) {
    r.reason = worst_op + "'s gradient flushes " + format_share(worst) + " at scale 1, but " +
               (capped.empty() ? largest + ", which leaves no room for a loss scale"
                               : "the config's [scaler.dynamic] max_scale = " +
                                     format_number("%g", c.max_scale) + " allows none");
    return r;
  }
  r.needed = true;
  r.scale_log2 = s;
  const std::string product = format_number("%.3g", gmax) + " x " + scale_text(s) + " = " +
                              format_number("%.3g", std::ldexp(gmax, s)) + " < 65504 / " +
                              scale_text(kLossScaleMarginLog2);
  r.reason = "loss scale needed: " + worst_op + "'s gradient flushes " + format_share(worst) +
             " in fp16 at scale 1; " + largest + ", so init_scale = " + scale_text(s) + " = " +
             format_number("%.0f", std::ldexp(1.0, s)) +
             (!capped.empty()          ? capped
              : s == kLossScaleCapLog2 ? ", the cap (" + product + ")"
                                       : ", the largest power of two with " + product);
  return r;
}

std::string dtype_text(DType d) {
  return std::string(sdk::dtype_name(d));
}

}  // namespace

BlockShares block_limits(BlockFormat format, CalibratedTensor tensor) {
  const BlockRole role =
      tensor == CalibratedTensor::weight ? BlockRole::weight : BlockRole::activation;
  const sdk::BlockScaledLayout layout = block_layout(format, role);
  const BlockShares normal = normal_block_shares(layout);
  // An E4M3 block scale (NVFP4's) that is subnormal, for a block far below the tensor's amax,
  // rounds down by more than E2M1's top step: that block's largest values clamp to 6 times it.
  // Normal values never reach there; gradients, whose blocks span decades, do for a few.
  const double coarse_scales = layout.scale == sdk::BlockScale::e4m3 ? kMaxFlushShare / 10 : 0.0;
  return {std::max(kMaxFlushShare, kBlockOverNormal * normal.flushed),
          std::max(coarse_scales, kBlockOverNormal * normal.saturated)};
}

AmaxJump largest_amax_jump(const RangeStatistics& s) {
  AmaxJump worst;
  float before = 0.0f;
  for (std::size_t k = 0; k < s.step_amax.size(); ++k) {
    if (k > 0 && before > 0.0f) {
      const double growth = static_cast<double>(s.step_amax[k]) / static_cast<double>(before);
      if (growth > worst.growth) worst = {growth, k + 1};
    }
    before = std::max(before, s.step_amax[k]);
  }
  return worst;
}

std::string format_share(double share) {
  if (share <= 0.0) return "0%";
  const double pct = share * 100.0;
  if (pct < 0.1) return "<0.1%";
  if (pct < 10.0) return format_number("%.1f%%", pct);
  if (pct < 99.5 || share >= 1.0) return format_number("%.0f%%", pct);
  return ">99%";
}

namespace {

// The ladder for every op under `plans` (one per op; the calibration's own when null), its FP8
// GEMMs block-scaled in `blocks` when set.
std::vector<OpRecommendation> recommend_ops(const Calibration& c,
                                            const std::vector<sdk::OpPrecision>* plans,
                                            std::optional<BlockFormat> blocks, int scale_log2) {
  std::vector<OpRecommendation> ops;
  for (std::size_t i = 0; i < c.ops.size(); ++i) {
    OpCalibration op = c.ops[i];
    if (plans != nullptr) op.planned = plans->at(i);
    OpRecommendation o;
    o.node = op.node;
    o.planned = planned_rung(op);
    o.recommended = o.planned;
    if (blocks && op.block_path) o.block_format = blocks;
    if (op.precision_sensitive) {
      // Its math is FP32 whatever the plan; a bf16 plan is a layer norm's output stored for its
      // bf16 GEMM readers (precision/planning.h), the bits they read anyway.
      o.reason = o.planned == DType::fp32
                     ? "precision-sensitive: always fp32"
                     : "precision-sensitive: fp32 math, its output stored in bf16 for its bf16 "
                       "GEMM readers";
      ops.push_back(std::move(o));
      continue;
    }
    if (o.planned == DType::fp32) {
      o.reason = "planned fp32";
      ops.push_back(std::move(o));
      continue;
    }
    std::string why;
    for (std::optional<DType> rung = o.planned; rung; rung = next_rung(*rung)) {
      o.recommended = *rung;
      if (*rung == DType::fp32) break;
      const auto unsafe =
          check_op(op, precision_at(op.planned, *rung), scale_log2, blocks, c.fp8_gradient);
      if (!unsafe) break;
      why += (why.empty() ? "" : "; ") + rung_name(*rung, o.block_format) + ": " + *unsafe;
    }
    if (o.recommended == o.planned) {
      o.reason = "safe in " + rung_name(o.planned, o.block_format);
    } else {
      o.reason = why;
      const sdk::OpPrecision q = precision_at(op.planned, o.recommended);
      if (o.recommended == DType::fp32) {
        o.fields = {{"compute", DType::fp32}};
      } else {
        const std::pair<const char*, DType> changed[] = {{"weight", q.weight},
                                                         {"gemm_input", q.gemm_input},
                                                         {"activation", q.activation},
                                                         {"activation_grad", q.activation_grad}};
        const DType planned[] = {op.planned.weight, op.planned.gemm_input, op.planned.activation,
                                 op.planned.activation_grad};
        for (std::size_t i = 0; i < 4; ++i)
          if (changed[i].second != planned[i])
            o.fields.emplace_back(changed[i].first, changed[i].second);
      }
    }
    ops.push_back(std::move(o));
  }
  return ops;
}

BlockRecommendation recommend_blocks(const Calibration& c,
                                     const std::vector<OpRecommendation>& ops) {
  BlockRecommendation b;
  b.applies = c.block_report;
  b.steps = c.block_steps;
  if (!b.applies) return b;
  for (const auto& op : c.ops)
    for (const auto& t : op.tensors)
      if (t.blocks)
        for (std::size_t f = 0; f < kBlockFormats.size(); ++f)
          b.rows.push_back({op.node, t.tensor, kBlockFormats[f], t.blocks->nonzero,
                            t.blocks->per_tensor[f], t.blocks->per_block[f]});
  for (std::size_t f = 0; f < kBlockFormats.size(); ++f) {
    BlockFormatVerdict v;
    v.format = kBlockFormats[f];
    for (const auto& p : c.block_policies)
      if (p.format == v.format) {
        v.available = true;
        v.refused = p.refused;
      }
    const std::string element = std::string(" in ") + block_element_name(v.format);
    for (const auto& op : c.ops)
      for (const auto& t : op.tensors) {
        if (!t.blocks) continue;
        const std::string name = op.node + " " + calibrated_tensor_name(t.tensor);
        if (v.per_tensor_unsafe.empty())
          if (const auto why =
                  check_counts(*t.blocks, t.blocks->per_tensor[f], element + " per tensor",
                               BlockShares{kMaxFlushShare, 0.0}))
            v.per_tensor_unsafe = name + *why;
        if (v.per_block_unsafe.empty())
          if (const auto why = check_counts(*t.blocks, t.blocks->per_block[f], " per block",
                                            block_limits(v.format, t.tensor)))
            v.per_block_unsafe = name + *why;
      }
    b.formats.push_back(std::move(v));
  }
  // The per-tensor FP8 recipe's verdict: the first op with a block-scaled path it raised off fp8.
  std::string raised;
  for (std::size_t i = 0; i < c.ops.size() && i < ops.size(); ++i)
    if (c.ops[i].block_path && sdk::is_fp8(ops[i].planned) && !sdk::is_fp8(ops[i].recommended)) {
      raised = ops[i].node;
      break;
    }
  const bool per_tensor_fp8 = !c.block_format && !c.policy_needs_loss_scaling && [&] {
    for (const auto& op : c.ops)
      if (op.has_gemm && sdk::is_fp8(op.planned.gemm_input)) return true;
    return false;
  }();
  const BlockFormatVerdict* best = nullptr;
  for (const auto& v : b.formats)
    if (v.available && v.refused.empty() && v.per_block_unsafe.empty() &&
        !v.per_tensor_unsafe.empty()) {
      best = &v;
      break;
    }
  if (best == nullptr) {
    std::string why;
    for (const auto& v : b.formats) {
      std::string one = block_format_name(v.format) + std::string(": ");
      if (!v.available)
        one += "not loaded";
      else if (!v.refused.empty())
        one += "refused at plan time (" + v.refused + ")";
      else if (!v.per_block_unsafe.empty())
        one += v.per_block_unsafe;
      else
        one += "no gain: safe with a per-tensor scale too";
      why += (why.empty() ? "" : "; ") + one;
    }
    b.reason = "no block policy named: " + why;
    return b;
  }
  const std::string name = block_format_name(best->format);
  const std::string gain = "per-tensor " + best->per_tensor_unsafe + ", while per-block " + name +
                           " scaling keeps every block-scaled operand within the thresholds";
  if (!per_tensor_fp8) {
    b.reason = name + " would be safe (" + gain + "); named in the file only when calibrating a " +
               "per-tensor FP8 policy: calibrate with --set precision.policy=" + name;
    return b;
  }
  if (raised.empty()) {
    b.reason = name + " would be safe (" + gain + "), but the per-tensor FP8 policy " + c.policy +
               " keeps every op in fp8 as it is: no change";
    return b;
  }
  b.named = best->format;
  b.reason = "policy " + name + ": " + c.policy + " raises " + raised + " off fp8; " + gain;
  return b;
}

}  // namespace

std::string rung_name(DType rung, std::optional<BlockFormat> block_format) {
  // fp8 rungs are one, whatever the operand's format (e4m3 or e5m2).
  if (sdk::is_fp8(rung)) return block_format ? block_format_name(*block_format) : "fp8";
  return std::string(sdk::dtype_name(rung));
}

Recommendation recommend(const Calibration& c) {
  Recommendation r;
  r.policy = c.policy;
  r.steps = c.steps;
  r.scaler = recommend_scaler(c);
  const int scale_log2 = r.scaler.needed ? r.scaler.scale_log2 : 0;
  r.ops = recommend_ops(c, nullptr, c.block_format, scale_log2);
  // The scale was judged on the planned dtypes; the recommended ones may raise the gradients
  // that needed it out of fp16. A scale that keeps no op at a lower rung is not needed.
  if (r.scaler.needed) {
    auto unscaled = recommend_ops(c, nullptr, c.block_format, 0);
    bool same = unscaled.size() == r.ops.size();
    for (std::size_t i = 0; same && i < unscaled.size(); ++i)
      same = unscaled[i].recommended == r.ops[i].recommended;
    if (same) {
      r.ops = std::move(unscaled);
      r.scaler.needed = false;
      r.scaler.reason =
          "no loss scale needed: the ops whose fp16 gradients flush at scale 1 "
          "are recommended out of fp16, and a scale keeps no op at a lower rung";
      r.scaler.scale_log2 = 0;
    }
  }
  r.blocks = recommend_blocks(c, r.ops);
  r.carried = c.config_overrides;
  if (r.blocks.named) {
    for (const auto& p : c.block_policies)
      if (p.format == *r.blocks.named) r.ops = recommend_ops(c, &p.planned, p.format, 0);
    r.policy = block_format_name(*r.blocks.named);
    r.scaler = {};  // the block-scaled policies need no loss scaling
  }
  return r;
}

std::string recommendation_toml(const Recommendation& r, const std::vector<std::string>& header) {
  std::vector<ResolvedSection> sections;
  ResolvedSection precision;
  precision.name = "precision";
  precision.comments = header;
  // A scaler that is not needed is left as the config has it: the comment says why.
  if (r.scaler.applies && !r.scaler.needed) precision.comments.push_back(r.scaler.reason);
  if (r.blocks.applies) {
    precision.comments.push_back(
        "block report, " + std::to_string(r.blocks.steps) + " sampled step" +
        (r.blocks.steps == 1 ? "" : "s") +
        ": per operand and block format, non-zero values, then those flushed to zero and "
        "saturated with one per-tensor scale and with the format's per-block scales");
    for (const auto& row : r.blocks.rows)
      precision.comments.push_back(
          "block " + row.node + " " + calibrated_tensor_name(row.tensor) + " " +
          block_format_name(row.format) + " nonzero=" + std::to_string(row.nonzero) +
          " per_tensor_flushed=" + std::to_string(row.per_tensor.flushed) +
          " per_tensor_saturated=" + std::to_string(row.per_tensor.saturated) +
          " per_block_flushed=" + std::to_string(row.per_block.flushed) +
          " per_block_saturated=" + std::to_string(row.per_block.saturated));
    precision.comments.push_back(r.blocks.reason);
  }
  precision.values.emplace_back("policy", r.policy);
  if (r.carried.empty() &&
      std::none_of(r.ops.begin(), r.ops.end(), [](const auto& o) { return !o.fields.empty(); }))
    precision.comments.push_back("no op needs an override");
  sections.push_back(std::move(precision));
  // The override array replaces the config's whole when merged: the config's own entries come
  // first, as the plan the rules judged had them, and the recommended ones after them win.
  for (const PrecisionOverride& o : r.carried) {
    ResolvedSection s;
    s.name = "precision.override";
    s.array = true;
    s.comments = {"the config's own (" + o.where.to_string() + "), kept"};
    s.values.emplace_back("layers", o.pattern);  // already a pattern: written as the config has it
    const std::pair<const char*, std::optional<DType>> fields[] = {
        {"weight", o.weight},
        {"gemm_input", o.gemm_input},
        {"activation", o.activation},
        {"activation_grad", o.activation_grad}};
    for (const auto& [key, dtype] : fields)
      if (dtype) s.values.emplace_back(key, dtype_text(*dtype));
    sections.push_back(std::move(s));
  }
  for (const auto& o : r.ops) {
    if (o.fields.empty()) continue;
    ResolvedSection s;
    s.name = "precision.override";
    s.array = true;
    s.comments = {o.node + ": " + rung_name(o.planned, o.block_format) + " -> " +
                  rung_name(o.recommended, o.block_format) + ": " + o.reason};
    s.values.emplace_back("layers", exact_pattern(o.node));  // a name, even with a '[' in it
    for (const auto& [key, dtype] : o.fields) s.values.emplace_back(key, dtype_text(dtype));
    sections.push_back(std::move(s));
  }
  if (r.scaler.needed) {
    ResolvedSection scaler;
    scaler.name = "scaler";
    scaler.comments = {r.scaler.reason};
    scaler.values.emplace_back("type", std::string("dynamic"));
    sections.push_back(std::move(scaler));
    ResolvedSection dynamic;
    dynamic.name = "scaler.dynamic";
    dynamic.values.emplace_back("init_scale", std::ldexp(1.0, r.scaler.scale_log2));
    sections.push_back(std::move(dynamic));
  }
  return render_toml(sections);
}

}  // namespace mixtrain::core
