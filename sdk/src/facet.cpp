// The facets' common base: its anchor, and facet versions in messages ("1.2").
#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

Facet::~Facet() = default;

std::string to_string(FacetVersion v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

}  // namespace mixtrain::sdk
