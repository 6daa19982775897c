// locate_first_nonfinite: a checked replay of one step; see diagnostics.h for the contract.
#include <cmath>
#include <string>
#include <vector>

#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/graph/diagnostics.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {

// Epilogue fusion off for one replay, then back as it was (the model's setting, not whether it
// has fused pairs: a model with none has fusion on all the same, which its layers' gradient
// accumulation reads).
class UnfusedForReplay {
 public:
  explicit UnfusedForReplay(Model& model) : model_(model), was_on_(model.epilogue_fusion()) {
    model_.set_epilogue_fusion(false);
  }
  ~UnfusedForReplay() { model_.set_epilogue_fusion(was_on_); }
  UnfusedForReplay(const UnfusedForReplay&) = delete;
  UnfusedForReplay& operator=(const UnfusedForReplay&) = delete;

 private:
  Model& model_;
  bool was_on_;
};

// The model's buffers (batch norm's running statistics) as they were before the replay: its
// training-mode forward moves them once more on the same batch, where the step's own forward
// already did, as PyTorch's one forward does. A few floats per channel, kept on the host.
class BuffersKept {
 public:
  explicit BuffersKept(Model& model) : backend_(model.backend()), buffers_(model.buffers()) {
    kept_.reserve(buffers_.size());
    for (const ModelBuffer* b : buffers_) {
      kept_.emplace_back(static_cast<std::size_t>(b->value.shape().numel()));
      backend_.copy_to_host(kept_.back().data(), b->value.view());
    }
  }
  void restore() {
    for (std::size_t i = 0; i < buffers_.size(); ++i)
      backend_.copy_from_host(buffers_[i]->value.view(), kept_[i].data());
  }

 private:
  sdk::DeviceBackend& backend_;
  std::vector<ModelBuffer*> buffers_;
  std::vector<std::vector<float>> kept_;
};

NonfiniteSite replay_checked(Model& model, std::int64_t rows, float grad_scale);

}  // namespace

NonfiniteSite locate_first_nonfinite(Model& model, std::int64_t rows, float grad_scale) {
  BuffersKept buffers(model);
  NonfiniteSite found;
  try {
    UnfusedForReplay unfused(model);
    found = replay_checked(model, rows, grad_scale);
  } catch (...) {
    try {
      buffers.restore();
    } catch (...) {  // the replay's own error is the one to report
    }
    throw;
  }
  buffers.restore();
  return found;
}

std::string first_nonfinite_parameter(Model& model) {
  std::vector<TensorView> stored;
  std::vector<const ModelParameter*> owners;
  for (const ModelParameter* p : model.parameters()) {
    if (p->quantized()) continue;
    stored.push_back(p->value());
    owners.push_back(p);
  }
  if (stored.empty()) return {};
  const int first =
      model.facets().call(sdk::GradientCheckOp::first_nonfinite)->first_nonfinite(stored);
  return first < 0 ? std::string() : owners[static_cast<std::size_t>(first)]->name;
}

namespace {

NonfiniteSite replay_checked(Model& model, std::int64_t rows, float grad_scale) {
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

}  // namespace

}  // namespace mixtrain::core
