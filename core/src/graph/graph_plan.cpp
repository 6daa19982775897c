// GraphPlan::build: a ModelSpec turned into ops and their plan; see graph_plan.h for the contract.
#include "mixtrain/core/graph/graph_plan.h"

#include <algorithm>
#include <set>

#include "config/reading.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"
#include "graph/ops/view.h"
#include "mixtrain/core/graph/lora.h"
#include "mixtrain/core/graph/topology.h"

namespace mixtrain::core {

using ops::shape_text;
using sdk::DType;

namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// The key errors about node `i` cite: the config entry it came from (LayerSpec::table: a block's
// node, "model.blocks.res.nodes[2]", or the instance's own list entry), else its index in `list`.
// Block instances expand into more nodes than the user's list has, so an index into the expanded
// list would name another entry beside the right line:column.
std::string node_key(const ModelSpec& spec, const std::string& list, std::size_t i) {
  const LayerSpec& l = spec.layers[i];
  return l.table.empty() ? list + "[" + std::to_string(i) + "]" : l.table;
}

// The logits node: one node only is read by no other, and it has the loss's shape.
void check_logits(const ModelSpec& spec, const std::string& list, const GraphTopology& topo,
                  const std::vector<GraphNodeSpec>& graph, const PlannedNode& last,
                  std::int32_t classes, const InputSpec& input) {
  const std::size_t n = graph.size();
  for (std::size_t i = 0; i < n; ++i)
    if (topo.consumers[i].empty() && topo.position[i] != n - 1)
      throw sdk::ConfigError(graph[i].where, node_key(spec, list, i),
                             "node '" + graph[i].name +
                                 "' is read by no other node, and only the "
                                 "logits may be: the graph has two outputs",
                             "feed it into the graph (add, a linear, ...) or remove it");
  const std::size_t last_spec = topo.order.back();
  // A view of the batch (a reshape or flatten of the input) as the logits: nothing computes them,
  // and the loss's gradient would have to be written into the batch.
  if (last.root.is_batch())
    throw sdk::ConfigError(spec.layers[last_spec].where, list,
                           "the logits node '" + graph[last_spec].name +
                               "' is a view of the input: the model computes nothing",
                           "end in a layer that computes the logits, e.g. a linear with out = " +
                               std::to_string(classes));
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
    // An image folder's classes are its class folders; other data's are counted from labels.
    const bool folders = !input.class_names.empty();
    if (last.shape.size() == 1)
      throw sdk::ConfigError(
          spec.layers[last_spec].where, list,
          "the last layer produces " + std::to_string(last.shape.back()) +
              " outputs but the data has " + std::to_string(classes) +
              (folders ? " classes (its " + std::to_string(input.class_names.size()) +
                             " class folders, or data.classes when larger)"
                       : " classes (data.classes, or the largest label + 1 "
                         "when it is 0)"),
          (spec.layers[last_spec].preset_keys.count("out") != 0
               ? "set " + spec.layers[last_spec].preset_key("out") + " = " + std::to_string(classes)
               : "set out = " + std::to_string(classes) + " on the last linear layer") +
              (classes <= last.shape.back() ? std::string()
               : folders && static_cast<std::size_t>(classes) > input.class_names.size()
                   ? "; or lower data.classes, which widens the data's " +
                         std::to_string(input.class_names.size()) + " class folders to " +
                         std::to_string(classes)
               : folders
                   ? "; or, if there should be " + std::to_string(last.shape.back()) +
                         " classes, move the extra class folders out of the "
                         "image folder"
                   : "; or, if the labels should stop below " + std::to_string(last.shape.back()) +
                         ", a label of the data is stray: fix the labels "
                         "file"));
    throw sdk::ConfigError(spec.layers[last_spec].where, list,
                           "the logits node '" + graph[last_spec].name + "' is " +
                               shape_text(last.shape) + " per sample; the loss needs [" +
                               std::to_string(classes) + "]",
                           "flatten it and end in a linear with out = " + std::to_string(classes));
  }
}

