// format_kernel_trace (profiling_backend.h): the device's kernels as `train --profile` lists them.
#include <algorithm>
#include <cstdio>

#include "mixtrain/core/profiling/profiling_backend.h"

namespace mixtrain::core {

std::string format_kernel_trace(const KernelTraceResult& k, std::int64_t steps, std::size_t top) {
  if (!k.offered) return "";
  if (!k.error.empty()) return "kernels: not traced: " + k.error + "\n";
  const double per_step = steps > 0 ? 1.0 / static_cast<double>(steps) : 0.0;
  double total = 0.0;
  for (const sdk::KernelTime& e : k.trace.kernels) total += e.device_seconds;
  const std::size_t shown = std::min(top, k.trace.kernels.size());
  char line[256];
  std::snprintf(line, sizeof line,
                "kernels: the top %zu of %zu by device time, as the device traced them: %.3f "
                "ms/step in all kernels\n",
                shown, k.trace.kernels.size(), 1e3 * total * per_step);
  std::string out = line;
  if (k.trace.dropped > 0)
    out += "  (" + std::to_string(k.trace.dropped) +
           " records lost by the tracing library: the times undercount)\n";
  std::snprintf(line, sizeof line, "  %10s %7s %10s  %s\n", "ms/step", "%", "calls/step", "kernel");
  out += line;
  for (std::size_t i = 0; i < shown; ++i) {
    const sdk::KernelTime& e = k.trace.kernels[i];
    std::snprintf(line, sizeof line, "  %10.3f %6.1f%% %10.1f  ", 1e3 * e.device_seconds * per_step,
                  total > 0 ? 100.0 * e.device_seconds / total : 0.0,
                  static_cast<double>(e.calls) * per_step);
    // Kernel names (cuDNN's and CUTLASS's templates) run to hundreds of characters: cut at 160.
    out += line + (e.name.size() > 160 ? e.name.substr(0, 157) + "..." : e.name) + "\n";
  }
  return out;
}

}  // namespace mixtrain::core
