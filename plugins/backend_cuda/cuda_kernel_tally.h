// KernelTally: the kernel records of a device trace summed per kernel name, for the kernel_trace
// facet (cuda_kernel_trace_facet.cpp, which feeds it CUPTI's records). Plain C++ without a CUDA
// header, so the host tests check it without a GPU.
//
// Contract
// - add(name, ns) counts one kernel run of `ns` nanoseconds on the device under its name as the
//   library gives it (mangled). Cheap: one map lookup; names are demangled only at take().
// - take(dropped) returns the runs since the last take(), one entry per demangled name (two
//   mangled names that demangle alike are summed), most device time first (ties: by name), and
//   empties the tally. `dropped` is passed through. clear() empties it unread.
// - Not thread-safe: the caller serialises add() and take() (CUPTI delivers buffers on its own
//   thread).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "mixtrain/sdk/backend_kernel_trace.h"

namespace mixtrain::backend_cuda {

class KernelTally {
 public:
  void add(std::string_view name, std::uint64_t ns);
  sdk::KernelTrace take(std::int64_t dropped);
  void clear() { by_name_.clear(); }

 private:
  struct Sum {
    std::int64_t calls = 0;
    std::uint64_t ns = 0;
  };
  std::unordered_map<std::string, Sum> by_name_;
};

// A C++ symbol's demangled name ("void f<float>(float*)"); anything else as given.
std::string demangled(const std::string& name);

}  // namespace mixtrain::backend_cuda
