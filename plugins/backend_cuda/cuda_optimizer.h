// Launchers of the optimizer facet's fused SGD / AdamW kernels (cuda_optimizer.cu), every parameter
// in one multi-tensor launch (kernels::Chunk tables uploaded by the caller), refreshing the
// low-precision working copies too. Contract: cuda_kernel_types.h's; per element
// cuda_element_math.h's steps, bit for bit the CPU backend's.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda_gradient_check.h"
#include "cuda_kernel_types.h"
#include "mixtrain/sdk/support/adamw_step_constants.h"

namespace mixtrain::backend_cuda::kernels {

struct ParamRef {
  float* master;
  const float* grad;
  void* working;  // nullable
  float* state1;  // nullable
  float* state2;  // nullable
  Elem working_type;
  int pad;
};

// A gated update (OptimizerFacet 1.1) reads the check's status on the device: it writes nothing
// when found_inf is set, else it replaces grad_scale by the clipping coefficient
// (sdk/support/gradient_clipping.h) of the status's Σ g² at max_norm. status == nullptr: an
// ungated update with the args' grad_scale.
struct UpdateGate {
  const StatusRecord* status;
  double max_norm;
};

struct SgdArgs {
  float lr, momentum, dampening, weight_decay, grad_scale;
  bool nesterov, first_step, use_momentum;
};
cudaError_t sgd_update(const SgdArgs& h, const UpdateGate& gate, const ParamRef* params,
                       const Chunk* chunks, int num_chunks, cudaStream_t stream);

// The call's constants, derived on the host (sdk::adamw_step_constants).
using AdamWArgs = sdk::AdamWStepConstants;
cudaError_t adamw_update(const AdamWArgs& h, const UpdateGate& gate, const ParamRef* params,
                         const Chunk* chunks, int num_chunks, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
