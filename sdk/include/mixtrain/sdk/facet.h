// Facet: the base of every optional group of kernels a DeviceBackend may offer, found by name.
//
// Contract
// - A facet interface (GemmFacet, LayerNormFacet, ...) derives from Facet and declares
//   kName (unique among facets, in-tree or not) and kVersion. Its name() and version() are final
//   and return them as compiled into the backend, so the host reads the backend's numbers.
// - A backend answers DeviceBackend::find_facet(name) with the facet of that name it offers, or
//   nullptr. The host asks for "at least" a version (sdk::facet<F>(backend, min_version)) and
//   then calls only what that version declares.
// - The rule that makes "at least" safe: version N+1 of a facet only appends virtual functions
//   after version N's last one (so every slot of version N keeps its place in the vtable) and
//   changes nothing version N declared — no signature, meaning, dtype rule or struct layout.
//   Anything else (removing, reordering or changing a method, splitting a facet) is a new facet
//   with a new name, and the backend may offer the old one beside it.
// - Adding a facet never changes DeviceBackend: the host of an older SDK simply never asks for
//   the new name, and a backend of an older SDK answers nullptr for it.
// - Ownership: a facet lives as long as the backend that returned it (usually it is the backend
//   itself); it is never deleted through the facet.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <string_view>

namespace mixtrain::sdk {

class MIXTRAIN_SDK_API Facet {
 public:
  virtual std::string_view name() const = 0;
  virtual std::uint32_t version() const = 0;

 protected:
  virtual ~Facet();  // not owned through the facet: the backend is
};

// For a backend that is its own facets: the base `Facets` of `self` whose kName is `name`, or
// nullptr. Use it as find_facet's body: `return sdk::facet_among<GemmFacet, ...>(*this, name);`.
template <class... Facets, class Self>
Facet* facet_among(Self& self, std::string_view name) {
  Facet* found = nullptr;
  ((found == nullptr && name == Facets::kName ? void(found = static_cast<Facets*>(&self)) : void()),
   ...);
  return found;
}

}  // namespace mixtrain::sdk
