// Tensor Core alignment lint for `mixtrain check`: under a 16-bit or FP8 plan, GEMM and
// convolution dimensions that are not multiples of 8 (16 for FP8) leave Tensor Cores idle or run
// padded (cuBLASLt, cuDNN). One warning per node, naming it and the dimension. `check` gives them
// as warnings on a backend that declares kFeatureGemmWantsAlignedRows (CUDA), and as notes about a
// CUDA run elsewhere: a CPU's GEMMs run any size at one rate.
//
// Contract
// - Reads each layer's tensor_core_dims() (linear: in and out features; conv2d: input and output
//   channels) when its plan's GEMM input dtype is not fp32 / tf32.
// - A linear layer's dimension on a backend that declares kFeatureGemmRealignsRows
//   (sdk/support/backend_features.h: its GEMM facet copies unaligned rows into padded scratch)
//   is still reported, saying so: what the backend did about it, and what it costs.
// - The chunked loss's logits node whose blocks are padded to aligned columns
//   (model.loss_pad_classes) is not reported for its class count: its GEMMs never see it.
// - A convolution reading the batch itself (the first layer, typically 3 RGB channels) is still
//   reported, with a note that this is the usual exception (frameworks pad it; it is one layer).
#pragma once

#include <string>
#include <vector>

#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {

std::vector<std::string> tensor_core_warnings(const Model& model);

}  // namespace mixtrain::core
