#include "mixtrain/core/graph/model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <set>

#include "config/reading.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"
#include "graph/ops/view.h"
#include "mixtrain/core/graph/random.h"
#include "mixtrain/core/graph/topology.h"
#include "mixtrain/sdk/float_formats.h"
#include "profiling/profile_scope.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

using ops::storage_of;

namespace {

bool flushes_to_zero(float v, DType dt) {
  switch (dt) {
    case DType::fp16:
      return sdk::decode_fp16(sdk::encode_fp16(v)) == 0.0f;
    case DType::bf16:
      return sdk::decode_bf16(sdk::encode_bf16(v)) == 0.0f;
    case DType::fp8_e4m3:
      return sdk::decode_fp8_e4m3(sdk::encode_fp8_e4m3(v, sdk::Overflow::saturate)) == 0.0f;
    case DType::fp8_e5m2:
      return sdk::decode_fp8_e5m2(sdk::encode_fp8_e5m2(v, sdk::Overflow::saturate)) == 0.0f;
    default:
      return false;
  }
}
}  // namespace

namespace {

using ops::shape_text;

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

}  // namespace

sdk::Options layer_options(const LayerSpec& layer, const std::string& table) {
  const OpDefinition& op = require_op(layer, table);
  return sdk::Options::resolve(table, op.schema ? op.schema() : sdk::OptionSchema{}, layer.options,
                               layer.where, {"type", "name"});
}

