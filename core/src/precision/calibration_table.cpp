// calibration_table: the text `mixtrain calibrate` prints; see calibration_table.h.
#include "mixtrain/core/precision/calibration_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mixtrain::core {

using sdk::DType;

namespace {

std::string number(const char* fmt, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string risk(const RangeStatistics& s, std::int64_t flushed, std::int64_t saturated) {
  std::string out;
  if (saturated > 0) out = "sat " + format_share(s.share(saturated));
  if (flushed > 0)
    out += (out.empty() ? "" : " ") + std::string("flush ") + format_share(s.share(flushed));
  return out.empty() ? "ok" : out;
}

std::string format_cell(const RangeStatistics& s, DType format, bool scaled) {
  const FormatCounts& c = (scaled ? s.scaled : s.unscaled)[range_format_index(format)];
  return risk(s, c.flushed, c.saturated);
}

std::string render(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows)
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], row[i].size());
    }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string block_cell(std::int64_t nonzero, const BlockCounts& c) {
  RangeStatistics base;  // for its share(): the block counts share the same base
  base.nonzero = nonzero;
  return risk(base, c.flushed, c.saturated);
}

// The share of the per-tensor scale's losses (flushed + saturated) that per-block scales avoid.
std::string reduction_cell(const BlockTensorRow& row) {
  const std::int64_t t = row.per_tensor.flushed + row.per_tensor.saturated;
  const std::int64_t b = row.per_block.flushed + row.per_block.saturated;
  if (t == 0) return b == 0 ? "-" : "worse";
  if (b > t) return "worse";
  return format_share(static_cast<double>(t - b) / static_cast<double>(t));
}

std::string block_report(const BlockRecommendation& b) {
  std::string out = "\nblock scaling, " + std::to_string(b.steps) + " sampled step" +
                    (b.steps == 1 ? "" : "s") +
                    " (the linears' GEMM operands; per-tensor: one scale from the tensor's amax, "
                    "same elements; reduction: the share of the per-tensor losses that per-block "
                    "scales avoid):\n";
  std::vector<std::vector<std::string>> rows = {
      {"node", "tensor", "format", "per-tensor", "per-block", "reduction"}};
  for (const auto& row : b.rows)
    rows.push_back(
        {row.node, calibrated_tensor_name(row.tensor),
         std::string(block_format_name(row.format)) + " (" + block_element_name(row.format) + ")",
         block_cell(row.nonzero, row.per_tensor), block_cell(row.nonzero, row.per_block),
         reduction_cell(row)});
  out += render(rows);
  for (const auto& v : b.formats) {
    out += std::string("  ") + block_format_name(v.format) + ": ";
    if (!v.available) {
      out += "not loaded\n";
      continue;
    }
    out +=
        "per tensor " + (v.per_tensor_unsafe.empty() ? std::string("safe") : v.per_tensor_unsafe);
    out += "; per block " + (v.per_block_unsafe.empty() ? std::string("safe") : v.per_block_unsafe);
    if (!v.refused.empty()) out += "; refused: " + v.refused;
    out += "\n";
  }
  out += "block policy: " + b.reason + "\n";
  return out;
}

}  // namespace

std::string calibration_table(const Calibration& c, const Recommendation& r) {
  const bool scaled_fp16 = r.scaler.applies && r.scaler.needed;
  const std::string scale_column = "fp16@2^" + std::to_string(r.scaler.scale_log2);
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"node", "tensor", "amax", "decades", "fp16"};
  if (scaled_fp16) head.push_back(scale_column);
  for (const char* h : {"bf16", "e4m3/t", "e5m2/t", "jump"}) head.emplace_back(h);
  rows.push_back(head);
  for (const auto& op : c.ops)
    for (const auto& t : op.tensors) {
      const RangeStatistics& s = t.stats;
      std::vector<std::string> row = {op.node, calibrated_tensor_name(t.tensor),
                                      number("%.2e", s.amax)};
      row.push_back(s.nonzero > 0 && s.min_nonzero > 0.0f
                        ? number("%.1f", std::log10(static_cast<double>(s.amax) /
                                                    static_cast<double>(s.min_nonzero)))
                        : "-");
      row.push_back(format_cell(s, DType::fp16, false));
      if (scaled_fp16)
        row.push_back(is_gradient(t.tensor)
                          ? risk(s, s.fp16_flushed_at_scale_log2(r.scaler.scale_log2), 0)
                          : "-");
      row.push_back(format_cell(s, DType::bf16, false));
      row.push_back(format_cell(s, DType::fp8_e4m3, true));
      row.push_back(format_cell(s, DType::fp8_e5m2, true));
      const AmaxJump jump = largest_amax_jump(s);
      row.push_back(jump.step == 0 ? "-" : number("x%.2f", jump.growth));
      rows.push_back(std::move(row));
    }
  std::string out = "calibration: " + std::to_string(c.steps) + " FP32 step" +
                    (c.steps == 1 ? "" : "s") +
                    "; decades = log10(amax / smallest non-zero |x|); " +
                    "fp16, bf16 unscaled; e4m3/t, e5m2/t with per-tensor scaling; jump = largest " +
                    "step amax over the previous steps' max\n\n";
  out += render(rows);
  out += "\nrecommendation under policy " + r.policy + ":\n";
  std::vector<std::vector<std::string>> recs = {{"node", "planned", "recommended", "why"}};
  for (const auto& o : r.ops)
    recs.push_back({o.node, rung_name(o.planned, o.block_format),
                    rung_name(o.recommended, o.block_format), o.reason});
  out += render(recs);
  if (r.scaler.applies) out += "\nscaler: " + r.scaler.reason + "\n";
  if (r.blocks.applies) out += block_report(r.blocks);
  return out;
}

}  // namespace mixtrain::core
