// GatedStepFacet (optimizer_gated_step.h): its out-of-line anchor, so its type is one across the
// libraries that implement and find it (the host's dynamic_cast on the optimizer).
#include "mixtrain/sdk/optimizer_gated_step.h"

namespace mixtrain::sdk {

GatedStepFacet::~GatedStepFacet() = default;

}  // namespace mixtrain::sdk