// Weight tying: each shared parameter names one that its owner declares, of the same shape.
std::vector<WeightTie> resolve_ties(const ModelSpec& spec, const std::string& list,
                                    const GraphTopology& topo,
                                    const std::vector<GraphNodeSpec>& graph,
                                    const std::vector<std::unique_ptr<Layer>>& ops) {
  std::vector<WeightTie> ties;
  const std::size_t n = ops.size();
  for (std::size_t pos = 0; pos < n; ++pos) {
    const std::size_t i = topo.order[pos];
    for (const SharedParameter& sp : ops[pos]->shared_parameters()) {
      const std::string key = node_key(spec, list, i) + "." + sp.key;
      const std::string user = "node '" + graph[i].name + "'";
      const auto dot = sp.source.rfind('.');
      std::size_t owner = n;
      if (dot != std::string::npos && dot > 0)
        for (std::size_t q = 0; q < n; ++q)
          if (ops[q]->name() == sp.source.substr(0, dot)) owner = q;
      const std::vector<std::int64_t> have =
          owner < n ? ops[owner]->parameter_shape(sp.source.substr(dot + 1))
                    : std::vector<std::int64_t>{};
      if (have.empty()) {
        std::vector<std::string> known;
        for (std::size_t q = 0; q < n; ++q)
          for (const char* suffix : {"weight", "bias"})
            if (!ops[q]->parameter_shape(suffix).empty())
              known.push_back(ops[q]->name() + "." + suffix);
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
                               user + " (" + ops[pos]->type() + ") ties its " + sp.suffix + " " +
                                   shape_text(want) + " to '" + sp.source + "' of node '" +
                                   ops[owner]->name() + "', which is " + shape_text(have),
                               "tied parameters must have one shape: size node '" + graph[i].name +
                                   "' so that its " + sp.suffix + " is " + shape_text(have));
      ties.push_back({pos, sp.suffix, sp.source});
    }
  }
  return ties;
}

// The spec's checks before any node: it has layers, and a loss the core knows.
void check_spec(const ModelSpec& spec, const std::string& list) {
  if (spec.layers.empty())
    throw sdk::ConfigError(spec.where, list, "the model has no layers",
                           "add layers = [ { type = \"linear\", out = 10 } ]");
  if (spec.loss != "softmax_cross_entropy")
    throw sdk::ConfigError(spec.where, "model.loss", "unknown loss '" + spec.loss + "'",
                           "the supported loss is \"softmax_cross_entropy\"");
}

// Each node's name (the sequential form numbers unnamed layers) and inputs (the sequential form
// reads the layer before).
std::vector<GraphNodeSpec> name_nodes(const ModelSpec& spec, const std::string& list) {
  std::vector<GraphNodeSpec> graph;
  std::set<std::string> names;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const auto& l = spec.layers[i];
    std::string name = l.name.empty() ? l.type + std::to_string(i) : l.name;
    if (!spec.graph && !names.insert(name).second)
      throw sdk::ConfigError(l.where, node_key(spec, list, i) + ".name",
                             "duplicate layer name '" + name + "'",
                             "layer names must be unique; overrides and logs refer to them");
    std::vector<std::string> inputs = l.inputs;
    if (!spec.graph) inputs = {i == 0 ? std::string(kGraphInput) : graph.back().name};
    graph.push_back({name, inputs, l.where});
  }
  return graph;
}

// What the build of every node reads: the spec, its graph and the data.
struct GraphContext {
  const ModelSpec& spec;
  const std::vector<GraphNodeSpec>& graph;
  const GraphTopology& topo;
  std::int64_t input_features;
  std::int32_t classes;
  const InputSpec& input;
};

// One node of the spec at its forward position: its spec, names, and the key errors cite.
struct NodeSite {
  const LayerSpec& layer;
  const GraphNodeSpec& graph;  // its name and input names
  std::string key;             // "model.nodes[3]", or the table the node came from
  const OpDefinition& op;
  sdk::ConfigError bad(const std::string& what, const std::string& hint) const {
    return sdk::ConfigError(layer.where, key,
                            "node '" + graph.name + "' (" + layer.type + "): " + what, hint);
  }
};

