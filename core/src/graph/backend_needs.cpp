#include "mixtrain/core/graph/backend_needs.h"

#include <stdexcept>
#include <type_traits>
#include <utility>

namespace mixtrain::core {

namespace {

sdk::GemmFacet* facet_for(sdk::DeviceBackend& b, sdk::GemmOp) {
  return b.gemm_facet();
}
sdk::ElementwiseFacet* facet_for(sdk::DeviceBackend& b, sdk::ElementwiseOp) {
  return b.elementwise_facet();
}
sdk::NormalizationFacet* facet_for(sdk::DeviceBackend& b, sdk::NormalizationOp) {
  return b.normalization_facet();
}
sdk::LossFacet* facet_for(sdk::DeviceBackend& b, sdk::LossOp) {
  return b.loss_facet();
}
sdk::OptimizerFacet* facet_for(sdk::DeviceBackend& b, sdk::OptimizerOp) {
  return b.optimizer_facet();
}
sdk::AttentionFacet* facet_for(sdk::DeviceBackend& b, sdk::AttentionOp) {
  return b.attention_facet();
}
sdk::EmbeddingFacet* facet_for(sdk::DeviceBackend& b, sdk::EmbeddingOp) {
  return b.embedding_facet();
}
sdk::ConvolutionFacet* facet_for(sdk::DeviceBackend& b, sdk::ConvolutionOp) {
  return b.convolution_facet();
}

template <class Facet>
Facet& required(Facet* facet) {
  if (facet == nullptr)
    throw std::logic_error("the backend has no " + std::string(Facet::kName) +
                           " facet, and the plan did not stop before calling it");
  return *facet;
}

}  // namespace

std::string need_op_name(const BackendNeed& need) {
  return std::visit(
      [](auto op) {
        using Facet =
            std::remove_pointer_t<decltype(facet_for(std::declval<sdk::DeviceBackend&>(), op))>;
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
        auto* facet = facet_for(backend, op);
        using Facet = std::remove_pointer_t<decltype(facet)>;
        const std::string name(Facet::kName);
        if (facet == nullptr) return "it has no " + name + " facet";
        if (facet->version() != Facet::kVersion)
          return "its " + name + " facet is version " + std::to_string(facet->version()) +
                 ", this host speaks version " + std::to_string(Facet::kVersion);
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
  return required(b.gemm_facet());
}
sdk::ElementwiseFacet& elementwise_of(sdk::DeviceBackend& b) {
  return required(b.elementwise_facet());
}
sdk::NormalizationFacet& normalization_of(sdk::DeviceBackend& b) {
  return required(b.normalization_facet());
}
sdk::LossFacet& loss_of(sdk::DeviceBackend& b) {
  return required(b.loss_facet());
}
sdk::AttentionFacet& attention_of(sdk::DeviceBackend& b) {
  return required(b.attention_facet());
}
sdk::EmbeddingFacet& embedding_of(sdk::DeviceBackend& b) {
  return required(b.embedding_facet());
}
sdk::ConvolutionFacet& convolution_of(sdk::DeviceBackend& b) {
  return required(b.convolution_facet());
}

}  // namespace mixtrain::core