Model::Model(std::shared_ptr<sdk::DeviceBackend> backend, const ModelSpec& spec,
             std::int64_t input_features, std::int32_t classes, InputSpec input)
    : backend_(std::move(backend)),
      input_features_(input_features),
      classes_(classes),
      input_spec_(input) {
  const std::string list = spec.graph ? "model.nodes" : "model.layers";
  if (spec.layers.empty())
    throw sdk::ConfigError(spec.where, list, "the model has no layers",
                           "add layers = [ { type = \"linear\", out = 10 } ]");
  if (spec.loss != "softmax_cross_entropy")
    throw sdk::ConfigError(spec.where, "model.loss", "unknown loss '" + spec.loss + "'",
                           "the supported loss is \"softmax_cross_entropy\"");
  // Names (the sequential form numbers unnamed layers) and the topology.
  std::vector<GraphNodeSpec> graph;
  std::set<std::string> names;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const auto& l = spec.layers[i];
    std::string name = l.name.empty() ? l.type + std::to_string(i) : l.name;
    if (!spec.graph && !names.insert(name).second)
      throw sdk::ConfigError(l.where, list + "[" + std::to_string(i) + "].name",
                             "duplicate layer name '" + name + "'",
                             "layer names must be unique; overrides and logs refer to them");
    std::vector<std::string> inputs = l.inputs;
    if (!spec.graph) inputs = {i == 0 ? std::string(kGraphInput) : graph.back().name};
    graph.push_back({name, inputs, l.where});
  }
  const GraphTopology topo = plan_graph_topology(graph, {kGraphInput});

  // Ops in forward order, with shapes inferred from the inputs'.
  // layers_ is in forward order: a node's index there is its topo.position.
  const std::size_t n = spec.layers.size();
  nodes_.resize(n);
  for (std::size_t pos = 0; pos < n; ++pos) {
    const std::size_t i = topo.order[pos];
    const auto& l = spec.layers[i];
    const std::string& name = graph[i].name;
    const std::string key = l.table.empty() ? list + "[" + std::to_string(i) + "]" : l.table;
    Node& node = nodes_[pos];
    node.where = l.where;
    node.key = key;
    for (const GraphSource& src : topo.sources[i])
      node.inputs.push_back(src.is_node ? static_cast<int>(topo.position[src.index]) : -1);
    auto shape_of = [&](int t) {
      return t < 0 ? std::vector<std::int64_t>{input_features}
                   : nodes_[static_cast<std::size_t>(t)].shape;
    };
    auto bad = [&](const std::string& what, const std::string& hint) {
      return sdk::ConfigError(l.where, key, "node '" + name + "' (" + l.type + "): " + what, hint);
    };
    const OpDefinition* op = &require_op(l, key);
    const std::size_t count = node.inputs.size();
    if (count < op->min_inputs || (op->max_inputs != 0 && count > op->max_inputs))
      throw bad(op->max_inputs == 1 ? "takes one input, got " + std::to_string(count)
                                    : "adds two or more inputs, got " + std::to_string(count),
                op->max_inputs == 1 ? "give it inputs = [\"<node>\"]"
                                    : "give it inputs = [\"<a>\", \"<b>\"]");
    if (!op->takes_shape && !l.shape.empty())
      throw sdk::ConfigError(l.where, key + ".shape",
                             "unknown key 'shape' for a " + l.type + " node",
                             "shape belongs to reshape nodes");
    const bool reads_ids =
        std::find(node.inputs.begin(), node.inputs.end(), -1) != node.inputs.end();
    if (reads_ids && op->reads_token_ids != (input.dtype == DType::int32))
      throw bad(op->reads_token_ids
                    ? "reads token ids, but the data gives " + std::to_string(input_features) +
                          " float features per sample"
                    : "reads the batch, which holds int32 token ids: only an embedding can",
                op->reads_token_ids
                    ? "use a token data source (data.source = \"tokens\" or \"text\")"
                    : "feed the input to an embedding node first, e.g. { type = \"embedding\", "
                      "vocab = " +
                          std::to_string(classes) + ", dim = 128 }");
    if (op->reads_token_ids && !reads_ids)
      throw bad(
          "reads token ids, so its input must be the batch itself, not another node's "
          "output",
          "give it inputs = [\"input\"] (an embedding starts the model)");
    const sdk::Options options = layer_options(l, key);
    std::vector<PerSampleShape> in_shapes;
    std::vector<TensorLayout> in_layouts;
    bool any_channels_last = false, any_plain = false;
    for (std::size_t k = 0; k < count; ++k) {
      const int t = node.inputs[k];
      const bool image_batch = t < 0 && op->reads_images && !input.sample_shape.empty();
      in_shapes.push_back(image_batch ? input.sample_shape : shape_of(t));
      const bool cl = t >= 0 && nodes_[static_cast<std::size_t>(t)].channels_last;
      in_layouts.push_back(cl ? TensorLayout::channels_last : TensorLayout::plain);
      (cl ? any_channels_last : any_plain) = true;
      if (cl && !op->reads_images && !op->keeps_layout)
        throw bad("reads '" + graph[i].inputs[k] + "', a channels-last image " +
                      shape_text(in_shapes.back()) + ", but a " + l.type +
                      " works on plain tensors",
                  "flatten it first (a flatten permutes an image back to PyTorch's [C, H, W] "
                  "order), or end the convolutions with a global_avgpool");
    }
    if (op->keeps_layout && any_channels_last && any_plain)
      throw bad(
          "adds a channels-last image (a convolution's, norm's or pool's output) to a plain "
          "tensor",
          "give both inputs the same origin: e.g. reshape neither, or flatten both");
    BuiltOp built;
    try {
      built = op->build(OpNode{name, options, l.shape, in_shapes, in_layouts});
    } catch (const OpSpecError& e) {
      std::string what = e.what();
      // "input k" in an op's message names the config's input there.
      for (std::size_t k = count; k >= 1; --k)
        what = replace_all(what, "input " + std::to_string(k) + " ",
                           "input '" + graph[i].inputs[k - 1] + "' ");
      throw sdk::ConfigError(l.where, e.key.empty() ? key : key + "." + e.key,
                             "node '" + name + "' (" + l.type + "): " + what, e.hint);
    }
    node.channels_last =
        op->keeps_layout ? any_channels_last : built.layout == TensorLayout::channels_last;
    // BN + ReLU: a relu that is the only reader of an op that applies it itself (batch norm)
    // becomes a view of that op's output; the op runs the relu forward and masks backward.
    if (spec.fuse_epilogues && l.type == "relu" && count == 1 && node.inputs[0] >= 0 &&
        topo.consumers[topo.order[static_cast<std::size_t>(node.inputs[0])]].size() == 1 &&
        layers_[static_cast<std::size_t>(node.inputs[0])]->take_relu())
      built.layer = std::make_unique<ViewLayer>(name, "relu", built.layer->in_features(),
                                                built.layer->out_features());
    node.shape = std::move(built.shape);
    layers_.push_back(std::move(built.layer));
    node.rows_per_sample =
        ops::checked_product(PerSampleShape(node.shape.begin(), node.shape.end() - 1));
    const bool view = layers_.back()->is_view();
    node.root =
        view ? (node.inputs[0] < 0 ? -1 : nodes_[static_cast<std::size_t>(node.inputs[0])].root)
             : static_cast<int>(pos);
    node.needs_grad = op->has_parameters;
    for (int t : node.inputs)
      if (t >= 0 && nodes_[static_cast<std::size_t>(t)].needs_grad) node.needs_grad = true;
  }

  // One output: the logits. Every other node is read, so the logits come last in forward order.
  for (std::size_t i = 0; i < n; ++i)
    if (topo.consumers[i].empty() && topo.position[i] != n - 1)
      throw sdk::ConfigError(graph[i].where, list + "[" + std::to_string(i) + "]",
                             "node '" + graph[i].name +
                                 "' is read by no other node, and only the "
                                 "logits may be: the graph has two outputs",
                             "feed it into the graph (add, a linear, ...) or remove it");
  const Node& last = nodes_.back();
  const std::size_t last_spec = topo.order.back();
  if (input.labels_per_sample > 1) {
    // A language model: one prediction per position.
    if (last.shape.size() != 2 || last.shape[1] != classes ||
        last.shape[0] != input.labels_per_sample)
      throw sdk::ConfigError(spec.layers[last_spec].where, list,
                             "the logits node '" + graph[last_spec].name + "' is " +
                                 shape_text(last.shape) + " per sample; the loss needs [" +
                                 std::to_string(input.labels_per_sample) + ", " +
                                 std::to_string(classes) + "] (one prediction per position)",
                             "end in a linear with out = " + std::to_string(classes) +
                                 " (the vocabulary) on the [T, C] sequence");
  } else if (last.shape.size() != 1 || last.shape[0] != classes) {
    if (!spec.graph || last.shape.size() == 1)
      throw sdk::ConfigError(spec.layers[last_spec].where, list,
                             "the last layer produces " + std::to_string(last.shape.back()) +
                                 " outputs but the data has " + std::to_string(classes) +
                                 " classes",
                             "set out = " + std::to_string(classes) + " on the last linear layer");
    throw sdk::ConfigError(spec.layers[last_spec].where, list,
                           "the logits node '" + graph[last_spec].name + "' is " +
                               shape_text(last.shape) + " per sample; the loss needs [" +
                               std::to_string(classes) + "]",
                           "flatten it and end in a linear with out = " + std::to_string(classes));
  }

  // Weight tying: each shared parameter names one that its owner declares, of the same shape.
  for (std::size_t pos = 0; pos < n; ++pos) {
    const std::size_t i = topo.order[pos];
    for (const SharedParameter& sp : layers_[pos]->shared_parameters()) {
      const std::string key = list + "[" + std::to_string(i) + "]." + sp.key;
      const std::string user = "node '" + graph[i].name + "'";
      const auto dot = sp.source.rfind('.');
      std::size_t owner = n;
      if (dot != std::string::npos && dot > 0)
        for (std::size_t q = 0; q < n; ++q)
          if (layers_[q]->name() == sp.source.substr(0, dot)) owner = q;
      const std::vector<std::int64_t> have =
          owner < n ? layers_[owner]->parameter_shape(sp.source.substr(dot + 1))
                    : std::vector<std::int64_t>{};
      if (have.empty()) {
        std::vector<std::string> known;
        for (std::size_t q = 0; q < n; ++q)
          for (const char* suffix : {"weight", "bias"})
            if (!layers_[q]->parameter_shape(suffix).empty())
              known.push_back(layers_[q]->name() + "." + suffix);
        throw sdk::ConfigError(
            sp.where, key,
            user + ": " + sp.key + " = \"" + sp.source + "\" names no parameter of the model" +
                (owner == pos ? " (a node cannot tie to itself)" : ""),
            "name a parameter another node owns as \"<node>.<param>\": " +
                (known.empty() ? std::string("the model has none") : join_names(known)));
      }
      const std::vector<std::int64_t>& want = sp.shape;
      if (have != want)
        throw sdk::ConfigError(sp.where, key,
                               user + " (" + layers_[pos]->type() + ") ties its " + sp.suffix +
                                   " " + shape_text(want) + " to '" + sp.source + "' of node '" +
                                   layers_[owner]->name() + "', which is " + shape_text(have),
                               "tied parameters must have one shape: size node '" + graph[i].name +
                                   "' so that its " + sp.suffix + " is " + shape_text(have));
      ties_.push_back({pos, sp.suffix, sp.source});
    }
  }

  // Epilogue fusion, as a rewrite: a linear read only by a relu/gelu runs it as its epilogue.
  for (std::size_t pos = 0; pos < n; ++pos) {
    const auto& readers = topo.consumers[topo.order[pos]];
    if (readers.size() == 1) layers_[pos]->fuse_reader(*layers_[topo.position[readers[0]]]);
  }
  set_epilogue_fusion(spec.fuse_epilogues);
}

