#include "mixtrain/core/model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "mixtrain/core/random.h"
#include "mixtrain/sdk/float_formats.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {
DType storage_of(DType t) { return t == DType::tf32 ? DType::fp32 : t; }

bool flushes_to_zero(float v, DType dt) {
  switch (dt) {
    case DType::fp16: return sdk::decode_fp16(sdk::encode_fp16(v)) == 0.0f;
    case DType::bf16: return sdk::decode_bf16(sdk::encode_bf16(v)) == 0.0f;
    case DType::fp8_e4m3:
      return sdk::decode_fp8_e4m3(sdk::encode_fp8_e4m3(v, sdk::Overflow::saturate)) == 0.0f;
    case DType::fp8_e5m2:
      return sdk::decode_fp8_e5m2(sdk::encode_fp8_e5m2(v, sdk::Overflow::saturate)) == 0.0f;
    default: return false;
  }
}
}  // namespace

Model::Model(std::shared_ptr<sdk::DeviceBackend> backend, const ModelSpec& spec,
             std::int64_t input_features, std::int32_t classes)
    : backend_(std::move(backend)), input_features_(input_features), classes_(classes) {
  if (spec.layers.empty())
    throw sdk::ConfigError(spec.where, "model.layers", "the model has no layers",
                           "add layers = [ { type = \"linear\", out = 10 } ]");
  if (spec.loss != "softmax_cross_entropy")
    throw sdk::ConfigError(spec.where, "model.loss", "unknown loss '" + spec.loss + "'",
                           "the supported loss is \"softmax_cross_entropy\"");
  std::int64_t width = input_features;
  std::set<std::string> names;
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const auto& l = spec.layers[i];
    std::string name = l.name.empty() ? l.type + std::to_string(i) : l.name;
    if (!names.insert(name).second)
      throw sdk::ConfigError(l.where, "model.layers[" + std::to_string(i) + "].name",
                             "duplicate layer name '" + name + "'",
                             "layer names must be unique; overrides and logs refer to them");
    if (l.type == "linear") {
      if (l.out <= 0)
        throw sdk::ConfigError(l.where, "model.layers[" + std::to_string(i) + "].out",
                               "a linear layer needs out > 0");
      layers_.push_back(std::make_unique<LinearLayer>(name, width, l.out, l.bias));
      width = l.out;
    } else if (l.type == "relu") {
      layers_.push_back(std::make_unique<ActivationLayer>(name, sdk::Activation::relu, width));
    } else if (l.type == "gelu") {
      layers_.push_back(std::make_unique<ActivationLayer>(name, sdk::Activation::gelu, width));
    } else if (l.type == "layernorm") {
      layers_.push_back(std::make_unique<LayerNormLayer>(name, width, static_cast<float>(l.eps)));
    } else {
      throw sdk::ConfigError(l.where, "model.layers[" + std::to_string(i) + "].type",
                             "unknown layer type '" + l.type + "'",
                             "use one of: linear, relu, gelu, layernorm");
    }
  }
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) {
    auto* linear = dynamic_cast<LinearLayer*>(layers_[i].get());
    auto* act = dynamic_cast<ActivationLayer*>(layers_[i + 1].get());
    if (linear != nullptr && act != nullptr) linear->fuse_activation(act);
  }
  set_epilogue_fusion(spec.fuse_epilogues);
  if (width != classes)
    throw sdk::ConfigError(spec.layers.back().where, "model.layers",
                           "the last layer produces " + std::to_string(width) +
                               " outputs but the data has " + std::to_string(classes) + " classes",
                           "set out = " + std::to_string(classes) + " on the last linear layer");
}

void Model::allocate(std::int64_t max_rows) {
  max_rows_ = max_rows;
  input_ = Tensor(backend_, DType::fp32, sdk::Shape{max_rows, input_features_});
  labels_ = Tensor(backend_, DType::int32, sdk::Shape{max_rows});
  loss_ = Tensor(backend_, DType::fp32, sdk::Shape{1});
  correct_ = Tensor(backend_, DType::int32, sdk::Shape{1});
  std::int64_t widest = input_features_;
  for (auto& l : layers_) {
    l->allocate(backend_, max_rows);
    widest = std::max({widest, l->in_features(), l->out_features()});
  }
  // Sized for fp32, the widest dtype any activation gradient may use.
  grad_a_ = Tensor(backend_, DType::fp32, sdk::Shape{max_rows, widest});
  grad_b_ = Tensor(backend_, DType::fp32, sdk::Shape{max_rows, widest});
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
  return {labels_.view().data, DType::int32, sdk::Shape{rows}};
}

void Model::forward(std::int64_t rows) {
  TensorView x = input_.rows(rows);
  for (auto& l : layers_) {
    l->forward(x, rows);
    x = l->output(rows);
  }
}

