// Decoder: KV-cache decoding over the executor; see decoder.h for the contract.
#include "mixtrain/core/graph/decoder.h"

#include "graph/ops/op_support.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {
// The model in evaluation mode for one decode step, then back in the mode it was in.
class EvaluationMode {
 public:
  explicit EvaluationMode(Model& model) : model_(model), was_(model.mode()) {
    model_.set_mode(Model::Mode::eval);
  }
  ~EvaluationMode() { model_.set_mode(was_); }
  EvaluationMode(const EvaluationMode&) = delete;
  EvaluationMode& operator=(const EvaluationMode&) = delete;

 private:
  Model& model_;
  Model::Mode was_;
};
}  // namespace

Decoder::Decoder(Model& model, std::int64_t capacity) : model_(model), capacity_(capacity) {
  const GraphPlan& plan = model.plan();
  const std::int64_t t = plan.input_features();
  if (plan.input().dtype != DType::int32 || plan.input().labels_per_sample != t)
    throw sdk::UserError("this model does not read token ids, so it cannot generate text",
                         "sample from a language model (an embedding on a token data source)");
  for (std::size_t i = 0; i < plan.size(); ++i)
    if (plan.node(i).rows_per_sample != t || plan.node(i).shape.size() != 2)
      throw sdk::UserError("node '" + model.layers()[i]->name() + "' is " +
                               ops::shape_text(plan.node(i).shape) +
                               " per sample, not one row per position, so the model cannot "
                               "decode token by token",
                           "sample from a model whose every node is [T, C] (the gpt preset)");
  if (capacity < 1 || capacity > t)
    throw sdk::UserError("a KV cache of " + std::to_string(capacity) +
                             " positions; the model was built for at most " + std::to_string(t),
                         "decode at most block_size positions at once");
  for (const auto& l : model.layers()) states_.push_back(l->make_decode_state(capacity));
}

void Decoder::reset() {
  // A step reads the cache only at the positions before it, which it or an earlier step wrote.
  length_ = 0;
}

std::vector<float> Decoder::decode(std::span<const std::int32_t> ids) {
  const auto n = static_cast<std::int64_t>(ids.size());
  const std::int32_t classes = model_.classes();
  if (n < 1 || length_ + n > capacity_ || n > model_.max_rows() * model_.input_features())
    throw sdk::UserError("decoding " + std::to_string(n) + " more tokens after " +
                             std::to_string(length_) + " overflows the KV cache of " +
                             std::to_string(capacity_) + " positions",
                         "reset() the cache and feed it the last tokens");
  for (std::int32_t id : ids)
    if (id < 0 || id >= classes)
      throw sdk::UserError("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                               std::to_string(classes) + ")",
                           "feed ids the model was trained on");
  sdk::DeviceBackend& backend = model_.backend();
  Executor& exec = model_.executor();
  backend.copy_from_host({exec.input(1).data, DType::int32, sdk::Shape{n}}, ids.data());
  const Extent step = Extent::decode_of(n);
  // Through the logits' read: evaluation mode may place the outputs apart from training's.
  const EvaluationMode eval(model_);
  exec.decode(length_, n, states_);
  // x is [n, classes]: the last row predicts the next token.
  const TensorView all = exec.activation(model_.plan().logits(), step);
  const TensorView last{
      static_cast<std::byte*>(all.data) +
          (n - 1) * classes * static_cast<std::int64_t>(sdk::dtype_size(all.dtype)),
      all.dtype, sdk::Shape{1, classes}};
  std::vector<float> logits(static_cast<std::size_t>(classes));
  Tensor scratch;
  copy_to_host_fp32(model_.backend_ptr(), last, logits.data(), scratch);
  length_ += n;
  return logits;
}

}  // namespace mixtrain::core