std::int64_t Model::rows_of(int tensor, std::int64_t batch) const {
  if (decode_rows_ > 0) return tensor < 0 ? 1 : decode_rows_;
  return tensor < 0 ? batch : batch * nodes_[static_cast<std::size_t>(tensor)].rows_per_sample;
}

std::int64_t Model::features_of(int tensor) const {
  if (tensor < 0) return decode_rows_ > 0 ? decode_rows_ : input_features_;
  return nodes_[static_cast<std::size_t>(tensor)].shape.back();
}

TensorView Model::activation(int tensor, std::int64_t batch) const {
  const int root = tensor < 0 ? -1 : nodes_[static_cast<std::size_t>(tensor)].root;
  const TensorView base =
      root < 0 ? TensorView{input_.view().data, input_.dtype(),
                            sdk::Shape{rows_of(-1, batch), features_of(-1)}}
               : layers_[static_cast<std::size_t>(root)]->output(rows_of(root, batch));
  return {base.data, base.dtype, sdk::Shape{rows_of(tensor, batch), features_of(tensor)}};
}

TensorView Model::gradient(int tensor, std::int64_t batch) const {
  const auto root = static_cast<std::size_t>(nodes_[static_cast<std::size_t>(tensor)].root);
  const sdk::Shape shape{rows_of(tensor, batch), features_of(tensor)};
  const GradSlot& g = grad_slots_[root];
  if (fp32_pass_) {
    const Tensor& arena = fp32_arena_.empty() ? grad_arena_ : fp32_arena_;
    return {static_cast<std::byte*>(arena.view().data) + g.offset_fp32, DType::fp32, shape};
  }
  return {static_cast<std::byte*>(grad_arena_.view().data) + g.offset, g.dtype, shape};
}

