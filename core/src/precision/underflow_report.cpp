#include "mixtrain/core/precision/underflow_report.h"

#include <cstdio>

namespace mixtrain::core {

namespace {

// "fc2 input gradient" -> "fc2", "logits gradient" -> "logits": the line names layers, the
// metrics the tensors.
std::string short_name(const std::string& tensor) {
  for (const std::string suffix : {" input gradient", " gradient"})
    if (tensor.size() > suffix.size() &&
        tensor.compare(tensor.size() - suffix.size(), suffix.size(), suffix) == 0)
      return tensor.substr(0, tensor.size() - suffix.size());
  return tensor;
}

}  // namespace

std::string share_text(double share) {
  if (share <= 0.0) return "0%";
  if (share < 0.0005) return "<0.1%";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * share);
  return buf;
}

std::string underflow_summary_line(const std::vector<UnderflowCount>& counts, float loss_scale) {
  std::string dtypes, first_zero;
  const UnderflowCount* worst = nullptr;
  double worst_share = -1.0;
  int measured = 0, losing = 0, zero = 0;
  for (const auto& c : counts) {
    if (c.dtype == sdk::DType::fp32) continue;
    ++measured;
    const std::string dt(sdk::dtype_name(c.dtype));
    if (dtypes.find(dt) == std::string::npos) dtypes += (dtypes.empty() ? "" : "/") + dt;
    if (c.nonzero == 0) {
      if (zero++ == 0) first_zero = short_name(c.tensor);
      continue;
    }
    if (c.flushed > 0) ++losing;
    const double share = static_cast<double>(c.flushed) / static_cast<double>(c.nonzero);
    if (share > worst_share) {
      worst_share = share;
      worst = &c;
    }
  }
  if (measured == 0) return {};
  char head[96];
  std::snprintf(head, sizeof head, "gradient underflow (%s, loss scale %g): ", dtypes.c_str(),
                static_cast<double>(loss_scale));
  std::string line = head;
  if (worst == nullptr)
    return line + "n/a, the gradients of all " + std::to_string(measured) + " layers are all zero";
  if (losing == 0)
    line += "none flushed to zero";
  else
    line += "worst " + short_name(worst->tensor) + " " + share_text(worst_share) +
            " flushed to zero; " + std::to_string(losing) + "/" + std::to_string(measured) +
            " layers lose some";
  if (zero == 1) line += "; all zero: " + first_zero;
  if (zero > 1) line += "; all zero: " + first_zero + " and " + std::to_string(zero - 1) + " more";
  return line + "; per layer: metrics.jsonl";
}

}  // namespace mixtrain::core