void Model::compute_loss(std::int64_t rows, float grad_scale, bool with_grad) {
  TensorView dlogits;
  if (with_grad)
    dlogits = grad_a_.reinterpret(storage_of(layers_.back()->precision().activation), rows,
                                  classes_);
  backend_->softmax_cross_entropy(logits(rows), labels(rows), grad_scale, loss_.view(),
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
  for (auto& l : layers_)
    if (auto* linear = dynamic_cast<LinearLayer*>(l.get())) linear->set_fusion(on);
}

std::int64_t Model::fused_pairs() const {
  std::int64_t n = 0;
  for (const auto& l : layers_)
    if (auto* linear = dynamic_cast<const LinearLayer*>(l.get()); linear != nullptr && linear->fused()) ++n;
  return n;
}

void Model::flush_operand_amaxes() {
  for (auto& l : layers_)
    if (auto* linear = dynamic_cast<LinearLayer*>(l.get())) linear->flush_operand_amaxes();
}

void Model::backward(std::int64_t rows) {
  // The gradient of the logits sits in grad_a_ (written by loss()).
  const Tensor* dy_buf = &grad_a_;
  const Tensor* dx_buf = &grad_b_;
  TensorView dy = grad_a_.reinterpret(storage_of(layers_.back()->precision().activation), rows,
                                      classes_);
  for (std::size_t i = layers_.size(); i-- > 0;) {
    auto& l = *layers_[i];
    TensorView x = i == 0 ? input_.rows(rows) : layers_[i - 1]->output(rows);
    TensorView dx;
    if (i > 0)
      dx = dx_buf->reinterpret(storage_of(l.precision().activation_grad), rows, l.in_features());
    l.backward(x, dy, dx, rows);
    dy = dx;
    std::swap(dy_buf, dx_buf);
  }
}

std::string Model::locate_first_nonfinite(std::int64_t rows, float grad_scale) {
  // Unfused, so every layer's output is written and checked where it is written.
  const std::int64_t fused_before = fused_pairs();
  set_epilogue_fusion(false);
  struct Restore {
    Model* m;
    bool on;
    ~Restore() { m->set_epilogue_fusion(on); }
  } restore{this, fused_before > 0};
  auto bad = [&](TensorView v) {
    std::vector<TensorView> one{v};
    return backend_->first_nonfinite(one) >= 0;
  };
  TensorView x = input_.rows(rows);
  if (bad(x)) return "input batch";
  for (auto& l : layers_) {
    l->forward(x, rows);
    x = l->output(rows);
    if (bad(x)) return "forward " + l->name() + ".output";
  }
  auto lv = loss(rows, grad_scale, true);
  if (!std::isfinite(lv.loss)) return "loss";
  const Tensor* dy_buf = &grad_a_;
  const Tensor* dx_buf = &grad_b_;
  TensorView dy = grad_a_.reinterpret(storage_of(layers_.back()->precision().activation), rows,
                                      classes_);
  if (bad(dy)) return "backward loss gradient (logits)";
  for (std::size_t i = layers_.size(); i-- > 0;) {
    auto& l = *layers_[i];
    TensorView xin = i == 0 ? input_.rows(rows) : layers_[i - 1]->output(rows);
    TensorView dx;
    if (i > 0)
      dx = dx_buf->reinterpret(storage_of(l.precision().activation_grad), rows, l.in_features());
    l.backward(xin, dy, dx, rows);
    for (auto& p : l.parameters())
      if (bad(p.grad.view())) return "backward " + p.name + ".grad";
    if (!dx.empty() && bad(dx)) return "backward " + l.name() + " input gradient";
    dy = dx;
    std::swap(dy_buf, dx_buf);
  }
  return {};
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
  TensorView dy = grad_a_.reinterpret(DType::fp32, rows, classes_);
  backend_->softmax_cross_entropy(logits(rows), labels(rows), grad_scale, loss_.view(),
                                  correct_.view(), dy);
  count("logits gradient", dy, storage_of(layers_.back()->precision().activation));
  const Tensor* dx_buf = &grad_b_;
  const Tensor* dy_buf = &grad_a_;
  for (std::size_t i = layers_.size(); i-- > 1;) {
    auto& l = *layers_[i];
    TensorView dx = dx_buf->reinterpret(DType::fp32, rows, l.in_features());
    l.backward(layers_[i - 1]->output(rows), dy, dx, rows);
    count(l.name() + " input gradient", dx, storage_of(l.precision().activation_grad));
    dy = dx;
    std::swap(dy_buf, dx_buf);
  }
  return out;
}

std::vector<ModelParameter*> Model::parameters() {
  std::vector<ModelParameter*> out;
  for (auto& l : layers_)
    for (auto& p : l->parameters()) out.push_back(&p);
  return out;
}

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& l : layers_)
    for (const auto& p : l->parameters()) n += p.master.shape().numel();
  return n;
}


}  // namespace mixtrain::core