DType Model::contribution_dtype(std::size_t reader) const {
  return storage_of(layers_[reader]->precision().activation_grad);
}

DType Model::logits_grad_dtype() const {
  // The logits' own activation dtype, as the chain stored it. Logits that view the batch itself
  // (no node computes them) need no gradient; fp32 then.
  const int root = nodes_.back().root;
  return root < 0 ? DType::fp32
                  : storage_of(layers_[static_cast<std::size_t>(root)]->precision().activation);
}

TensorView Model::scratch(std::size_t slot, DType dtype, std::int64_t rows, std::int64_t cols) {
  if (scratch_.size() <= slot) scratch_.resize(slot + 1);
  Tensor& t = scratch_[slot];
  const std::size_t need = static_cast<std::size_t>(rows * cols) * sdk::dtype_size(dtype);
  if (t.empty() || t.bytes() < need)
    t = Tensor(backend_, DType::fp32, sdk::Shape{static_cast<std::int64_t>((need + 3) / 4)});
  return {t.view().data, dtype, sdk::Shape{rows, cols}};
}

void Model::check_backend() const {
  const std::string backend = backend_->capabilities().kind;
  auto stop = [&](const Node& node, const std::string& who, const BackendNeed& need,
                  const std::string& why) {
    throw sdk::ConfigError(node.where, node.key,
                           who + " needs " + need_op_name(need) + " on " + need_dtypes(need) +
                               ", which backend '" + backend + "' does not provide: " + why,
                           "override the node's precision with [[precision.override]] layers = \"" +
                               layers_[static_cast<std::size_t>(&node - nodes_.data())]->name() +
                               "\", compute = \"fp32\" (or choose another precision.policy), or "
                               "use a backend that offers it (`mixtrain plugins` lists them)");
  };
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& op = *layers_[i];
    const Node& node = nodes_[i];
    const int in = node.inputs.empty() ? -1 : node.inputs[0];
    const DType input =
        in < 0 ? input_spec_.dtype
               : storage_of(
                     layers_[static_cast<std::size_t>(nodes_[static_cast<std::size_t>(in)].root)]
                         ->precision()
                         .activation);
    for (const BackendNeed& need : op.backend_needs(input))
      if (auto why = unmet(*backend_, need))
        stop(node, "node '" + op.name() + "' (" + op.type() + ")", need, *why);
  }
  // The loss reads the logits; several readers of one tensor accumulate their gradients in FP32.
  const BackendNeed loss{sdk::LossOp::softmax_cross_entropy, {logits_grad_dtype()}};
  if (auto why = unmet(*backend_, loss))
    stop(nodes_.back(), "the loss on node '" + layers_.back()->name() + "'", loss, *why);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const BackendNeed accumulate{sdk::ActivationOp::axpy, {contribution_dtype(i), DType::fp32}};
    if (auto why = unmet(*backend_, accumulate))
      stop(nodes_[i], "the gradient accumulation of node '" + layers_[i]->name() + "'", accumulate,
           *why);
  }
}

void Model::allocate(std::int64_t max_rows) {
  check_backend();
  max_rows_ = max_rows;
  input_ = Tensor(backend_, input_spec_.dtype, sdk::Shape{max_rows, input_features_});
  labels_ = Tensor(backend_, DType::int32, sdk::Shape{max_rows * input_spec_.labels_per_sample});
  loss_ = Tensor(backend_, DType::fp32, sdk::Shape{1});
  correct_ = Tensor(backend_, DType::int32, sdk::Shape{1});
  // Activations: one arena from their liveness plan, then each layer's own buffers.
  act_plan_ = plan_activations(max_rows);
  act_arena_ = Tensor(backend_, DType::fp32,
                      sdk::Shape{static_cast<std::int64_t>(act_plan_.arena_bytes / 4 + 1)});
  for (std::size_t i = 0, k = 0; i < layers_.size(); ++i) {
    const bool planned = layers_[i]->planned_output_bytes(max_rows * nodes_[i].rows_per_sample) > 0;
    layers_[i]->use_output_storage(planned ? static_cast<std::byte*>(act_arena_.view().data) +
                                                 act_plan_.offset[k++]
                                           : nullptr);
    layers_[i]->allocate(backend_, max_rows * nodes_[i].rows_per_sample);
  }
  bind_ties();
  set_mode(mode_);
  plan_gradients();
}

