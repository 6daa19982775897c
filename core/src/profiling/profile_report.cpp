// The profile as the CLI prints it: entries grouped by what they are, per step and share.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

#include "mixtrain/core/profiling/profiling_backend.h"
#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::core {

namespace {

// The GEMM facet's ops, as the profiler records them (sdk::op_name): those that multiply count as
// GEMMs wherever they run (a wgrad with its bias gradient in the epilogue is gemm_gradient), the
// FP8 quantizations as casts (an FP8 gradient's cast with its bias sum and gelu gradient too).
bool is_gemm(std::string_view op) {
  using sdk::GemmOp;
  for (const GemmOp g : {GemmOp::gemm, GemmOp::gemm_strided_batched, GemmOp::gemm_grouped,
                         GemmOp::gemm_block_scaled, GemmOp::gemm_gradient})
    if (op == sdk::op_name(g)) return true;
  return false;
}

bool is_cast(std::string_view op) {
  return op == "cast" || op == sdk::op_name(sdk::GemmOp::quantize_block_scaled) ||
         op == sdk::op_name(sdk::GemmOp::cast_transpose) ||
         op == sdk::op_name(sdk::GemmOp::cast_transpose_gradient);
}

}  // namespace

std::string profile_group(const ProfileEntry& e) {
  const std::string_view s = e.scope, op = e.op;
  if (s == "classifier") return "classifier (LM head GEMMs + cross-entropy)";
  if (s == "optimizer") return "optimizer";
  if (s == "gradient checks") return "gradient checks (unscale, inf/NaN, norm)";
  if (s == "data") return "data (batch to device)";
  if (s == "gradient all-reduce") return "gradient all-reduce";
  if (is_gemm(op)) return "GEMMs";
  if (s == "attention" && (op == "softmax_forward" || op == "softmax_backward"))
    return "attention softmax";
  if (s == "attention" && (op == "flash_forward" || op == "flash_backward"))
    return "attention (flash)";
  if (s == "attention") return "attention head permutes";
  // layernorm_add_forward runs under the add's scope: the residual add it takes in is counted
  // with it.
  if (s == "layernorm" || op.starts_with("layernorm_")) return "layer norm";
  if (op.starts_with("conv2d_")) return "convolutions";
  if (op.starts_with("batchnorm_")) return "batch norm";
  if (op.starts_with("pool2d_")) return "pooling";
  if (op == "to_channels_last" || op == "to_channels_first") return "layout permutes";
  if (op == "activation_forward" || op == "activation_backward") return "activations";
  if (op.starts_with("dropout_")) return "dropout";
  if (s == "embedding" || s == "position_embedding") return "embeddings";
  if (is_cast(op)) return "casts";
  return "other ops";
}

std::string format_profile(const ProfilingBackend& p, std::int64_t steps) {
  const double total = p.recorded_seconds();
  const auto rows = p.entries();
  const double per_step = steps > 0 ? 1.0 / static_cast<double>(steps) : 0.0;
  std::map<std::string, double> groups;
  double in_ops = 0.0;
  for (const auto& e : rows) {
    groups[profile_group(e)] += e.seconds;
    in_ops += e.seconds;
  }
  std::vector<std::pair<std::string, double>> sorted(groups.begin(), groups.end());
  sorted.emplace_back("outside backend ops (host)", std::max(0.0, total - in_ops));
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  char line[256];
  auto pct = [&](double s) { return total > 0 ? 100.0 * s / total : 0.0; };
  std::snprintf(line, sizeof line, "profile: %lld steps, %.3f s (%.2f ms/step)\n",
                static_cast<long long>(steps), total, 1e3 * total * per_step);
  out += line;
  std::snprintf(line, sizeof line, "  %-44s %10s %7s\n", "group", "ms/step", "%");
  out += line;
  for (const auto& [name, s] : sorted) {
    std::snprintf(line, sizeof line, "  %-44s %10.3f %6.1f%%\n", name.c_str(), 1e3 * s * per_step,
                  pct(s));
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-20s %-30s %9s %10s %7s\n", "scope", "op", "calls/step",
                "ms/step", "%");
  out += line;
  for (const auto& e : rows) {
    std::snprintf(line, sizeof line, "  %-20s %-30s %9.1f %10.3f %6.1f%%\n", e.scope.c_str(),
                  e.op.c_str(), static_cast<double>(e.calls) * per_step, 1e3 * e.seconds * per_step,
                  pct(e.seconds));
    out += line;
  }
  return out;
}

std::string format_node_profile(const ProfilingBackend& p, std::int64_t steps,
                                const std::map<std::string, ProfileNodeInfo>& info,
                                std::size_t top) {
  const auto rows = p.node_entries();
  if (rows.empty() || steps < 1) return {};
  const double total = p.recorded_seconds();
  const double per_step = 1.0 / static_cast<double>(steps);
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "nodes: the top %zu of %zu (node, op) rows by time; TFLOP/s for a convolution's "
                "forward and gradients (one forward's FLOPs each)\n",
                std::min(top, rows.size()), rows.size());
  out += line;
  std::snprintf(line, sizeof line, "  %-22s %-12s %-34s %9s %10s %7s %9s  %s\n", "node", "type",
                "op", "calls/step", "ms/step", "%", "TFLOP/s", "shapes (per sample)");
  out += line;
  for (std::size_t i = 0; i < rows.size() && i < top; ++i) {
    const ProfileNodeEntry& r = rows[i];
    const auto it = info.find(r.node);
    std::string rate = "-", shapes;
    if (it != info.end()) {
      shapes = it->second.shapes;
      const std::string_view op = r.entry.op;
      const bool conv = op == "conv2d_forward" || op == "conv2d_backward_data" ||
                        op == "conv2d_backward_data_accumulate" || op == "conv2d_backward_weights";
      if (conv && r.entry.seconds > 0.0 && it->second.forward_flops_per_call > 0.0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f",
                      it->second.forward_flops_per_call * static_cast<double>(r.entry.calls) /
                          r.entry.seconds * 1e-12);
        rate = buf;
      }
    }
    std::snprintf(line, sizeof line, "  %-22s %-12s %-34s %9.1f %10.3f %6.1f%% %9s  %s\n",
                  r.node.c_str(), r.entry.scope.c_str(), r.entry.op.c_str(),
                  static_cast<double>(r.entry.calls) * per_step, 1e3 * r.entry.seconds * per_step,
                  total > 0 ? 100.0 * r.entry.seconds / total : 0.0, rate.c_str(), shapes.c_str());
    out += line;
  }
  return out;
}

}  // namespace mixtrain::core
