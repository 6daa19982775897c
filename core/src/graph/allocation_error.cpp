#include "graph/allocation_error.h"

#include <cstdio>
#include <limits>

namespace mixtrain::core {

std::string memory_text(std::size_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes == std::numeric_limits<std::size_t>::max()) return "over 16 EiB";  // saturated
  if (bytes >= (std::size_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  else if (bytes >= (std::size_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  else if (bytes >= (std::size_t{1} << 10))
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  return buf;
}

sdk::BackendError allocation_error(const sdk::BackendError& cause, const std::string& what,
                                   std::size_t bytes, const MemoryForecast& f,
                                   const sdk::DeviceBackend& backend) {
  const auto caps = backend.capabilities();
  const auto stats = backend.memory_stats();
  std::string device = "backend '" + caps.kind + "'";
  if (!caps.device_name.empty()) device += " on " + caps.device_name;
  if (caps.memory_bytes > 0) device += " (" + memory_text(caps.memory_bytes) + ")";
  std::string message =
      "cannot allocate " + what + " (" + memory_text(bytes) + ", " + std::to_string(bytes) +
      " bytes) for batches of " + std::to_string(f.max_rows) + " rows: " + cause.what() +
      "\n  the model's memory plan for these batches predicts " + memory_text(f.total()) +
      " in all (the arena of the activations and their gradients " + memory_text(f.activations) +
      (f.parameter_gradients ? ", parameters with their gradients and working copies "
                             : ", parameters with their working copies (nothing trains, so no "
                               "gradients) ") +
      memory_text(f.parameters) + ", batch and labels " + memory_text(f.input) +
      "; optimizer state and backend scratch come on top); " + device + " held " +
      memory_text(stats.current_bytes) + " when it refused";
  std::string hint = cause.hint();
  if (!hint.empty()) hint += "; ";
  hint +=
      "to need less memory: lower data.batch_size (activations and their gradients grow with "
      "it), keep the effective batch with run.accumulate = N micro-batches of batch_size / N "
      "rows";
  if (!f.activations_narrow)
    hint += ", or store activations and gradients in 16 bits (precision.policy = \"bf16-mixed\")";
  if (!f.recompute_types.empty()) {
    std::string types;
    for (const auto& t : f.recompute_types) types += (types.empty() ? "\"" : ", \"") + t + "\"";
    hint +=
        ", or compute outputs again for the backward instead of keeping them "
        "(model.recompute = [" +
        types + "]: docs/model-graph.md, \"Recomputation\")";
  }
  return sdk::BackendError(message, hint);
}

}  // namespace mixtrain::core
