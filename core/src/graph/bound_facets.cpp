// BoundFacets: one lookup per facet when a plan is made; see bound_facets.h.
#include "mixtrain/core/graph/bound_facets.h"

namespace mixtrain::core {

namespace {

template <class... Fs>
void bind_all(sdk::DeviceBackend& backend, std::array<sdk::Facet*, sizeof...(Fs)>& slots,
              sdk::FacetList<Fs...>) {
  // Any minor of this host's major: which minor an op needs is the plan's question (unmet()).
  auto bind = [&]<class F>(F*) {
    sdk::Facet* found = backend.find_facet(F::kName);
    slots[sdk::Facets::index_of<F>()] = sdk::facet_serves<F>(found, 0) ? found : nullptr;
  };
  (bind(static_cast<Fs*>(nullptr)), ...);
}

}  // namespace

BoundFacets::BoundFacets(sdk::DeviceBackend& backend) {
  bind_all(backend, slots_, sdk::Facets{});
  observer_ = find<sdk::CallObserverFacet>();  // in the list: bound with the others
}

}  // namespace mixtrain::core
