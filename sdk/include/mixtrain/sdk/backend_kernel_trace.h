// KernelTraceFacet: the device's own record of the kernels it ran — each kernel's name and its
// time on the device, taken by the device's tracing library (CUPTI on CUDA) rather than by
// waiting for every op — so that a profile can list kernels as torch.profiler and Nsight do and
// be read beside theirs, kernel for kernel.
//
// Contract
// - start_kernel_trace() begins recording every kernel the device runs for this process; it
//   throws BackendError, naming why and the fix, when the tracing library is missing or refuses
//   (a host then reports the op table alone). A second start while tracing is a BackendError.
// - stop_kernel_trace() waits for the device, stops recording and returns the kernels run since
//   the start, one entry per kernel name (calls, summed device time), most time first; names as
//   the library gives them, demangled where they are C++ symbols. `dropped` counts records the
//   library lost (its buffers full); the times then undercount. Without a start: an empty trace.
// - Tracing changes no result; its cost is the library's (a record per kernel).
// - One caller thread at a time, like the backend. Optional: a backend with no device tracing
//   offers no such facet (find_facet answers nullptr).
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

struct KernelTime {
  std::string name;
  std::int64_t calls = 0;
  double device_seconds = 0.0;  // summed over the calls
};

struct KernelTrace {
  std::vector<KernelTime> kernels;  // most device time first
  std::int64_t dropped = 0;         // records the library lost
};

class MIXTRAIN_SDK_API KernelTraceFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "kernel_trace";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual void start_kernel_trace() = 0;
  virtual KernelTrace stop_kernel_trace() = 0;

 protected:
  ~KernelTraceFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
