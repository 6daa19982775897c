// Backend needs: which facet op, on which dtypes, a node (or the training step) will call.
//
// Contract
// - Ops ask for their needs before the first step (Model::allocate); unmet() says why the
//   backend cannot meet one — no such facet, another facet version, or supports() answered no —
//   so the plan stops there with the node, the op, the dtypes and the backend named.
// - At run time a call reaches its facet through gemm_of()/elementwise_of()/...: a facet the plan
//   did not check is a bug in the host (std::logic_error), not a user error.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

struct BackendNeed {
  std::variant<sdk::GemmOp, sdk::ElementwiseOp, sdk::NormalizationOp, sdk::LossOp, sdk::OptimizerOp,
               sdk::AttentionOp, sdk::EmbeddingOp, sdk::ConvolutionOp>
      op;
  std::vector<sdk::DType> dtypes;  // in the order the facet's op documents
};

// "normalization.layernorm_forward"
std::string need_op_name(const BackendNeed& need);
// "bf16, bf16, fp32"
std::string need_dtypes(const BackendNeed& need);
// Why `backend` cannot run `need` ("it has no normalization facet", ...), or nullopt when it can.
std::optional<std::string> unmet(sdk::DeviceBackend& backend, const BackendNeed& need);

sdk::GemmFacet& gemm_of(sdk::DeviceBackend& backend);
sdk::ElementwiseFacet& elementwise_of(sdk::DeviceBackend& backend);
sdk::NormalizationFacet& normalization_of(sdk::DeviceBackend& backend);
sdk::LossFacet& loss_of(sdk::DeviceBackend& backend);
sdk::AttentionFacet& attention_of(sdk::DeviceBackend& backend);
sdk::EmbeddingFacet& embedding_of(sdk::DeviceBackend& backend);
sdk::ConvolutionFacet& convolution_of(sdk::DeviceBackend& backend);

}  // namespace mixtrain::core
