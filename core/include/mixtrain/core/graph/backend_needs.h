// Backend needs: which facet op, on which dtypes, a node (or the training step) will call.
//
// Contract
// - Ops ask for their needs before the first step (Model::allocate); unmet() says why the
//   backend cannot meet one — no facet of that name, a facet of another major (a changed
//   interface: both versions named, and the fix), a minor older than the op's introduced_in(op),
//   or supports() answered no — so the plan stops there with the node, the op, the dtypes and the
//   backend named.
// - BackendNeed's op is a variant over the op enums of sdk::Facets (facet_list.h), generated from
//   that list: a new facet's ops take part without a line here.
// - At run time a call reaches its facet through BoundFacets (bound_facets.h), bound once when
//   the plan is made.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"

namespace mixtrain::core {

namespace detail {
// std::variant over the `Op` enums of the facets of a list that declare one.
template <class List>
struct OpsOf;
template <class... Fs>
struct OpsOf<sdk::FacetList<Fs...>> {
  template <class F>
  static auto op_tuple() {
    if constexpr (requires { typename F::Op; })
      return std::tuple<typename F::Op>{};
    else
      return std::tuple<>{};
  }
  template <class... Ops>
  static std::variant<Ops...> as_variant(std::tuple<Ops...>);
  using type = decltype(as_variant(std::tuple_cat(op_tuple<Fs>()...)));
};
}  // namespace detail

struct BackendNeed {
  detail::OpsOf<sdk::Facets>::type op;
  std::vector<sdk::DType> dtypes;  // in the order the facet's op documents
};

// "layer_norm.layernorm_forward"
std::string need_op_name(const BackendNeed& need);
// "bf16, bf16, fp32"
std::string need_dtypes(const BackendNeed& need);
// Why `backend` cannot run `need` ("it has no layer_norm facet (this host needs 1.0 or a later
// 1.x)", ...), or nullopt when it can.
std::optional<std::string> unmet(sdk::DeviceBackend& backend, const BackendNeed& need);

}  // namespace mixtrain::core