// The number of inputs, the shape key, and which node may read token ids.
void check_node_inputs(const GraphContext& g, const NodeSite& site, const PlannedNode& node) {
  const OpDefinition& op = site.op;
  const LayerSpec& l = site.layer;
  const std::size_t count = node.inputs.size();
  if (count < op.min_inputs || (op.max_inputs != 0 && count > op.max_inputs))
    throw site.bad(op.max_inputs == 1 ? "takes one input, got " + std::to_string(count)
                                      : "adds two or more inputs, got " + std::to_string(count),
                   op.max_inputs == 1 ? "give it inputs = [\"<node>\"]"
                                      : "give it inputs = [\"<a>\", \"<b>\"]");
  if (!op.takes_shape && !l.shape.empty())
    throw sdk::ConfigError(l.where, site.key + ".shape",
                           "unknown key 'shape' for a " + l.type + " node",
                           "shape belongs to reshape nodes");
  const bool reads_ids =
      std::find(node.inputs.begin(), node.inputs.end(), TensorId::batch()) != node.inputs.end();
  if (reads_ids && op.reads_token_ids != (g.input.dtype == DType::int32))
    throw site.bad(
        op.reads_token_ids ? "reads token ids, but the data gives " +
                                 std::to_string(g.input_features) + " float features per sample"
                           : "reads the batch, which holds int32 token ids: only an embedding can",
        op.reads_token_ids ? "use a token data source (data.source = \"tokens\" or \"text\")"
                           : "feed the input to an embedding node first, e.g. { type = "
                             "\"embedding\", vocab = " +
                                 std::to_string(g.classes) + ", dim = 128 }");
  if (op.reads_token_ids && !reads_ids)
    throw site.bad(
        "reads token ids, so its input must be the batch itself, not another node's "
        "output",
        "give it inputs = [\"input\"] (an embedding starts the model)");
}

// The inputs' per-sample shapes and layouts, as the op's build sees them.
struct NodeInputs {
  std::vector<PerSampleShape> shapes;
  std::vector<TensorLayout> layouts;
  bool any_channels_last = false, any_plain = false;
};

NodeInputs node_inputs(const GraphContext& g, const NodeSite& site, const PlannedNode& node,
                       const std::vector<PlannedNode>& nodes) {
  const OpDefinition& op = site.op;
  NodeInputs in;
  for (std::size_t k = 0; k < node.inputs.size(); ++k) {
    const TensorId t = node.inputs[k];
    const bool image_batch = t.is_batch() && op.reads_images && !g.input.sample_shape.empty();
    in.shapes.push_back(image_batch    ? g.input.sample_shape
                        : t.is_batch() ? std::vector<std::int64_t>{g.input_features}
                                       : nodes[t.position()].shape);
    const bool cl = t.is_node() && nodes[t.position()].channels_last;
    in.layouts.push_back(cl ? TensorLayout::channels_last : TensorLayout::plain);
    (cl ? in.any_channels_last : in.any_plain) = true;
    if (cl && !op.reads_images && !op.keeps_layout)
      throw site.bad("reads '" + site.graph.inputs[k] + "', a channels-last image " +
                         shape_text(in.shapes.back()) + ", but a " + site.layer.type +
                         " works on plain tensors",
                     "flatten it first (a flatten permutes an image back to PyTorch's [C, H, W] "
                     "order), or end the convolutions with a global_avgpool");
  }
  if (op.keeps_layout && in.any_channels_last && in.any_plain)
    throw site.bad(
        "adds a channels-last image (a convolution's, norm's or pool's output) to a plain "
        "tensor",
        "give both inputs the same origin: e.g. reshape neither, or flatten both");
  return in;
}

// The op object and its output shape; an OpSpecError becomes a ConfigError at the node, with
// "input k" in its message naming the config's input there.
BuiltOp build_op(const NodeSite& site, const sdk::Options& options, const NodeInputs& in) {
  const LayerSpec& l = site.layer;
  try {
    return site.op.build(OpNode{site.graph.name, options, l.shape, in.shapes, in.layouts});
  } catch (const OpSpecError& e) {
    std::string what = e.what();
    for (std::size_t k = in.shapes.size(); k >= 1; --k)
      what = replace_all(what, "input " + std::to_string(k) + " ",
                         "input '" + site.graph.inputs[k - 1] + "' ");
    // An option a preset made from one of its keys (wpe's positions from model.gpt.block_size)
    // is blamed on that key, at its own location, and the hint sets that key.
    if (!e.key.empty() && l.preset_keys.count(e.key) != 0) {
      const std::string& key = l.preset_keys.at(e.key);
      sdk::SourceLocation at = l.where;
      for (const auto& o : l.options)
        if (o.key == e.key) at = o.where;
      throw sdk::ConfigError(at, key, "node '" + site.graph.name + "' (" + l.type + "): " + what,
                             replace_all(e.hint, "set " + e.key + " ", "set " + key + " "));
    }
    throw sdk::ConfigError(l.where, e.key.empty() ? site.key : site.key + "." + e.key,
                           "node '" + site.graph.name + "' (" + l.type + "): " + what, e.hint);
  }
}

