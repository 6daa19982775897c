// Facet: the base of every optional group of kernels a DeviceBackend may offer, found by name and
// versioned on its own (docs/architecture.md, "Plugins and the ABI").
//
// Contract
// - A facet interface (GemmFacet, LayerNormFacet, ...) derives from Facet and declares kName
//   (unique among facets, in-tree or not), kVersion (a FacetVersion: major.minor) and, when the
//   host plans its calls, `using Op = <its op enum>`. name() and version() are final and return
//   kName and kVersion as compiled into the backend, so the host reads the backend's numbers.
// - A backend answers DeviceBackend::find_facet(name) with the facet of that name it offers, or
//   nullptr. The host asks for its major and "at least" a minor (sdk::facet<F>(backend,
//   min_minor)) and then calls only what that minor declares.
// - Minor step (x.y -> x.y+1): appends virtual functions after the last one (every earlier slot
//   keeps its place in the vtable) and changes nothing earlier minors declared: no signature,
//   meaning, dtype rule or struct layout. A backend built against x.y still serves a host of
//   x.y+1 for every op of x.y; an op added in x.y+1 says so (introduced_in(op)), so the plan asks
//   for that minor only where it calls that op.
// - Major step (x.y -> x+1.0): anything else (a changed signature or struct, a removed method).
//   A host and a backend of different majors do not talk through that facet: the host refuses it
//   at plan time naming both versions; a backend may offer the new facet under a new name beside
//   the old one to keep older hosts.
// - Adding a facet never changes DeviceBackend: a host that does not know a name never asks for
//   it, and a backend answers nullptr for a name it does not know.
// - The ABI guard (cmake/MixtrainSdkAbi.cmake, sdk/abi/declarations.txt) records each facet
//   header's declarations under its name and version, apart from the core boundary.
// - Ownership: a facet lives as long as the backend that returned it (a member object of the
//   backend, or the backend itself); it is never deleted through the facet.
#pragma once

#include "mixtrain/sdk/export.h"

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

namespace mixtrain::sdk {

struct FacetVersion {
  std::uint16_t major = 1;
  std::uint16_t minor = 0;
  friend constexpr bool operator==(FacetVersion, FacetVersion) = default;
  friend constexpr auto operator<=>(FacetVersion, FacetVersion) = default;
};

// "1.2"
MIXTRAIN_SDK_API std::string to_string(FacetVersion v);

class MIXTRAIN_SDK_API Facet {
 public:
  virtual std::string_view name() const = 0;
  virtual FacetVersion version() const = 0;

 protected:
  virtual ~Facet();  // not owned through the facet: the backend is
};

// The minor of its facet in which an op first appeared; 0 unless a facet header says otherwise
// for its own op enum (an overload taking that enum, next to the op's declaration).
template <class Op>
constexpr std::uint16_t introduced_in(Op) noexcept {
  return 0;
}

// Whether `found` is facet F at F's major and at least `min_minor`.
template <class F>
bool facet_serves(const Facet* found, std::uint16_t min_minor) noexcept {
  if (found == nullptr || found->name() != F::kName) return false;
  const FacetVersion v = found->version();
  return v.major == F::kVersion.major && v.minor >= min_minor;
}

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
