// The op table: every op a model config can name, one entry per op, registered in one place
// (op_registry.cpp). Adding an op is one file under core/src/graph/ops/ with its layer class and
// its OpDefinition, one line in the table, and its tests (docs/model-graph.md).
//
// Contract
// - find_op(type) returns the op's definition or nullptr; op_types() lists the types in table
//   order (the order error messages and docs use).
// - schema() declares the op's options besides the host's keys (type, name, inputs, shape). The
//   config resolves a node's options against it; only the op's build() reads them.
// - build() gets the node's spec and its inputs' per-sample shapes (batch excluded; the count is
//   already checked against min_inputs / max_inputs) and returns the layer and its per-sample
//   output shape. Inputs it cannot take raise OpSpecError, which the model reports at the node's
//   config line with its name and op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/model_spec.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

using PerSampleShape = std::vector<std::int64_t>;

// How a tensor's memory holds its per-sample shape. plain: row-major in the shape's order (every
// tensor but images). channels_last: an image [C, H, W] stored [H, W, C] per sample, the layout
// the convolution facet works in (sdk/backend_convolution.h); the shape stays [C, H, W], as
// PyTorch's channels_last tensors do. Element-wise ops keep their input's layout; ops that read
// channels-last images say so (OpDefinition::reads_images); a flatten or reshape of one permutes
// back to plain, so what follows sees PyTorch's order.
enum class TensorLayout { plain, channels_last };

// `key` is the node key the error is about ("out", "shape"; empty for the node itself).
struct OpSpecError : std::runtime_error {
  OpSpecError(std::string key_, const std::string& what, std::string hint_)
      : std::runtime_error(what), key(std::move(key_)), hint(std::move(hint_)) {}
  std::string key, hint;
};

struct BuiltOp {
  std::unique_ptr<Layer> layer;
  PerSampleShape shape;
  TensorLayout layout = TensorLayout::plain;
};

// What build() sees of a node.
struct OpNode {
  const std::string& name;
  const sdk::Options& options;  // resolved against the op's schema
  const PerSampleShape& shape;  // the node's `shape = [...]` (takes_shape ops), else empty
  std::span<const PerSampleShape> inputs;  // per-sample shapes, batch excluded
  std::span<const TensorLayout> layouts;   // each input's layout
};

struct OpDefinition {
  std::string type;
  std::string summary;                         // one line, for `mixtrain check` and docs
  std::size_t min_inputs = 1, max_inputs = 1;  // max_inputs 0: any number
  bool takes_shape = false;                    // reads the node's `shape = [...]`
  bool has_parameters = false;
  bool reads_token_ids = false;  // its input is the int32 ids of a token data source (embedding)
  // Element-wise (relu, gelu, add): works on any layout, its output keeps its inputs' (which must
  // agree).
  bool keeps_layout = false;
  // Reads images [C, H, W] in either layout (conv2d, batchnorm2d, pooling, flatten, reshape).
  // Other ops reject a channels-last input at plan time, and see the batch of an image data
  // source flattened to [C·H·W] (a linear on MNIST), where these see it as [C, H, W].
  bool reads_images = false;
  // Its output may be computed again from its inputs for the backward instead of being kept
  // (model.recompute, memory_plan.h): its forward gives the same bits on every run, moves no
  // state a second run would move again (a batch norm's running statistics) and needs no step
  // workspace. What it keeps for its own backward (a layer norm's statistics, attention's
  // log-sum-exp, FP8 copies) it writes again with the same values. Where it runs another op in
  // its pass (a linear's gelu epilogue) it is kept instead.
  bool recomputable = false;
  sdk::OptionSchema (*schema)() = nullptr;  // nullptr: no options
  BuiltOp (*build)(const OpNode& node) = nullptr;
};

const OpDefinition* find_op(std::string_view type);
// The definition of `layer`'s op. A missing or unknown type is an sdk::ConfigError at the node's
// `type` key (`table` names the node: "model.nodes[3]"), with a "did you mean", the ops, and
// `more_hint` appended to the hint.
const OpDefinition& require_op(const LayerSpec& layer, const std::string& table,
                               const std::string& more_hint = {});
const std::vector<std::string>& op_types();
// The types whose definition is recomputable (model.recompute), in table order.
std::vector<std::string> recomputable_op_types();
// Adds an op to the table (or replaces the one of its type): tests register test-only ops (one
// with a buffer, one that records its mode). Not thread-safe; register before building models.
void register_op(OpDefinition op);

// Each op's definition, defined in the op's own file.
OpDefinition linear_op();
OpDefinition relu_op();
OpDefinition gelu_op();
OpDefinition layernorm_op();
OpDefinition add_op();
OpDefinition reshape_op();
OpDefinition flatten_op();
OpDefinition embedding_op();
OpDefinition position_embedding_op();
OpDefinition attention_op();
OpDefinition conv2d_op();
OpDefinition batchnorm2d_op();
OpDefinition maxpool2d_op();
OpDefinition avgpool2d_op();
OpDefinition global_avgpool_op();
OpDefinition dropout_op();

}  // namespace mixtrain::core
