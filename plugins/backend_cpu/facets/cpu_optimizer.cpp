// CpuOptimizer: the CPU backend's OptimizerFacet: the fused SGD / AdamW updates. Each works on a
// flat list of pieces (cpu_pieces.h) so many small parameters and a few huge ones share one
// parallel region, and each element is read and written exactly once per call. The
// low-precision working copy of a piece is refreshed right after its update, while the piece is
// still in cache, by the SDK's bulk (vectorised, RNE) encoder: the one definition of bf16/fp16
// in the project.
#include <cstring>
#include <string>

#include "cpu_access.h"
#include "cpu_context.h"
#include "cpu_optimizer_kernels.h"
#include "cpu_pieces.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "mixtrain/sdk/backend_optimizer_updates.h"
#include "mixtrain/sdk/support/facet_registry.h"
#include "mixtrain/sdk/support/gradient_clipping.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

// working[b, b+len) = master[b, b+len) in the working dtype (fp32 storage: a copy).
void refresh_working(const sdk::ParamTensors& t, std::int64_t b, std::int64_t len) {
  if (t.working.empty()) return;
  commit_chunk(t.working, b, len, t.master.as<const float>() + b);
}

void validate_param(std::string_view op, std::size_t i, const sdk::ParamTensors& p,
                    bool need_state1, bool need_state2) {
  checks().optimizer_param(op, i, p, need_state1, need_state2);
}

void sgd_piece(const SgdConstants& k, bool momentum, const sdk::ParamTensors& t, std::int64_t b,
               std::int64_t len) {
  sgd_range(k, momentum, t.master.as<float>() + b, t.grad.as<const float>() + b,
            momentum ? t.state1.as<float>() + b : nullptr, len);
  refresh_working(t, b, len);
}

void adamw_piece(const sdk::AdamWStepConstants& k, const sdk::ParamTensors& t, std::int64_t b,
                 std::int64_t len) {
  adamw_range(k, t.master.as<float>() + b, t.grad.as<const float>() + b, t.state1.as<float>() + b,
              t.state2.as<float>() + b, len);
  refresh_working(t, b, len);
}

class CpuOptimizer final : public sdk::OptimizerFacet {
 public:
  explicit CpuOptimizer(CpuContext& context) : context_(context) {}

  void sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params) override;
  void adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params) override;
  void sgd_update_gated(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params,
                        const sdk::UpdateGate& gate) override;
  void adamw_update_gated(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params,
                          const sdk::UpdateGate& gate) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::OptimizerFacet, CpuOptimizer> kRegistration;

// Runs `update` (the plain update) with h's grad_scale replaced by the gate's clipping
// coefficient, or nothing when the status holds found_inf. The status lies in host memory,
// written by the synchronous check before this call.
template <class Hyper, class Update>
void run_gated(std::string_view op, const Hyper& h, const sdk::UpdateGate& gate, Update&& update) {
  checks().gradient_status(op, gate.status);
  sdk::GradientStatus status;
  std::memcpy(&status, gate.status.data, sizeof status);
  if (status.found_inf != 0) return;
  Hyper gated = h;
  gated.grad_scale = sdk::clip_coefficient(status.sum_of_squares, gate.max_norm);
  update(gated);
}

}  // namespace

void CpuOptimizer::sgd_update_gated(const sdk::SgdHyper& h,
                                    std::span<const sdk::ParamTensors> params,
                                    const sdk::UpdateGate& gate) {
  run_gated("sgd_update_gated", h, gate, [&](const sdk::SgdHyper& g) { sgd_update(g, params); });
}

void CpuOptimizer::adamw_update_gated(const sdk::AdamWHyper& h,
                                      std::span<const sdk::ParamTensors> params,
                                      const sdk::UpdateGate& gate) {
  run_gated("adamw_update_gated", h, gate,
            [&](const sdk::AdamWHyper& g) { adamw_update(g, params); });
}

void CpuOptimizer::sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params) {
  context_.use_threads();
  if (h.nesterov && (h.momentum <= 0.0f || h.dampening != 0.0f))
    fail("sgd_update",
         "nesterov needs momentum > 0 and dampening = 0 (momentum " + std::to_string(h.momentum) +
             ", dampening " + std::to_string(h.dampening) + ")",
         "set momentum > 0 and dampening = 0, or turn nesterov off (as torch.optim.SGD requires)");
  for (std::size_t i = 0; i < params.size(); ++i)
    validate_param("sgd_update", i, params[i], h.momentum != 0.0f, false);
  const SgdConstants constants{h.lr,         h.momentum, 1.0f - h.dampening, h.weight_decay,
                               h.grad_scale, h.nesterov, h.first_step};
  const bool momentum = h.momentum != 0.0f;
  const auto pieces = split(params.size(), [&](std::size_t t) { return params[t].master.numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces)))
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    sgd_piece(constants, momentum, params[pc.tensor], pc.begin, pc.len);
  }
}

void CpuOptimizer::adamw_update(const sdk::AdamWHyper& h,
                                std::span<const sdk::ParamTensors> params) {
  context_.use_threads();
  if (h.step < 1)
    fail("adamw_update",
         "step = " + std::to_string(h.step) +
             " but it is the 1-based count of "
             "applied steps",
         "pass step >= 1 (1 on the first update)");
  for (std::size_t i = 0; i < params.size(); ++i)
    validate_param("adamw_update", i, params[i], true, true);
  const sdk::AdamWStepConstants constants = sdk::adamw_step_constants(h);
  const auto pieces = split(params.size(), [&](std::size_t i) { return params[i].master.numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces)))
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    adamw_piece(constants, params[pc.tensor], pc.begin, pc.len);
  }
}

}  // namespace mixtrain::backend_cpu