LivenessPlan Model::plan_activations(std::int64_t max_rows, std::optional<DType> as_dtype) const {
  // Schedule: forward of the node at position p is step p, the loss step n, the backward of p
  // step 2n - p. An output lives from its forward to its last read: a forward read, the backward
  // of a reader that keeps its inputs, its own backward when that reads it, the loss (logits).
  const int n = static_cast<int>(layers_.size());
  std::vector<int> last(layers_.size());
  for (int p = 0; p < n; ++p)
    last[static_cast<std::size_t>(p)] =
        layers_[static_cast<std::size_t>(p)]->backward_reads_output() ? 2 * n - p : p;
  last[static_cast<std::size_t>(nodes_.back().root)] =
      std::max(last[static_cast<std::size_t>(nodes_.back().root)], n);
  for (int q = 0; q < n; ++q) {
    const auto& reader = *layers_[static_cast<std::size_t>(q)];
    for (int t : nodes_[static_cast<std::size_t>(q)].inputs) {
      if (t < 0) continue;
      auto& l = last[static_cast<std::size_t>(nodes_[static_cast<std::size_t>(t)].root)];
      l = std::max(l, q);
      if (!reader.is_view() && reader.backward_reads_inputs()) l = std::max(l, 2 * n - q);
    }
  }
  std::vector<BufferLife> lives;
  for (int p = 0; p < n; ++p) {
    const auto i = static_cast<std::size_t>(p);
    const std::size_t bytes =
        layers_[i]->planned_output_bytes(max_rows * nodes_[i].rows_per_sample, as_dtype);
    if (bytes > 0) lives.push_back({layers_[i]->name(), bytes, p, last[i]});
  }
  return plan_liveness(lives);
}

void Model::bind_ties() {
  for (const Tie& t : ties_)
    for (auto& l : layers_)
      for (auto& p : l->parameters())
        if (p.name == t.source) layers_[t.user]->bind_shared_parameter(t.suffix, p);
  // A parameter's gradient is final after its first user's backward (backward runs in reverse).
  ready_after_.assign(layers_.size(), {});
  std::set<const ModelParameter*> seen;
  for (std::size_t i = 0; i < layers_.size(); ++i)
    for (ModelParameter* p : layers_[i]->used_parameters())
      if (seen.insert(p).second) ready_after_[i].push_back(p);
}

void Model::set_mode(Mode mode) {
  mode_ = mode;
  for (auto& l : layers_) l->set_training(mode == Mode::train);
}

void Model::start_gradients() {
  for (auto& l : layers_)
    for (auto& p : l->parameters()) p.grad_started = false;
}

void Model::begin_micro_batch(std::int64_t index, std::int64_t count) {
  if (index == 0) start_gradients();
  final_micro_batch_ = index + 1 == count;
  micro_batch_open_ = true;
  for (auto& l : layers_) l->begin_micro_batch(index);
}

void Model::plan_gradients() {
  // Backward schedule: the loss is step 0, the node at forward position p is step n - p.
  const std::size_t n = layers_.size();
  grad_slots_.assign(n, GradSlot{});
  std::vector<int> first(n, std::numeric_limits<int>::max());
  auto contribute = [&](int tensor, DType dtype, int step) {
    const int root = tensor < 0 ? -1 : nodes_[static_cast<std::size_t>(tensor)].root;
    if (root < 0 || !nodes_[static_cast<std::size_t>(root)].needs_grad) return;
    auto& g = grad_slots_[static_cast<std::size_t>(root)];
    ++g.reads;
    g.dtype = dtype;  // the reader's dtype; FP32 below when there are several readers
    first[static_cast<std::size_t>(root)] = std::min(first[static_cast<std::size_t>(root)], step);
  };
  contribute(static_cast<int>(n) - 1, logits_grad_dtype(), 0);
  for (std::size_t p = 0; p < n; ++p) {
    if (layers_[p]->is_view()) continue;
    for (int t : nodes_[p].inputs) contribute(t, contribution_dtype(p), static_cast<int>(n - p));
  }
  for (auto& g : grad_slots_)
    if (g.reads > 1) g.dtype = DType::fp32;
  // An op whose inputs' gradients are its output's (add) lends that buffer to one input read by
  // it alone, in the same dtype: the input's gradient is then written by the op's readers, and
  // the op copies nothing. The input's life starts when the output's ends (at the op's backward),
  // so the two lives become one buffer living from the first to the last. Visited from the last
  // op back, so a chain of adds shares one buffer.
  std::vector<std::size_t> shares(n);
  for (std::size_t r = 0; r < n; ++r) shares[r] = r;
  for (std::size_t p = n; p-- > 0;) {
    if (layers_[p]->is_view() || !layers_[p]->passes_gradient_through() ||
        grad_slots_[p].reads == 0)
      continue;
    for (int t : nodes_[p].inputs) {
      const int root = t < 0 ? -1 : nodes_[static_cast<std::size_t>(t)].root;
      if (root < 0 || !nodes_[static_cast<std::size_t>(root)].needs_grad) continue;
      const auto r = static_cast<std::size_t>(root);
      if (grad_slots_[r].reads != 1 || grad_slots_[r].dtype != grad_slots_[p].dtype ||
          shares[r] != r ||
          nodes_[r].rows_per_sample * nodes_[r].shape.back() !=
              nodes_[p].rows_per_sample * nodes_[p].shape.back())
        continue;
      shares[r] = shares[p];
      break;
    }
  }
  // The same lives twice: in each gradient's dtype, and all in FP32 (the underflow pass).
  std::vector<BufferLife> lives, lives_fp32;
  std::vector<std::size_t> life_of(n, 0);
  for (std::size_t r = n; r-- > 0;) {
    const auto& g = grad_slots_[r];
    if (g.reads == 0) continue;
    const auto elems =
        static_cast<std::size_t>(max_rows_ * nodes_[r].rows_per_sample * nodes_[r].shape.back());
    const int last = static_cast<int>(n - r);
    if (shares[r] != r) {
      // Later in the forward order than r: its life is already listed.
      const std::size_t k = life_of[shares[r]];
      life_of[r] = k;
      lives[k].name += "+" + layers_[r]->name() + ".grad";
      lives[k].first_step = std::min(lives[k].first_step, first[r]);
      lives[k].last_step = std::max(lives[k].last_step, last);
      lives_fp32[k].first_step = lives[k].first_step;
      lives_fp32[k].last_step = lives[k].last_step;
      continue;
    }
    life_of[r] = lives.size();
    lives.push_back(
        {layers_[r]->name() + ".grad", elems * sdk::dtype_size(g.dtype), first[r], last});
    lives_fp32.push_back({layers_[r]->name() + ".grad", elems * 4, first[r], last});
  }
  grad_plan_ = plan_liveness(lives);
  grad_plan_fp32_ = plan_liveness(lives_fp32);
  for (std::size_t r = 0; r < n; ++r) {
    if (grad_slots_[r].reads == 0) continue;
    grad_slots_[r].offset = grad_plan_.offset[life_of[r]];
    grad_slots_[r].offset_fp32 = grad_plan_fp32_.offset[life_of[r]];
  }
  std::size_t bytes = grad_plan_.arena_bytes;
  if (reserve_fp32_pass_) bytes = std::max(bytes, grad_plan_fp32_.arena_bytes);
  grad_arena_ =
      Tensor(backend_, DType::fp32,
             sdk::Shape{static_cast<std::int64_t>(std::max<std::size_t>(bytes, 4) / 4 + 1)});
}

