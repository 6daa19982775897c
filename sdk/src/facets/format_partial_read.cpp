// PartialReadFacet (format_partial_read.h): its out-of-line anchor, so its type is one across the
// libraries that implement and find it (the host's dynamic_cast on the checkpoint format).
#include "mixtrain/sdk/format_partial_read.h"

namespace mixtrain::sdk {

PartialReadFacet::~PartialReadFacet() = default;

}  // namespace mixtrain::sdk
