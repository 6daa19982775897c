// CallObserverFacet (backend_call_observer.h): its out-of-line anchor (the facet has no planned ops).
#include "mixtrain/sdk/backend_call_observer.h"

namespace mixtrain::sdk {

CallObserverFacet::~CallObserverFacet() = default;

}  // namespace mixtrain::sdk
