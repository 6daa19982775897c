#include "mixtrain/core/graph/backend_needs.h"

#include <stdexcept>
#include <type_traits>
#include <utility>

namespace mixtrain::core {

namespace {

// The facet class each op enum belongs to.
template <class Op>
struct FacetOf;
template <>
struct FacetOf<sdk::GemmOp> {
  using type = sdk::GemmFacet;
};
template <>
struct FacetOf<sdk::ActivationOp> {
  using type = sdk::ActivationFacet;
};
template <>
struct FacetOf<sdk::ResidualOp> {
  using type = sdk::ResidualFacet;
};
template <>
struct FacetOf<sdk::GradientCheckOp> {
  using type = sdk::GradientCheckFacet;
};
template <>
struct FacetOf<sdk::ForeachOp> {
  using type = sdk::ForeachFacet;
};
template <>
struct FacetOf<sdk::LayerNormOp> {
  using type = sdk::LayerNormFacet;
};
template <>
struct FacetOf<sdk::BatchNormOp> {
  using type = sdk::BatchNormFacet;
};
template <>
struct FacetOf<sdk::LossOp> {
  using type = sdk::LossFacet;
};
template <>
struct FacetOf<sdk::OptimizerOp> {
  using type = sdk::OptimizerFacet;
};
template <>
struct FacetOf<sdk::AttentionOp> {
  using type = sdk::AttentionFacet;
};
template <>
struct FacetOf<sdk::EmbeddingOp> {
  using type = sdk::EmbeddingFacet;
};
template <>
struct FacetOf<sdk::ConvolutionOp> {
  using type = sdk::ConvolutionFacet;
};
template <>
struct FacetOf<sdk::DropoutOp> {
  using type = sdk::DropoutFacet;
};

template <class Facet>
Facet& required(sdk::DeviceBackend& b) {
  Facet* facet = sdk::facet<Facet>(b);
  if (facet == nullptr)
    throw std::logic_error("the backend has no " + std::string(Facet::kName) +
                           " facet of version " + std::to_string(Facet::kVersion) +
                           " or later, and the plan did not stop before calling it");
  return *facet;
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
        const std::string wanted = "version " + std::to_string(Facet::kVersion) + " or later";
        sdk::Facet* found = backend.find_facet(Facet::kName);
        if (found == nullptr || found->name() != Facet::kName)
          return "it has no " + name + " facet (this host needs " + wanted + ")";
        if (found->version() < Facet::kVersion)
          return "its " + name + " facet is version " + std::to_string(found->version()) +
                 ", this host needs " + wanted;
        auto* facet = static_cast<Facet*>(found);
        if (!facet->supports(op, need.dtypes)) {
          std::string why = "its " + name + " facet does not support " +
                            std::string(sdk::op_name(op)) + " on " + need_dtypes(need);
          if constexpr (std::is_same_v<Facet, sdk::GemmFacet>) {
            std::string runs;
            for (const auto& d : backend.capabilities().gemm_inputs)
              runs += (runs.empty() ? "" : ", ") + std::string(sdk::dtype_name(d.dtype));
            if (!runs.empty()) why += " (its GEMM inputs: " + runs + ")";
          }
          return why;
        }
        return std::nullopt;
      },
      need.op);
}

sdk::GemmFacet& gemm_of(sdk::DeviceBackend& b) {
  return required<sdk::GemmFacet>(b);
}
sdk::ActivationFacet& activation_of(sdk::DeviceBackend& b) {
  return required<sdk::ActivationFacet>(b);
}
sdk::ResidualFacet* residual_of(sdk::DeviceBackend& b) {
  return sdk::facet<sdk::ResidualFacet>(b);
}
sdk::GradientCheckFacet& gradient_check_of(sdk::DeviceBackend& b) {
  return required<sdk::GradientCheckFacet>(b);
}
sdk::ForeachFacet& foreach_of(sdk::DeviceBackend& b) {
  return required<sdk::ForeachFacet>(b);
}
sdk::LayerNormFacet& layer_norm_of(sdk::DeviceBackend& b) {
  return required<sdk::LayerNormFacet>(b);
}
sdk::BatchNormFacet& batch_norm_of(sdk::DeviceBackend& b) {
  return required<sdk::BatchNormFacet>(b);
}
sdk::LossFacet& loss_of(sdk::DeviceBackend& b) {
  return required<sdk::LossFacet>(b);
}
sdk::AttentionFacet& attention_of(sdk::DeviceBackend& b) {
  return required<sdk::AttentionFacet>(b);
}
sdk::EmbeddingFacet& embedding_of(sdk::DeviceBackend& b) {
  return required<sdk::EmbeddingFacet>(b);
}
sdk::ConvolutionFacet& convolution_of(sdk::DeviceBackend& b) {
  return required<sdk::ConvolutionFacet>(b);
}
sdk::DropoutFacet& dropout_of(sdk::DeviceBackend& b) {
  return required<sdk::DropoutFacet>(b);
}

}  // namespace mixtrain::core
