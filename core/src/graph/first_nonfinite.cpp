// locate_first_nonfinite: a checked replay of one step; see diagnostics.h for the contract.
#include <cmath>
#include <string>

#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/graph/diagnostics.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {

// Epilogue fusion off for one replay, then back as it was.
class UnfusedForReplay {
 public:
  explicit UnfusedForReplay(Model& model) : model_(model), was_on_(model.fused_pairs() > 0) {
    model_.set_epilogue_fusion(false);
  }
  ~UnfusedForReplay() { model_.set_epilogue_fusion(was_on_); }
  UnfusedForReplay(const UnfusedForReplay&) = delete;
  UnfusedForReplay& operator=(const UnfusedForReplay&) = delete;

 private:
  Model& model_;
  bool was_on_;
};

}  // namespace

NonfiniteSite locate_first_nonfinite(Model& model, std::int64_t rows, float grad_scale) {
  UnfusedForReplay unfused(model);
  Executor& exec = model.executor();
  const GraphPlan& plan = model.plan();
  auto bad = [&](TensorView v) {
    const TensorView one[1] = {v};
    return model.facets().call(sdk::GradientCheckOp::first_nonfinite)->first_nonfinite(one) >= 0;
  };
  const Extent e = Extent::batch_of(rows);
  const GradientBuffers grads = exec.planned_gradients();
  exec.start_gradients();  // this micro-batch's gradients alone, so each check sees its own writes
  // Token ids are integers: nothing to check.
  if (plan.input().dtype != DType::int32 && bad(exec.input(rows))) return {"input batch", ""};
  NonfiniteSite found;
  const auto& ops = model.layers();
  exec.forward(e, [&](std::size_t i) {
    if (!bad(exec.activation(TensorId::node(i), e))) return true;
    found = {"forward " + ops[i]->name() + ".output", ops[i]->name()};
    return false;
  });
  if (!found.where.empty()) return found;
  const std::string& head = ops[plan.root(plan.logits()).position()]->name();
  if (exec.loss_chunking().rows > 0) {
    // The chunked loss: each block's logits, then its gradient, before the next block.
    exec.compute_loss(rows, grad_scale, model.label_smoothing(), grads,
                      [&](LossBlockPart part, std::int64_t first, TensorView block) {
                        if (!bad(block)) return true;
                        const std::string at =
                            " (the loss block from row " + std::to_string(first) + ")";
                        found = part == LossBlockPart::logits
                                    ? NonfiniteSite{"forward " + head + ".output" + at, head}
                                    : NonfiniteSite{"backward loss gradient (logits)" + at, head};
                        return false;
                      });
    if (!found.where.empty()) return found;
    if (!std::isfinite(exec.read_loss().loss)) return {"loss", ""};
  } else {
    exec.compute_loss(rows, grad_scale, model.label_smoothing(), grads);
    if (!std::isfinite(exec.read_loss().loss)) return {"loss", ""};
    if (bad(exec.gradient(plan.logits(), e, grads)))
      return {"backward loss gradient (logits)", head};
  }
  exec.backward(e, grads, /*last_micro_batch=*/false,
                [&](std::size_t i, std::span<const TensorView> dxs) {
                  for (ModelParameter* p : ops[i]->used_parameters())
                    if (!p->frozen && bad(p->grad.view())) {
                      found = {"backward " + p->name + ".grad", ops[i]->name()};
                      return false;
                    }
                  for (const TensorView& dx : dxs)
                    if (!dx.empty() && bad(dx)) {
                      found = {"backward " + ops[i]->name() + " input gradient", ops[i]->name()};
                      return false;
                    }
                  return true;
                });
  return found;
}

}  // namespace mixtrain::core
