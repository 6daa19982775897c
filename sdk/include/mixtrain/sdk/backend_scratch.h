// ScratchFacet: how much of a backend's counted memory is its own scratch — buffers it keeps for
// itself between calls (decoded copies of emulated formats, fp32 staging of 16-bit outputs,
// weights reordered into a kernel's layout, library workspaces) rather than memory a caller
// allocated — so that a memory report can tell the two apart.
//
// Contract
// - scratch_bytes() is the part of DeviceBackend::memory_stats().current_bytes that the backend
//   holds for itself now; 0 before its first op that keeps any. It never exceeds current_bytes.
//   Memory a library allocates and frees inside one call, which memory_stats() does not count,
//   is not in it either.
// - Optional: a backend without scratch of its own, or that does not count it, offers no such
//   facet (find_facet answers nullptr); a host then reports the scratch with the memory it
//   allocated during a step.
// - No device work and no synchronisation; one caller thread at a time, like the backend.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstddef>
#include <string_view>

#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

class MIXTRAIN_SDK_API ScratchFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "scratch";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual std::size_t scratch_bytes() const = 0;

 protected:
  ~ScratchFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
