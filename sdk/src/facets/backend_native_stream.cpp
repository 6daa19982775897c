// NativeStreamFacet (backend_native_stream.h): its out-of-line anchor (the facet has no planned ops).
#include "mixtrain/sdk/backend_native_stream.h"

namespace mixtrain::sdk {

NativeStreamFacet::~NativeStreamFacet() = default;

}  // namespace mixtrain::sdk
