// HostMemoryFacet and HostBuffer (backend_host_memory.h): their out-of-line anchors (the facet has
// no planned ops).
#include "mixtrain/sdk/backend_host_memory.h"

namespace mixtrain::sdk {

HostBuffer::~HostBuffer() = default;
HostMemoryFacet::~HostMemoryFacet() = default;

}  // namespace mixtrain::sdk
