// KernelTraceFacet (backend_kernel_trace.h): its out-of-line anchor (the facet has no planned ops).
#include "mixtrain/sdk/backend_kernel_trace.h"

namespace mixtrain::sdk {

KernelTraceFacet::~KernelTraceFacet() = default;

}  // namespace mixtrain::sdk
