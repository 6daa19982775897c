// dropout: inverted dropout, as torch.nn.Dropout(p), element-wise on any shape.
//
// Contract
// - Training mode: y = x · m / (1 − p), m ~ Bernoulli(1 − p) per element, computed by the
//   backend's dropout facet (sdk/backend_dropout.h: FP32 math, one rounding into the activation
//   dtype). Evaluation mode, and p = 0 in either mode: y = x, a copy (a cast when the dtypes
//   differ), no facet call; so a p = 0 node runs on a backend without the facet.
// - The mask is never stored. It is a function of a key and the element index, and backward
//   recomputes it from the same key: dx = dy · m / (1 − p). Backward reads neither x nor y.
// - The key is deterministic:
//   - seed = derive_seed(run seed, "<node>.dropout"), taken in init_parameters (the trainer calls
//     it with the run seed on every start, resumed or not; before it, the run seed is taken as 0);
//   - stream = (optimizer step << 32) | micro-batch index, from Layer::begin_micro_batch, which
//     the model calls once per micro-batch with the trainer's step count;
//   - element i of a data-parallel replica's samples is element first · (elements per sample) + i
//     of that key (Layer::samples(), dropout_key_from_element), so a sample draws the mask it
//     draws in one process whichever rank computes it, and a run's masks do not depend on the
//     rank count. (A sample is several rows of a token model: T positions.)
//   Why the step, and not a count of forwards: the non-finite replay and the gradient-underflow
//   measurement re-run forward on the same batch and must see the same mask, and a run resumed
//   from a checkpoint restores the step count (checkpoint progress), so it continues with the
//   masks the uninterrupted run would have drawn, bit for bit. Two forwards with no
//   begin_micro_batch between them draw the same mask; so model.recompute may list dropout, its
//   forward run again in the backward (memory_plan.h).
// - Options: p in [0, 1) (default 0.5, torch's); p = 1 is refused at the config line.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

class DropoutLayer final : public Layer {
 public:
  DropoutLayer(std::string name, std::int64_t features, float p);
  float p() const { return p_; }
  // The key the next forward and backward use for a tensor of `elements` elements (the replica's
  // samples; see the contract).
  sdk::DropoutKey key(std::int64_t elements) const;
  void init_parameters(std::uint64_t seed) override;
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;

 private:
  // y = x without the facet: evaluation mode and p = 0.
  void pass_through(sdk::TensorView from, sdk::TensorView to);
  float p_;
  std::uint64_t seed_;
};

// The key whose element i is `key`'s element first + i (sdk::dropout_keeps), with key's stream.
sdk::DropoutKey dropout_key_from_element(sdk::DropoutKey key, std::uint64_t first);

}  // namespace mixtrain::core
