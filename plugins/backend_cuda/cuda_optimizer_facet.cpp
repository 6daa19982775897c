// CudaOptimizer: validation of the parameter lists and launch of the fused SGD / AdamW kernels.
#include "cuda_optimizer_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

#include <cmath>
#include <string>
#include <vector>

#include "cuda_access.h"
#include "cuda_optimizer.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

namespace {

void validate_param(std::string_view op, std::size_t i, const sdk::ParamTensors& p,
                    bool need_state1, bool need_state2) {
  checks().optimizer_param(op, i, p, need_state1, need_state2);
}

kernels::ParamRef param_ref(const sdk::ParamTensors& p) {
  return {p.master.as<float>(),
          p.grad.as<const float>(),
          p.working.empty() ? nullptr : p.working.data,
          p.state1.empty() ? nullptr : p.state1.as<float>(),
          p.state2.empty() ? nullptr : p.state2.as<float>(),
          elem_of(p.working.dtype),
          0};
}

// The gate as the kernels read it: the status checked, and no gate at all for a plain update.
kernels::UpdateGate device_gate(const char* op, const sdk::UpdateGate& gate) {
  checks().gradient_status(op, gate.status);
  return {static_cast<const kernels::StatusRecord*>(gate.status.data), gate.max_norm};
}

constexpr kernels::UpdateGate kUngated{nullptr, 0.0};

}  // namespace

void CudaOptimizer::sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params) {
  sgd(h, params, kUngated, "sgd_update");
}

void CudaOptimizer::sgd_update_gated(const sdk::SgdHyper& h,
                                     std::span<const sdk::ParamTensors> params,
                                     const sdk::UpdateGate& gate) {
  sgd(h, params, device_gate("sgd_update_gated", gate), "sgd_update_gated");
}

void CudaOptimizer::adamw_update(const sdk::AdamWHyper& h,
                                 std::span<const sdk::ParamTensors> params) {
  adamw(h, params, kUngated, "adamw_update");
}

void CudaOptimizer::adamw_update_gated(const sdk::AdamWHyper& h,
                                       std::span<const sdk::ParamTensors> params,
                                       const sdk::UpdateGate& gate) {
  adamw(h, params, device_gate("adamw_update_gated", gate), "adamw_update_gated");
}

void CudaOptimizer::sgd(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params,
                        const kernels::UpdateGate& gate, const char* op) {
  context_.activate();
  if (h.nesterov && (h.momentum <= 0.0f || h.dampening != 0.0f))
    fail(op,
         "nesterov needs momentum > 0 and dampening = 0 (momentum " + std::to_string(h.momentum) +
             ", dampening " + std::to_string(h.dampening) + ")",
         "set momentum > 0 and dampening = 0, or turn nesterov off (as torch.optim.SGD requires)");
  std::vector<kernels::ParamRef> refs;
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < params.size(); ++i) {
    validate_param(op, i, params[i], h.momentum != 0.0f, false);
    refs.push_back(param_ref(params[i]));
    numels.push_back(params[i].master.numel());
  }
  const kernels::ParamRef* dev_refs = nullptr;
  const kernels::Chunk* dev_chunks = nullptr;
  const int count = context_.upload_tables(refs, numels, &dev_refs, &dev_chunks, op);
  const kernels::SgdArgs args{h.lr,         h.momentum, h.dampening,  h.weight_decay,
                              h.grad_scale, h.nesterov, h.first_step, h.momentum != 0.0f};
  check_cuda(kernels::sgd_update(args, gate, dev_refs, dev_chunks, count, context_.stream), op,
             "kernel launch");
}

void CudaOptimizer::adamw(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params,
                          const kernels::UpdateGate& gate, const char* op) {
  context_.activate();
  if (h.step < 1)
    fail(op, "step = " + std::to_string(h.step) + " but it is the 1-based count of applied steps",
         "pass step >= 1 (1 on the first update)");
  std::vector<kernels::ParamRef> refs;
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < params.size(); ++i) {
    validate_param(op, i, params[i], true, true);
    refs.push_back(param_ref(params[i]));
    numels.push_back(params[i].master.numel());
  }
  // The constants of the CPU reference's update, one definition (sdk/support).
  const kernels::AdamWArgs args = sdk::adamw_step_constants(h);
  const kernels::ParamRef* dev_refs = nullptr;
  const kernels::Chunk* dev_chunks = nullptr;
  const int count = context_.upload_tables(refs, numels, &dev_refs, &dev_chunks, op);
  check_cuda(kernels::adamw_update(args, gate, dev_refs, dev_chunks, count, context_.stream), op,
             "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::OptimizerFacet, CudaOptimizer> kCudaOptimizerRegistration;

}  // namespace mixtrain::backend_cuda