void Model::init_parameters(std::uint64_t seed) {
  for (auto& l : layers_) l->init_parameters(seed);
  refresh_working_copies();
}

void Model::refresh_working_copies() {
  for (auto& l : layers_)
    for (auto& p : l->parameters())
      if (!p.working.empty()) backend_->cast(p.master.view(), p.working.view());
}

TensorView Model::labels(std::int64_t rows) const {
  return {labels_.view().data, DType::int32, sdk::Shape{rows * input_spec_.labels_per_sample}};
}

void Model::run_forward(std::int64_t batch, const std::function<bool(std::size_t node)>& visit) {
  std::vector<TensorView> xs;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->is_view()) continue;  // a view computes nothing
    xs.clear();
    for (int t : nodes_[i].inputs) xs.push_back(activation(t, batch));
    ProfileScope scope(profile_scope(i));
    layers_[i]->forward_inputs(xs, rows_of(static_cast<int>(i), batch));
    if (visit && !visit(i)) return;
  }
}

const char* Model::profile_scope(std::size_t node) const {
  // The logits' node (a language model's LM head) counts with the loss as the classifier.
  return node + 1 == layers_.size() ? "classifier" : layers_[node]->type().c_str();
}

void Model::forward(std::int64_t rows) {
  run_forward(rows, {});
}

void Model::begin_decode(std::int64_t capacity) {
  const std::int64_t t = input_features_;
  if (input_spec_.dtype != DType::int32 || input_spec_.labels_per_sample != t)
    throw sdk::UserError("this model does not read token ids, so it cannot generate text",
                         "sample from a language model (an embedding on a token data source)");
  for (std::size_t i = 0; i < layers_.size(); ++i)
    if (nodes_[i].rows_per_sample != t || nodes_[i].shape.size() != 2)
      throw sdk::UserError("node '" + layers_[i]->name() + "' is " +
                               ops::shape_text(nodes_[i].shape) +
                               " per sample, not one row per position, so the model cannot "
                               "decode token by token",
                           "sample from a model whose every node is [T, C] (the gpt preset)");
  if (capacity < 1 || capacity > t)
    throw sdk::UserError("a KV cache of " + std::to_string(capacity) +
                             " positions; the model was built for at most " + std::to_string(t),
                         "decode at most block_size positions at once");
  set_mode(Mode::eval);
  for (auto& l : layers_) l->begin_decode(capacity);
  decode_capacity_ = capacity;
  decode_length_ = 0;
}

