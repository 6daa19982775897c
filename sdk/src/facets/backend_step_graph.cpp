// StepGraphFacet (backend_step_graph.h): its out-of-line anchor (the facet has no planned ops).
#include "mixtrain/sdk/backend_step_graph.h"

namespace mixtrain::sdk {

StepGraphFacet::~StepGraphFacet() = default;

}  // namespace mixtrain::sdk
