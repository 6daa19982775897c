#include "graph/ops/embedding.h"

#include <vector>

#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

// --- embedding -----------------------------------------------------------------------------------

EmbeddingLayer::EmbeddingLayer(std::string name, std::int64_t tokens, std::int64_t vocab,
                               std::int64_t dim, double init_std)
    : Layer(std::move(name), "embedding", tokens, dim), vocab_(vocab), init_std_(init_std) {
  traits_.forward_flops_per_row = 0;
  traits_.backward_reads_inputs = true;  // the ids
  traits_.parameters = {{"weight", {vocab_, out_}}};
}

void EmbeddingLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                              std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  params_.push_back(make_parameter("weight", sdk::Shape{vocab_, out_}, true));
}

void EmbeddingLayer::init_parameters(std::uint64_t seed) {
  ops::fill_normal(backend_, params_[0], init_std_, derive_seed(seed, (name_ + ".weight").c_str()));
}

std::vector<BackendNeed> EmbeddingLayer::backend_needs(DType) const {
  return {{sdk::EmbeddingOp::gather, {DType::fp32, storage_of(precision_.activation)}},
          {sdk::EmbeddingOp::scatter_add, {storage_of(precision_.activation_grad)}}};
}

void EmbeddingLayer::forward(TensorView x, std::int64_t rows) {
  // x is ids [N, T] int32, y is [N·T, C]
  const TensorView ids{x.data, DType::int32, sdk::Shape{rows}};
  facets().call(sdk::EmbeddingOp::gather)->gather(ids, params_[0].master.view(), output(rows), false);
}

void EmbeddingLayer::backward(TensorView x, TensorView dy, TensorView, std::int64_t rows) {
  // dW[v] (+)= Σ_{r: ids[r] = v} dy[r]; a tied LM head may have written the first contribution.
  ModelParameter& w = params_[0];
  if (w.frozen) return;  // its table is the op's only gradient
  const TensorView ids{x.data, DType::int32, sdk::Shape{rows}};
  facets().call(sdk::EmbeddingOp::scatter_add)->scatter_add(ids, dy, w.grad.view(), w.take_grad_beta());
}

// --- position_embedding --------------------------------------------------------------------------

PositionEmbeddingLayer::PositionEmbeddingLayer(std::string name, std::int64_t tokens,
                                               std::int64_t positions, std::int64_t dim,
                                               double init_std)
    : Layer(std::move(name), "position_embedding", dim, dim),
      tokens_(tokens),
      positions_(positions),
      init_std_(init_std) {
  traits_.backward_reads_inputs = false;
  traits_.parameters = {{"weight", {positions_, out_}}};
}

void PositionEmbeddingLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                      std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  params_.push_back(make_parameter("weight", sdk::Shape{positions_, out_}, true));
  std::vector<std::int32_t> ids(static_cast<std::size_t>(max_rows));
  for (std::size_t r = 0; r < ids.size(); ++r)
    ids[r] = static_cast<std::int32_t>(static_cast<std::int64_t>(r) % tokens_);
  position_ids_ = Tensor(backend, DType::int32, sdk::Shape{max_rows});
  backend->copy_from_host(position_ids_.view(), ids.data());
}

void PositionEmbeddingLayer::init_parameters(std::uint64_t seed) {
  ops::fill_normal(backend_, params_[0], init_std_, derive_seed(seed, (name_ + ".weight").c_str()));
}

std::vector<BackendNeed> PositionEmbeddingLayer::backend_needs(DType) const {
  return {{sdk::EmbeddingOp::gather, {DType::fp32, storage_of(precision_.activation)}},
          {sdk::EmbeddingOp::scatter_add, {storage_of(precision_.activation_grad)}}};
}

namespace {
// One sequence's positions: int32 [capacity] = 0, 1, ..., capacity - 1.
struct SequencePositions final : DecodeState {
  Tensor ids;
};
}  // namespace

std::unique_ptr<DecodeState> PositionEmbeddingLayer::make_decode_state(
    std::int64_t capacity) const {
  if (capacity > positions_)
    throw sdk::UserError("a KV cache of " + std::to_string(capacity) +
                             " positions is longer than the " + std::to_string(positions_) +
                             " positions node '" + name_ + "' has learned",
                         "decode at most " + std::to_string(positions_) + " positions at once");
  auto state = std::make_unique<SequencePositions>();
  std::vector<std::int32_t> all(static_cast<std::size_t>(capacity));
  for (std::size_t p = 0; p < all.size(); ++p) all[p] = static_cast<std::int32_t>(p);
  state->ids = Tensor(backend_, DType::int32, sdk::Shape{capacity});
  backend_->copy_from_host(state->ids.view(), all.data());
  return state;
}

TensorView PositionEmbeddingLayer::ids_for(std::int64_t rows) const {
  return {position_ids_.view().data, DType::int32, sdk::Shape{rows}};
}

