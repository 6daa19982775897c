// BoundFacets: a backend's facets, looked up once when a plan is made and kept by index, so that
// a kernel call costs an array load instead of a name lookup (docs/architecture.md, "Backends and
// facets").
//
// Contract
// - BoundFacets(backend) asks the backend once for every facet of sdk::Facets (facet_list.h) and
//   keeps those of the major this host speaks (any minor: the plan checks each op's minor through
//   its needs, backend_needs.h). A default-constructed BoundFacets has none.
// - call(op) and get<F>() return an sdk::FacetCall: use it as a pointer to the facet, for one call
//   (`facets.call(sdk::GemmOp::gemm)->gemm(args)`). A facet the plan did not check is a bug in
//   the host: std::logic_error naming it. find<F>() is for optional facets: nullptr when absent.
// - Profiling, for every facet alike: when the backend has a call_observer facet (the
//   ProfilingBackend does), each FacetCall times its one call, until the backend has finished it,
//   under the op's name: call(op) gives op_name(op), get<F>("pool2d_forward") the name it is
//   given, get<F>() the facet's ("attention"). The names are the facets' method names, as the
//   profile has always shown them.
// - Lifetime: the facets belong to the backend; a BoundFacets must not outlive it. Copyable.
#pragma once

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"

namespace mixtrain::core {

// The facet class whose op enum is Op, from the list.
template <class Op, class List = sdk::Facets>
struct FacetOf;
template <class Op, class... Fs>
struct FacetOf<Op, sdk::FacetList<Fs...>> {
  template <class F>
  static constexpr bool owns() {
    if constexpr (requires { typename F::Op; })
      return std::is_same_v<typename F::Op, Op>;
    else
      return false;
  }
  static_assert((owns<Fs>() + ...) == 1, "an op enum belongs to exactly one facet of the list");
  using type = std::tuple_element_t<((owns<Fs>() ? sdk::Facets::index_of<Fs>() : 0) + ...),
                                    std::tuple<Fs...>>;
};

class BoundFacets {
 public:
  BoundFacets() = default;
  explicit BoundFacets(sdk::DeviceBackend& backend);

  // `op` names the call in profiles: the method's name where its facet has no op enum value for
  // it (a query such as pool2d_workspace_bytes), else call(op) says it.
  template <class F>
  sdk::FacetCall<F> get(std::string_view op = F::kName) const {
    return {&required<F>(), observer_, op};
  }
  template <class Op>
  sdk::FacetCall<typename FacetOf<Op>::type> call(Op op) const {
    using F = typename FacetOf<Op>::type;
    return {&required<F>(), observer_, sdk::op_name(op)};
  }
  template <class F>
  F* find() const noexcept {
    return static_cast<F*>(slots_[sdk::Facets::index_of<F>()]);
  }

 private:
  template <class F>
  F& required() const {
    F* f = find<F>();
    if (f == nullptr)
      throw std::logic_error("the backend has no " + std::string(F::kName) + " facet of major " +
                             std::to_string(F::kVersion.major) +
                             ", and the plan did not stop before calling it");
    return *f;
  }

  std::array<sdk::Facet*, sdk::Facets::size> slots_{};
  sdk::CallObserverFacet* observer_ = nullptr;
};

}  // namespace mixtrain::core
