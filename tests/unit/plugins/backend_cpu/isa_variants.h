// The ISA variants of the CPU backend's dispatched kernels (cpu_isa.h) that this CPU runs, widest
// first, and a scope that runs every kernel as one of them. A test that loops over them checks
// the baseline (SSE2) and AVX2 compilations too, which a CPU with wider units never picks.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cpu_isa.h"

namespace mixtrain::backend_cpu::testing {

inline std::vector<Isa> runnable_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::v4, Isa::v3, Isa::baseline})
    if (isa >= detected_isa()) out.push_back(isa);
  return out;
}

// The (threads, ISA) pairs a kernel test runs: one thread on each variant, two on the widest.
inline std::vector<std::pair<int, Isa>> thread_and_isa_runs() {
  std::vector<std::pair<int, Isa>> runs;
  for (const Isa isa : runnable_isas()) runs.emplace_back(1, isa);
  runs.emplace_back(2, runnable_isas().front());
  return runs;
}

inline std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::v4:
      return "x86-64-v4";
    case Isa::v3:
      return "x86-64-v3";
    case Isa::baseline:
      return "baseline";
  }
  return "?";
}

// Kernels run as `isa` while the scope lives, then as the CPU's widest again.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) { limit_isa(isa); }
  ~IsaScope() { limit_isa(Isa::v4); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

}  // namespace mixtrain::backend_cpu::testing