void PositionEmbeddingLayer::forward(TensorView x, std::int64_t rows) {
  add_positions(x, ids_for(rows), rows);
}

void PositionEmbeddingLayer::decode_forward(std::span<const TensorView> xs, std::int64_t start,
                                            std::int64_t rows, DecodeState* state) {
  const Tensor& ids = static_cast<SequencePositions&>(*state).ids;
  if (start + rows > ids.shape().numel())
    throw std::logic_error("node '" + name_ + "': decoding positions " + std::to_string(start) +
                           ".." + std::to_string(start + rows - 1) + " past its " +
                           std::to_string(ids.shape().numel()));
  add_positions(
      xs[0], {static_cast<std::int32_t*>(ids.view().data) + start, DType::int32, sdk::Shape{rows}},
      rows);
}

void PositionEmbeddingLayer::add_positions(TensorView x, TensorView ids, std::int64_t rows) {
  // x, y are [N·T, C]: y = x + wpe[t], summed in FP32 and rounded once into y's dtype.
  const TensorView y = output(rows);
  if (x.dtype == y.dtype)
    backend_->copy(y, x);
  else
    backend_->cast(x, y);
  facets().call(sdk::EmbeddingOp::gather)->gather(ids, params_[0].master.view(), y, true);
}

void PositionEmbeddingLayer::backward(TensorView, TensorView dy, TensorView dx, std::int64_t rows) {
  ModelParameter& w = params_[0];
  if (!w.frozen)
    facets()
        .call(sdk::EmbeddingOp::scatter_add)
        ->scatter_add(ids_for(rows), dy, w.grad.view(), w.take_grad_beta());
  if (dx.empty()) return;
  ops::copy_as(*backend_, dy, dx);
}

// --- Definitions ---------------------------------------------------------------------------------

OpDefinition embedding_op() {
  OpDefinition op;
  op.type = "embedding";
  op.summary = "token ids [T] -> rows of a learned table [vocab, dim] (deterministic backward)";
  op.has_parameters = true;
  op.reads_token_ids = true;
  op.schema = [] {
    return sdk::OptionSchema{
        sdk::OptionSpec::required("vocab", sdk::OptionType::integer, "number of token ids")
            .at_least(1)
            .at_most(static_cast<double>(ops::kMaxDim)),
        sdk::OptionSpec::required("dim", sdk::OptionType::integer, "embedding width")
            .at_least(1)
            .at_most(static_cast<double>(ops::kMaxDim)),
        sdk::OptionSpec::number("init_std", 1.0,
                                "standard deviation of the N(0, std²) initial table "
                                "(PyTorch's nn.Embedding: 1; GPT-2: 0.02)")
            .greater_than(0.0)};
  };
  op.build = [](const OpNode& node) {
    const auto& in = node.inputs[0];
    if (in.size() != 1)
      throw OpSpecError("",
                        "reads token ids [T] per sample, but its input is " + ops::shape_text(in),
                        "feed it the graph input of a token data source (data.source = "
                        "\"tokens\" or \"text\")");
    const std::int64_t dim = node.options.get_int("dim");
    return BuiltOp{std::make_unique<EmbeddingLayer>(node.name, in[0], node.options.get_int("vocab"),
                                                    dim, node.options.get_double("init_std")),
                   PerSampleShape{in[0], dim}};
  };
  return op;
}

OpDefinition position_embedding_op() {
  OpDefinition op;
  op.type = "position_embedding";
  op.summary = "x [T, C] + a learned row per position (GPT-2's wpe)";
  op.has_parameters = true;
  op.schema = [] {
    return sdk::OptionSchema{
        sdk::OptionSpec::integer("positions", 0,
                                 "positions the table holds (0: the input's T); at least T")
            .at_least(0)
            .at_most(static_cast<double>(ops::kMaxDim)),
        sdk::OptionSpec::number("init_std", 1.0,
                                "standard deviation of the N(0, std²) initial table")
            .greater_than(0.0)};
  };
  op.build = [](const OpNode& node) {
    const auto& in = node.inputs[0];
    if (in.size() != 2)
      throw OpSpecError("", "takes [T, C] per sample, but its input is " + ops::shape_text(in),
                        "put it after an embedding node");
    std::int64_t positions = node.options.get_int("positions");
    if (positions == 0) positions = in[0];
    if (positions < in[0])
      throw OpSpecError("positions",
                        "holds " + std::to_string(positions) + " positions but its input has " +
                            std::to_string(in[0]) + " tokens per sample",
                        "set positions >= " + std::to_string(in[0]) + " (or leave it out)");
    return BuiltOp{std::make_unique<PositionEmbeddingLayer>(node.name, in[0], positions, in[1],
                                                            node.options.get_double("init_std")),
                   in};
  };
  return op;
}

}  // namespace mixtrain::core