// BN + ReLU: a relu that is the only reader of an op that applies it itself (batch norm)
// becomes a view of that op's output; the op runs the relu forward and masks backward.
bool absorbed_by_its_input(const GraphContext& g, const NodeSite& site, const PlannedNode& node,
                           const std::vector<std::unique_ptr<Layer>>& ops) {
  return g.spec.fuse_epilogues && site.layer.type == "relu" && node.inputs.size() == 1 &&
         node.inputs[0].is_node() &&
         g.topo.consumers[g.topo.order[node.inputs[0].position()]].size() == 1 &&
         ops[node.inputs[0].position()]->take_relu();
}

// The node at forward position `pos`: checked, its op built (into ops), its plan filled in.
void plan_node(const GraphContext& g, const std::string& list, std::size_t pos,
               std::vector<PlannedNode>& nodes, std::vector<std::unique_ptr<Layer>>& ops) {
  const std::size_t i = g.topo.order[pos];
  const LayerSpec& l = g.spec.layers[i];
  const std::string key = node_key(g.spec, list, i);
  // A pointer, not a reference: GCC 13's -Wdangling-reference takes the defaulted hint argument
  // for the referent.
  const OpDefinition* op = &require_op(l, key);
  const NodeSite site{l, g.graph[i], key, *op};
  PlannedNode& node = nodes[pos];
  node.where = l.where;
  node.key = key;
  for (const GraphSource& src : g.topo.sources[i])
    node.inputs.push_back(src.is_node ? TensorId::node(g.topo.position[src.index])
                                      : TensorId::batch());
  check_node_inputs(g, site, node);
  const sdk::Options options = layer_options(l, key);
  // A token source's ids run over its vocabulary, the loss's classes: a smaller table would fail
  // only at the first step, inside the backend's gather.
  const auto& effective = options.effective();
  const bool has_vocab = std::any_of(effective.begin(), effective.end(),
                                     [](const auto& option) { return option.first == "vocab"; });
  if (site.op.reads_token_ids && has_vocab) {
    const std::int64_t vocab = options.get_int("vocab");
    if (vocab < g.classes)
      throw site.bad("vocab = " + std::to_string(vocab) +
                         " rows, but the token data's ids run to " + std::to_string(g.classes - 1) +
                         " (its vocabulary of " + std::to_string(g.classes) + ")",
                     "set " + l.preset_key("vocab") + " = " + std::to_string(g.classes) +
                         " (a larger table is fine: rows no id reaches stay unused)");
  }
  const NodeInputs in = node_inputs(g, site, node, nodes);
  BuiltOp built = build_op(site, options, in);
  node.channels_last =
      site.op.keeps_layout ? in.any_channels_last : built.layout == TensorLayout::channels_last;
  if (absorbed_by_its_input(g, site, node, ops))
    built.layer = std::make_unique<ViewLayer>(site.graph.name, "relu", built.layer->in_features(),
                                              built.layer->out_features());
  node.shape = std::move(built.shape);
  ops.push_back(std::move(built.layer));
  node.rows_per_sample =
      ops::checked_product(PerSampleShape(node.shape.begin(), node.shape.end() - 1));
  // A view's memory is its input's (whose root may be the batch).
  node.root = TensorId::node(pos);
  if (ops.back()->is_view())
    node.root = node.inputs[0].is_batch() ? node.inputs[0] : nodes[node.inputs[0].position()].root;
  // Its own parameters' need for now; what lies upstream joins it once freezing is resolved
  // (propagate_gradient_needs).
  node.needs_grad = site.op.has_parameters;
}