std::vector<float> Model::decode(std::span<const std::int32_t> ids) {
  const auto n = static_cast<std::int64_t>(ids.size());
  if (decode_capacity_ == 0) throw std::logic_error("Model::decode before begin_decode");
  if (n < 1 || decode_length_ + n > decode_capacity_ || n > max_rows_ * input_features_)
    throw sdk::UserError("decoding " + std::to_string(n) + " more tokens after " +
                             std::to_string(decode_length_) + " overflows the KV cache of " +
                             std::to_string(decode_capacity_) + " positions",
                         "start a new cache (begin_decode) with the last tokens");
  for (std::int32_t id : ids)
    if (id < 0 || id >= classes_)
      throw sdk::UserError("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                               std::to_string(classes_) + ")",
                           "feed ids the model was trained on");
  backend_->copy_from_host({input_.view().data, DType::int32, sdk::Shape{n}}, ids.data());
  for (auto& l : layers_) l->set_decode_position(decode_length_);
  decode_rows_ = n;
  struct Reset {
    std::int64_t& rows;
    ~Reset() { rows = 0; }
  } reset{decode_rows_};
  run_forward(1, {});
  const TensorView all = activation(static_cast<int>(layers_.size()) - 1, 1);
  const TensorView last{
      static_cast<std::byte*>(all.data) +
          (n - 1) * classes_ * static_cast<std::int64_t>(sdk::dtype_size(all.dtype)),
      all.dtype, sdk::Shape{1, classes_}};
  std::vector<float> logits(static_cast<std::size_t>(classes_));
  if (last.dtype == DType::fp32) {
    backend_->copy_to_host(logits.data(), last);
  } else {
    Tensor tmp(backend_, DType::fp32, sdk::Shape{1, classes_});
    backend_->cast(last, tmp.view());
    backend_->copy_to_host(logits.data(), tmp.view());
  }
  decode_length_ += n;
  return logits;
}

void Model::end_decode() {
  for (auto& l : layers_) l->end_decode();
  decode_capacity_ = decode_length_ = 0;
}

void Model::compute_loss(std::int64_t rows, float grad_scale, bool with_grad) {
  TensorView dlogits;
  if (with_grad) dlogits = gradient(static_cast<int>(layers_.size()) - 1, rows);
  ProfileScope scope("classifier");
  loss_of(*backend_).softmax_cross_entropy(logits(rows), labels(rows), grad_scale, loss_.view(),
                                           correct_.view(), dlogits);
}

LossValues Model::read_loss() {
  LossValues v;
  backend_->copy_to_host(&v.loss, loss_.view());
  backend_->copy_to_host(&v.correct, correct_.view());
  return v;
}

LossValues Model::loss(std::int64_t rows, float grad_scale, bool with_grad) {
  compute_loss(rows, grad_scale, with_grad);
  return read_loss();
}

void Model::set_epilogue_fusion(bool on) {
  for (auto& l : layers_) l->set_fusion(on);
}

std::int64_t Model::fused_pairs() const {
  std::int64_t n = 0;
  for (const auto& l : layers_)
    if (l->fused()) ++n;
  return n;
}

void Model::flush_operand_amaxes() {
  for (auto& l : layers_) l->flush_operand_amaxes();
}

void Model::run_backward(std::int64_t batch, bool all_fp32, const BackwardVisit& visit) {
  // The loss wrote the logits' gradient: its root has had its first contribution.
  std::vector<int> written(layers_.size(), 0);
  const int sink_root = nodes_.back().root;
  if (sink_root >= 0) written[static_cast<std::size_t>(sink_root)] = 1;
  std::vector<TensorView> xs, dxs;
  struct Pending {
    std::size_t slot;
    int root;
    TensorView target;
  };
  std::vector<Pending> pending;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const Node& node = nodes_[i];
    Layer& op = *layers_[i];
    if (op.is_view() || !node.needs_grad) continue;
    const std::int64_t rows = rows_of(static_cast<int>(i), batch);
    const TensorView dy = gradient(static_cast<int>(i), batch);
    xs.clear();
    dxs.clear();
    pending.clear();
    // A pass-through op's (an add's) contribution is its output's gradient itself: it keeps that
    // dtype rather than being rounded to the op's activation_grad dtype on its way into an FP32
    // sum (ResNet's shortcuts: FP32 straight into the accumulator, no bf16 scratch and cast).
    const DType dtype = all_fp32                       ? DType::fp32
                        : op.passes_gradient_through() ? dy.dtype
                                                       : contribution_dtype(i);
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const int t = node.inputs[k];
      xs.push_back(activation(t, batch));
      const int root = t < 0 ? -1 : nodes_[static_cast<std::size_t>(t)].root;
      if (root < 0 || !nodes_[static_cast<std::size_t>(root)].needs_grad) {
        dxs.emplace_back();
        continue;
      }
      const auto r = static_cast<std::size_t>(root);
      const TensorView g = gradient(t, batch);
      if (grad_slots_[r].reads == 1 ||
          (written[r] == 0 && dtype == DType::fp32 && g.dtype == DType::fp32)) {
        dxs.push_back(g);  // the only contribution, or the first in FP32: straight into the buffer
        ++written[r];
      } else {
        dxs.push_back(scratch(k, dtype, g.shape.rows(), g.shape.cols()));
        pending.push_back({k, root, g});
      }
    }
    ProfileScope scope(profile_scope(i));
    op.backward_inputs(xs, dy, dxs, rows);
    for (const Pending& p : pending) {
      // Several readers: the gradient is FP32; the first contribution overwrites, later ones add.
      auto& w = written[static_cast<std::size_t>(p.root)];
      const TensorView c = dxs[p.slot];
      if (w == 0)
        backend_->cast(c, p.target);
      else
        activation_of(*backend_).axpy(1.0f, c,
                                      p.target);  // reads any storage dtype into the FP32 target
      ++w;
    }
    if (grad_ready_ && final_micro_batch_)
      for (ModelParameter* p : ready_after_[i]) grad_ready_(*p);
    if (visit && !visit(i, dxs)) return;
  }
}

