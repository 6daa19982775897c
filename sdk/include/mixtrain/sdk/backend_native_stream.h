// NativeStreamFacet: the handle of the device stream a backend enqueues every op on, for
// plugins that must order their own device work with the backend's (the NCCL communicator).
//
// Contract: native_stream() is the library's stream handle (a cudaStream_t for CUDA), valid as
// long as the backend; the caller never destroys it. Work a plugin enqueues on a stream of its
// own must be ordered against this one with the library's events.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <string_view>

#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

class MIXTRAIN_SDK_API NativeStreamFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "native_stream";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual void* native_stream() = 0;

 protected:
  ~NativeStreamFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
