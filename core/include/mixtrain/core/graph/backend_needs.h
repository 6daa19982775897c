// Backend needs: which facet op, on which dtypes, a node (or the training step) will call.
//
// Contract
// - Ops ask for their needs before the first step (Model::allocate); unmet() says why the
//   backend cannot meet one — no facet of that name, a facet older than the version this host
//   was built against (an older one lacks methods the host calls; a newer one only appends, so
//   it serves), or supports() answered no — so the plan stops there with the node, the op, the
//   dtypes and the backend named.
// - At run time a call reaches its facet through gemm_of()/activation_of()/...: a facet the plan
//   did not check is a bug in the host (std::logic_error), not a user error. residual_of() is the
//   exception: the residual facet is optional, so it returns nullptr when there is none.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

struct BackendNeed {
  std::variant<sdk::GemmOp, sdk::ActivationOp, sdk::ResidualOp, sdk::GradientCheckOp,
               sdk::ForeachOp, sdk::LayerNormOp, sdk::BatchNormOp, sdk::LossOp, sdk::OptimizerOp,
               sdk::AttentionOp, sdk::EmbeddingOp, sdk::ConvolutionOp, sdk::DropoutOp>
      op;
  std::vector<sdk::DType> dtypes;  // in the order the facet's op documents
};

// "layer_norm.layernorm_forward"
std::string need_op_name(const BackendNeed& need);
// "bf16, bf16, fp32"
std::string need_dtypes(const BackendNeed& need);
// Why `backend` cannot run `need` ("it has no layer_norm facet (version 1 or later)", ...), or
// nullopt when it can.
std::optional<std::string> unmet(sdk::DeviceBackend& backend, const BackendNeed& need);

sdk::GemmFacet& gemm_of(sdk::DeviceBackend& backend);
sdk::ActivationFacet& activation_of(sdk::DeviceBackend& backend);
sdk::ResidualFacet* residual_of(sdk::DeviceBackend& backend);  // optional: nullptr when none
sdk::GradientCheckFacet& gradient_check_of(sdk::DeviceBackend& backend);
sdk::ForeachFacet& foreach_of(sdk::DeviceBackend& backend);
sdk::LayerNormFacet& layer_norm_of(sdk::DeviceBackend& backend);
sdk::BatchNormFacet& batch_norm_of(sdk::DeviceBackend& backend);
sdk::LossFacet& loss_of(sdk::DeviceBackend& backend);
sdk::AttentionFacet& attention_of(sdk::DeviceBackend& backend);
sdk::EmbeddingFacet& embedding_of(sdk::DeviceBackend& backend);
sdk::ConvolutionFacet& convolution_of(sdk::DeviceBackend& backend);
sdk::DropoutFacet& dropout_of(sdk::DeviceBackend& backend);

}  // namespace mixtrain::core
