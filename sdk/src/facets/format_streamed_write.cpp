// StreamedWriteFacet (format_streamed_write.h): its out-of-line anchor, so its type is one across
// the libraries that implement and find it (the host's dynamic_cast on the checkpoint format).
#include "mixtrain/sdk/format_streamed_write.h"

namespace mixtrain::sdk {

StreamedWriteFacet::~StreamedWriteFacet() = default;

}  // namespace mixtrain::sdk
