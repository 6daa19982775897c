#include "train/step_statistics.h"

#include <cstdio>

#include "mixtrain/core/precision/underflow_report.h"

namespace mixtrain::core {

using json = nlohmann::json;

json gradient_underflow_record(Model& model, std::int64_t step, std::int64_t rows, float grad_seed,
                               float loss_scale, sdk::Logger& log) {
  const auto counts = measure_gradient_underflow(model, rows, grad_seed);
  json shares = json::object();
  for (const auto& c : counts) {
    if (c.dtype == sdk::DType::fp32) continue;
    // nonzero = 0 (all zero) has no share; 0 keeps the field numeric for readers.
    const double share =
        c.nonzero ? static_cast<double>(c.flushed) / static_cast<double>(c.nonzero) : 0.0;
    shares[c.tensor] = {
        {"dtype", sdk::dtype_name(c.dtype)}, {"flushed_share", share}, {"nonzero", c.nonzero}};
  }
  if (auto line = underflow_summary_line(counts, loss_scale); !line.empty()) log.info(line);
  return json{{"step", step}, {"underflow_scale", loss_scale}, {"underflow", shares}};
}

json fp8_operand_record(const Model& model, std::int64_t step) {
  json slots = json::object();
  for (const auto& l : model.layers())
    for (const auto& st : l->operand_stats()) {
      const double nz = st.nonzero ? static_cast<double>(st.nonzero) : 1.0;
      slots[st.slot] = {{"dtype", sdk::dtype_name(st.dtype)},
                        {"amax", st.amax},
                        {"scale", st.scale},
                        {"saturated_share", static_cast<double>(st.saturated) / nz},
                        {"underflow_share", static_cast<double>(st.underflowed) / nz}};
    }
  return json{{"step", step}, {"fp8", slots}};
}

std::string nonfinite_skip_message(std::int64_t step, const std::string& first_nonfinite,
                                   const sdk::ScalerDecision& decision) {
  char msg[256];
  std::snprintf(
      msg, sizeof msg, "step %lld skipped: non-finite values (first: %s); loss scale %g -> %g",
      static_cast<long long>(step), first_nonfinite.c_str(),
      static_cast<double>(decision.scale_before), static_cast<double>(decision.scale_after));
  return msg;
}

}  // namespace mixtrain::core
