#include "mixtrain/core/graph/backend_needs.h"

#include <stdexcept>
#include <type_traits>
#include <utility>

namespace mixtrain::core {

namespace {

// Which minor of facet F the op needs: the minor it was introduced in.
template <class F, class Op>
sdk::FacetVersion needed(Op op) {
  return {F::kVersion.major, sdk::introduced_in(op)};
}

}  // namespace

std::string need_op_name(const BackendNeed& need) {
  return std::visit(
      [](auto op) {
        using Facet = typename FacetOf<decltype(op)>::type;
        return std::string(Facet::kName) + "." + std::string(sdk::op_name(op));
      },
      need.op);
}

std::string need_dtypes(const BackendNeed& need) {
  std::string out;
  for (sdk::DType t : need.dtypes)
    out += (out.empty() ? "" : ", ") + std::string(sdk::dtype_name(t));
  return out;
}

std::optional<std::string> unmet(sdk::DeviceBackend& backend, const BackendNeed& need) {
  return std::visit(
      [&](auto op) -> std::optional<std::string> {
        using Facet = typename FacetOf<decltype(op)>::type;
        const std::string name(Facet::kName);
        const sdk::FacetVersion want = needed<Facet>(op);
        const std::string wanted =
            sdk::to_string(want) + " or a later " + std::to_string(want.major) + ".x";
        sdk::Facet* found = backend.find_facet(Facet::kName);
        if (found == nullptr || found->name() != Facet::kName)
          return "it has no " + name + " facet (this host needs " + wanted + ")";
        const sdk::FacetVersion has = found->version();
        if (has.major != want.major)
          return "its " + name + " facet is version " + sdk::to_string(has) + ", built against " +
                 (has.major > want.major ? "a newer" : "an older") + " SDK; this host speaks " +
                 name + " " + wanted + ": rebuild the backend plugin against this mixtrain's SDK";
        if (has.minor < want.minor)
          return "its " + name + " facet is version " + sdk::to_string(has) + ", " +
                 std::string(sdk::op_name(op)) + " needs " + wanted +
                 ": rebuild the backend plugin against this mixtrain's SDK";
        auto* facet = static_cast<Facet*>(found);
        if (!facet->supports(op, need.dtypes)) {
          std::string why = "its " + name + " facet does not support " +
                            std::string(sdk::op_name(op)) + " on " + need_dtypes(need);
          if constexpr (std::is_same_v<Facet, sdk::GemmFacet>) {
            std::string runs;
            for (const auto& d : backend.capabilities().gemm_inputs)
              runs += (runs.empty() ? "" : ", ") + std::string(sdk::dtype_name(d.dtype));
            if (!runs.empty()) why += " (its GEMM inputs: " + runs + ")";
            // An fp8 output is what an fp8 activation asks for: no backend writes one.
            if (need.dtypes.size() >= 3 && sdk::is_fp8(need.dtypes[2]))
              why += "; fp8 is a GEMM operand dtype, not one a GEMM writes, so an activation "
                     "stored in fp8 (activation or compute = fp8 in [[precision.override]]) "
                     "cannot be: set gemm_input = " +
                     std::string(sdk::dtype_name(need.dtypes[2])) + " instead";
          }
          return why;
        }
        return std::nullopt;
      },
      need.op);
}

}  // namespace mixtrain::core