void Model::backward(std::int64_t rows) {
  // Without begin_micro_batch() a backward is a whole step: it starts the gradients afresh.
  if (!micro_batch_open_) {
    start_gradients();
    final_micro_batch_ = true;
  }
  micro_batch_open_ = false;
  run_backward(rows, false, {});
}

std::string Model::locate_first_nonfinite(std::int64_t rows, float grad_scale) {
  // Unfused, so every node's output is written and checked where it is written.
  const std::int64_t fused_before = fused_pairs();
  set_epilogue_fusion(false);
  struct Restore {
    Model* m;
    bool on;
    ~Restore() { m->set_epilogue_fusion(on); }
  } restore{this, fused_before > 0};
  auto bad = [&](TensorView v) {
    std::vector<TensorView> one{v};
    return gradient_check_of(*backend_).first_nonfinite(one) >= 0;
  };
  start_gradients();  // this micro-batch's gradients alone, so each check sees its own writes
  // Token ids are integers: nothing to check.
  if (input_spec_.dtype != DType::int32 && bad(input_.rows(rows))) return "input batch";
  std::string found;
  run_forward(rows, [&](std::size_t i) {
    if (!bad(activation(static_cast<int>(i), rows))) return true;
    found = "forward " + layers_[i]->name() + ".output";
    return false;
  });
  if (!found.empty()) return found;
  auto lv = loss(rows, grad_scale, true);
  if (!std::isfinite(lv.loss)) return "loss";
  if (bad(gradient(static_cast<int>(layers_.size()) - 1, rows)))
    return "backward loss gradient (logits)";
  run_backward(rows, false, [&](std::size_t i, std::span<const TensorView> dxs) {
    for (ModelParameter* p : layers_[i]->used_parameters())
      if (bad(p->grad.view())) {
        found = "backward " + p->name + ".grad";
        return false;
      }
    for (const TensorView& dx : dxs)
      if (!dx.empty() && bad(dx)) {
        found = "backward " + layers_[i]->name() + " input gradient";
        return false;
      }
    return true;
  });
  return found;
}

std::vector<Model::UnderflowCount> Model::measure_gradient_underflow(std::int64_t rows,
                                                                     float grad_scale) {
  std::vector<UnderflowCount> out;
  std::vector<float> host;
  auto count = [&](const std::string& name, TensorView v, DType stored_as) {
    UnderflowCount c{name, stored_as, 0, 0};
    host.resize(static_cast<std::size_t>(v.numel()));
    backend_->copy_to_host(host.data(), v);
    for (float g : host) {
      if (g == 0.0f) continue;
      ++c.nonzero;
      if (flushes_to_zero(g, stored_as)) ++c.flushed;
    }
    out.push_back(c);
  };
  // Every gradient in FP32 for this pass, counted against the dtype the plan stores it in.
  if (!reserve_fp32_pass_)
    fp32_arena_ =
        Tensor(backend_, DType::fp32,
               sdk::Shape{static_cast<std::int64_t>(grad_plan_fp32_.arena_bytes / 4 + 1)});
  fp32_pass_ = true;
  // The pass's parameter gradients are discarded: the step's real backward overwrites them.
  start_gradients();
  struct Release {
    Model* m;
    ~Release() {
      m->fp32_pass_ = false;
      m->fp32_arena_ = Tensor();
      m->start_gradients();
    }
  } release{this};
  const TensorView dy = gradient(static_cast<int>(layers_.size()) - 1, rows);
  loss_of(*backend_).softmax_cross_entropy(logits(rows), labels(rows), grad_scale, loss_.view(),
                                           correct_.view(), dy);
  count("logits gradient", dy, logits_grad_dtype());
  run_backward(rows, true, [&](std::size_t i, std::span<const TensorView> dxs) {
    for (const TensorView& dx : dxs)
      if (!dx.empty()) count(layers_[i]->name() + " input gradient", dx, contribution_dtype(i));
    return true;
  });
  return out;
}

std::vector<ModelParameter*> Model::parameters() {
  std::vector<ModelParameter*> out;
  for (auto& l : layers_)
    for (auto& p : l->parameters()) out.push_back(&p);
  return out;
}

std::vector<ModelBuffer*> Model::buffers() {
  std::vector<ModelBuffer*> out;
  for (auto& l : layers_)
    for (auto& b : l->buffers()) out.push_back(&b);
  return out;
}

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& l : layers_)
    for (const auto& p : l->parameters()) n += p.master.shape().numel();
  return n;
}

}  // namespace mixtrain::core