// A quantized train.frozen_format (nf4, fp8-block, mxfp8): every frozen parameter an op can store
// so (a linear's own weight) is, unless another node ties to it (that node reads it as a plain
// tensor); they share one decoding scratch.
void store_frozen_quantized(const FreezeSpec& freeze, std::vector<std::unique_ptr<Layer>>& ops) {
  std::set<std::string> tied;
  for (const auto& op : ops)
    for (const auto& t : op->shared_parameters()) tied.insert(t.source);
  auto scratch = std::make_shared<Tensor>();
  std::size_t stored = 0;
  for (auto& op : ops)
    for (const auto& p : op->traits().parameters)
      // LoRA adapters stay unquantized frozen or not (QLoRA quantizes the base alone): a frozen
      // one (an imported adapter, say) keeps its values.
      if (op->frozen(p.suffix) && op->can_quantize(p.suffix) &&
          !tied.count(op->name() + "." + p.suffix) &&
          !is_lora_parameter(op->name() + "." + p.suffix)) {
        op->quantize_frozen(p.suffix, freeze.format, freeze.block, scratch);
        ++stored;
      }
  if (stored == 0)
    throw sdk::ConfigError(freeze.format_where, "train.frozen_format",
                           "= \"" + frozen_format_name(freeze.format) +
                               "\" but no frozen parameter is a linear node's weight: it stores "
                               "frozen linear weights only",
                           "freeze the linear layers ([train] frozen, or [model.lora], which "
                           "freezes everything but its adapters), or set frozen_format = "
                           "\"compute\"");
}

// [train] trainable / frozen: each frozen parameter marked on its owner. Returns the frozen
// parameters' names, sorted.
std::vector<std::string> apply_freezing(const FreezeSpec& freeze,
                                        std::vector<std::unique_ptr<Layer>>& ops) {
  if (freeze.empty()) {
    if (freeze.format != FrozenFormat::compute) store_frozen_quantized(freeze, ops);  // refuses
    return {};
  }
  std::vector<NamedParameter> parameters;
  for (const auto& op : ops)
    for (const auto& p : op->traits().parameters)
      parameters.push_back({op->name(), op->name() + "." + p.suffix});
  std::vector<std::string> frozen = resolve_frozen(freeze, parameters);
  for (auto& op : ops)
    for (const auto& p : op->traits().parameters)
      if (std::binary_search(frozen.begin(), frozen.end(), op->name() + "." + p.suffix))
        op->freeze(p.suffix);
  if (freeze.format != FrozenFormat::compute) store_frozen_quantized(freeze, ops);
  return frozen;
}

// A node needs a gradient when a trainable parameter lies upstream or here. One whose parameters
// (owned and tied) are all frozen has nothing of its own to learn; an op that declares parameters
// it may not have (a batch norm without affine) keeps its declared need.
void propagate_gradient_needs(std::vector<PlannedNode>& nodes, const std::vector<WeightTie>& ties,
                              const std::vector<std::string>& frozen,
                              const std::vector<std::unique_ptr<Layer>>& ops) {
  for (std::size_t pos = 0; pos < nodes.size(); ++pos) {
    PlannedNode& node = nodes[pos];
    bool uses_any = false, all_frozen = true;
    for (const auto& p : ops[pos]->traits().parameters) {
      uses_any = true;
      all_frozen = all_frozen && ops[pos]->frozen(p.suffix);
    }
    for (const WeightTie& t : ties)
      if (t.user == pos) {
        uses_any = true;
        all_frozen = all_frozen && std::binary_search(frozen.begin(), frozen.end(), t.source);
      }
    if (uses_any && all_frozen) node.needs_grad = false;
    for (TensorId t : node.inputs)
      if (t.is_node() && nodes[t.position()].needs_grad) node.needs_grad = true;
  }
}

