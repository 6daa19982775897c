// ScratchFacet (backend_scratch.h): its out-of-line anchor (the facet has no planned ops).
#include "mixtrain/sdk/backend_scratch.h"

namespace mixtrain::sdk {

ScratchFacet::~ScratchFacet() = default;

}  // namespace mixtrain::sdk
