// GraphPlan: the immutable plan of a model graph, built once from a ModelSpec — each node's
// inputs, per-sample shape, layout, memory root and gradient need; the weight ties; the
// fusion rewrites already applied to the ops.
//
// Contract
// - build() creates the op objects (returned to the caller, who owns them; node i of the plan is
//   ops[i], in forward order) and the plan. Spec errors (unknown op, bad sizes or shapes,
//   duplicate names, dangling inputs, cycles, two outputs, the logits not [classes] or
//   [T, classes], a tie to a missing parameter or of another shape) raise sdk::ConfigError at
//   the node's file:line:col.
// - readers(i): the nodes that read node i's output, found once at build() (the memory plans ask
//   per node; scanning every later node each time made planning quadratic in the depth).
// - Freezing: build() resolves ModelSpec::freeze (graph/freezing.h) over the ops' parameters,
//   marks the frozen ones on their owners (Layer::freeze) and plans needs_grad from what trains;
//   a pattern that matches nothing is a ConfigError at its line.
// - Shapes are per sample (batch excluded). A node's output [d1..dk] is seen by row-wise ops as
//   rows_per_sample = d1·..·d(k-1) rows of dk; shape_of() gives a tensor's [rows, cols] for one
//   pass (Extent: a batch of samples, or a decode step).
// - root(t) is the tensor whose memory t is: itself, or for a view (reshape, flatten, a relu
//   absorbed by a batch norm) its input's root, which may be the batch.
// - Fusion rewrites, applied by build() when ModelSpec::fuse_epilogues: a relu read only by a
//   batch norm's output becomes a view (the norm applies it); a linear read only by a relu/gelu
//   takes it as its GEMM epilogue (switchable later through Layer::set_fusion).
// - Nothing here touches a device; the plan never changes after build().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/model_spec.h"
#include "mixtrain/core/graph/tensor_id.h"

namespace mixtrain::core {

struct PlannedNode {
  std::vector<TensorId> inputs;       // in the order the op reads them
  std::vector<std::int64_t> shape;    // per-sample output shape
  std::int64_t rows_per_sample = 1;   // product of shape[0..k-2]
  bool channels_last = false;         // an image stored [H, W, C] per sample
  TensorId root = TensorId::batch();  // the tensor whose memory this output is
  bool needs_grad = false;            // some trainable parameter lies upstream (or here)
  sdk::SourceLocation where;          // the node's table in the config, for plan-time errors
  std::string key;                    // "model.nodes[3]"
};

// Node `user` (a forward position) uses the parameter named `source` ("embed.weight") as its own
// `suffix` ("weight").
struct WeightTie {
  std::size_t user = 0;
  std::string suffix, source;
};

class GraphPlan {
 public:
  static GraphPlan build(const ModelSpec& spec, std::int64_t input_features, std::int32_t classes,
                         const InputSpec& input, std::vector<std::unique_ptr<Layer>>& ops);

  std::size_t size() const { return nodes_.size(); }
  const PlannedNode& node(std::size_t position) const { return nodes_[position]; }
  const std::vector<PlannedNode>& nodes() const { return nodes_; }
  const std::vector<WeightTie>& ties() const { return ties_; }
  // The logits: the one node no other reads, last in forward order.
  TensorId logits() const { return TensorId::node(nodes_.size() - 1); }
  TensorId root(TensorId t) const { return t.is_batch() ? t : nodes_[t.position()].root; }
  // The nodes whose inputs name node `position`'s output, in forward order, each once (a node
  // reading it twice is listed once).
  const std::vector<std::size_t>& readers(std::size_t position) const { return readers_[position]; }
  bool needs_grad(TensorId t) const { return t.is_node() && nodes_[t.position()].needs_grad; }

  // Whether a tensor read several times sums its gradient in FP32 (ModelSpec::fp32_gradient_sums;
  // keep_fp32_gradient_sums() when the backend cannot add in 16 bits).
  bool fp32_gradient_sums() const { return fp32_gradient_sums_; }
  void keep_fp32_gradient_sums() { fp32_gradient_sums_ = true; }

  std::int64_t input_features() const { return input_features_; }
  std::int32_t classes() const { return classes_; }
  const InputSpec& input() const { return input_; }

  std::int64_t rows(TensorId t, Extent e) const;
  std::int64_t cols(TensorId t, Extent e) const;
  sdk::Shape shape_of(TensorId t, Extent e) const { return {rows(t, e), cols(t, e)}; }

 private:
  std::vector<PlannedNode> nodes_;
  std::vector<WeightTie> ties_;
  std::vector<std::vector<std::size_t>> readers_;  // per node, after the fusion rewrites
  bool fp32_gradient_sums_ = true;
  std::int64_t input_features_ = 0;
  std::int32_t classes_ = 0;
  InputSpec input_;
};

}  // namespace mixtrain::core