// Epilogue fusion, as a rewrite: a linear read only by a relu/gelu runs it as its epilogue; an
// add whose input is a batch norm read by it alone runs that batch norm in its pass; an add runs
// a layer norm that reads it in its pass, whoever else reads it.
void fuse_epilogues(const ModelSpec& spec, const GraphTopology& topo,
                    const std::vector<PlannedNode>& nodes,
                    std::vector<std::unique_ptr<Layer>>& ops) {
  for (std::size_t pos = 0; pos < ops.size(); ++pos) {
    const auto& readers = topo.consumers[topo.order[pos]];
    // A recomputed output runs its own kernel (Layer::set_recomputes_output).
    if (readers.size() == 1 && !ops[topo.position[readers[0]]]->recomputes_output())
      ops[pos]->fuse_reader(*ops[topo.position[readers[0]]]);
  }
  for (std::size_t pos = 0; pos < ops.size(); ++pos)
    for (std::size_t k = 0; k < nodes[pos].inputs.size(); ++k) {
      const TensorId t = nodes[pos].inputs[k];
      if (!t.is_node() || ops[t.position()]->is_view()) continue;
      if (topo.consumers[topo.order[t.position()]].size() == 1)
        ops[pos]->fuse_input(k, *ops[t.position()]);
    }
  for (std::size_t pos = 0; pos < ops.size(); ++pos)
    for (std::size_t reader : topo.consumers[topo.order[pos]]) {
      const std::size_t q = topo.position[reader];
      if (ops[q]->is_view()) continue;
      const auto& in = nodes[q].inputs;
      if (std::find(in.begin(), in.end(), TensorId::node(pos)) != in.end() &&
          ops[pos]->fuse_one_reader(*ops[q]))
        break;  // one reader per op
    }
  for (auto& op : ops) op->set_fusion(spec.fuse_epilogues);
}

}  // namespace

sdk::Options layer_options(const LayerSpec& layer, const std::string& table) {
  // A pointer, not a reference: GCC 13's -Wdangling-reference takes the defaulted hint argument
  // for the referent.
  const OpDefinition* op = &require_op(layer, table);
  return sdk::Options::resolve(table, op->schema ? op->schema() : sdk::OptionSchema{},
                               layer.options, layer.where, {"type", "name"});
}

std::int64_t GraphPlan::rows(TensorId t, Extent e) const {
  if (e.decoding()) return t.is_batch() ? 1 : e.tokens;
  return t.is_batch() ? e.samples : e.samples * nodes_[t.position()].rows_per_sample;
}

std::int64_t GraphPlan::cols(TensorId t, Extent e) const {
  if (t.is_batch()) return e.decoding() ? e.tokens : input_features_;
  return nodes_[t.position()].shape.back();
}

GraphPlan GraphPlan::build(const ModelSpec& spec, std::int64_t input_features, std::int32_t classes,
                           const InputSpec& input, std::vector<std::unique_ptr<Layer>>& ops) {
  GraphPlan plan;
  plan.input_features_ = input_features;
  plan.classes_ = classes;
  plan.input_ = input;
  ops.clear();
  const std::string list = spec.graph ? "model.nodes" : "model.layers";
  check_spec(spec, list);
  const std::vector<GraphNodeSpec> graph = name_nodes(spec, list);
  const GraphTopology topo = plan_graph_topology(graph, {kGraphInput});
  // Ops in forward order, with shapes inferred from the inputs'.
  const GraphContext context{spec, graph, topo, input_features, classes, input};
  plan.nodes_.resize(spec.layers.size());
  for (std::size_t pos = 0; pos < plan.nodes_.size(); ++pos)
    plan_node(context, list, pos, plan.nodes_, ops);
  check_logits(spec, list, topo, graph, plan.nodes_.back(), classes, input);
  plan.ties_ = resolve_ties(spec, list, topo, graph, ops);
  const std::vector<std::string> frozen = apply_freezing(spec.freeze, ops);
  propagate_gradient_needs(plan.nodes_, plan.ties_, frozen, ops);
  for (const std::string& type : spec.recompute)
    if (const OpDefinition* d = find_op(type); d == nullptr || !d->recomputable)
      throw sdk::ConfigError(
          spec.recompute_where, "model.recompute",
          "'" + type + "' is no op whose output can be computed again",
          "name op types the op table marks recomputable: " + join_names(recomputable_op_types()));
  for (auto& op : ops)
    op->set_recomputes_output(std::find(spec.recompute.begin(), spec.recompute.end(), op->type()) !=
                              spec.recompute.end());
  fuse_epilogues(spec, topo, plan.nodes_, ops);
  plan.readers_.assign(plan.nodes_.size(), {});
  for (std::size_t q = 0; q < plan.nodes_.size(); ++q)
    for (const TensorId t : plan.nodes_[q].inputs)
      if (t.is_node()) {
        auto& r = plan.readers_[t.position()];
        if (r.empty() || r.back() != q) r.push_back(q);
      }
  plan.fp32_gradient_sums_ = spec.fp32_gradient_sums;
  return plan;
}

}  // namespace mixtrain::core
