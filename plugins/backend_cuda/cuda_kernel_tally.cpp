// KernelTally (cuda_kernel_tally.h).
#include "cuda_kernel_tally.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>

namespace mixtrain::backend_cuda {

void KernelTally::add(std::string_view name, std::uint64_t ns) {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) it = by_name_.emplace(std::string(name), Sum{}).first;
  ++it->second.calls;
  it->second.ns += ns;
}

sdk::KernelTrace KernelTally::take(std::int64_t dropped) {
  std::map<std::string, Sum> merged;
  for (const auto& [name, sum] : by_name_) {
    Sum& m = merged[demangled(name)];
    m.calls += sum.calls;
    m.ns += sum.ns;
  }
  by_name_.clear();
  sdk::KernelTrace trace;
  trace.dropped = dropped;
  for (const auto& [name, sum] : merged)
    trace.kernels.push_back({name, sum.calls, static_cast<double>(sum.ns) * 1e-9});
  std::stable_sort(trace.kernels.begin(), trace.kernels.end(),
                   [](const sdk::KernelTime& a, const sdk::KernelTime& b) {
                     return a.device_seconds > b.device_seconds;
                   });
  return trace;
}

std::string demangled(const std::string& name) {
  if (!name.starts_with("_Z")) return name;
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> text(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), &std::free);
  return status == 0 && text ? std::string(text.get()) : name;
}

}  // namespace mixtrain::backend_cuda
