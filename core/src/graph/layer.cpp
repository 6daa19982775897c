#include "mixtrain/core/graph/layer.h"

#include <algorithm>
#include <span>
#include <stdexcept>

#include "graph/ops/op_support.h"
#include "graph/ops/operand_scaler.h"
#include "mixtrain/sdk/backend_quantized_weight.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

Layer::Layer(std::string name, std::string type, std::int64_t in, std::int64_t out)
    : name_(std::move(name)), type_(std::move(type)), in_(in), out_(out) {
  traits_.tensor_core_dims = {{"GEMM dimension", in_, false}, {"GEMM dimension", out_, false}};
  traits_.forward_flops_per_row = out_;
}
Layer::~Layer() = default;

sdk::OpDescription Layer::description() const {
  return {name_, type_, in_, out_, traits_.gemms, traits_.precision_sensitive};
}

std::vector<std::int64_t> Layer::parameter_shape(const std::string& suffix) const {
  for (const auto& p : traits_.parameters)
    if (p.suffix == suffix) return p.shape;
  return {};
}

void Layer::set_operand_scaling(sdk::PrecisionPolicy* policy) {
  if (operand_scaler_ != nullptr) operand_scaler_->set_policy(policy);
}

void Layer::begin_micro_batch(std::int64_t index, std::int64_t step, std::int64_t draw,
                              SampleRange samples) {
  step_ = step;
  micro_batch_ = index;
  draw_ = draw;
  samples_ = samples;
  if (operand_scaler_ != nullptr) operand_scaler_->begin_micro_batch(index);
}

void Layer::bind_shared_parameter(const std::string& suffix, ModelParameter& source) {
  for (auto& [slot, bound] : shared_)
    if (slot == suffix) {
      bound = &source;
      return;
    }
  shared_.emplace_back(suffix, &source);
}

ModelParameter* Layer::shared_parameter(const std::string& suffix) const {
  for (const auto& [slot, bound] : shared_)
    if (slot == suffix) return bound;
  return nullptr;
}

void Layer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) {
  backend_ = backend;
  facets_ = BoundFacets(*backend_);
  max_rows_ = max_rows;
  output_ = Tensor();
  output_unfused_ = false;
  if (!traits_.output_deferred && loss_chunk_rows_ == 0) materialise_output();
}

void Layer::materialise_output() {
  if (!output_.empty() || planned_output_ != nullptr || output_unfused_) return;
  // Where the executor's placement in use puts it; that place may move with the placement.
  if (deferred_output_ != nullptr)
    output_unfused_ = true;
  else
    output_ = Tensor(backend_, storage_of(precision_.activation), sdk::Shape{max_rows_, out_});
}

TensorView Layer::output(std::int64_t rows) const {
  const DType dtype = storage_of(precision_.activation);
  void* placed = planned_output_ != nullptr ? planned_output_
                 : output_unfused_          ? deferred_output_
                                            : nullptr;
  if (placed != nullptr && output_.empty()) return {placed, dtype, sdk::Shape{rows, out_}};
  if (output_.empty()) return {nullptr, dtype, sdk::Shape{rows, out_}};
  return output_.rows(rows);
}

std::size_t Layer::planned_output_bytes(std::int64_t max_rows,
                                        std::optional<DType> as_dtype) const {
  if (traits_.view || traits_.output_deferred || loss_chunk_rows_ > 0) return 0;
  return static_cast<std::size_t>(max_rows * out_) *
         sdk::dtype_size(storage_of(as_dtype.value_or(precision_.activation)));
}

void Layer::freeze(const std::string& suffix) {
  if (!frozen(suffix)) frozen_.push_back(suffix);
}

bool Layer::frozen(const std::string& suffix) const {
  return std::find(frozen_.begin(), frozen_.end(), suffix) != frozen_.end();
}

void Layer::quantize_frozen(const std::string& suffix, FrozenFormat format, std::int64_t block,
                            std::shared_ptr<Tensor> scratch) {
  if (!frozen(suffix) || !can_quantize(suffix) || format == FrozenFormat::compute)
    throw std::logic_error("quantize_frozen: " + name_ + "." + suffix +
                           " is not a frozen parameter this op can store quantized");
  if (!quantized(suffix)) quantized_.push_back(suffix);
  quant_format_ = format;
  quant_block_ = block;
  dequant_scratch_ = std::move(scratch);
}

bool Layer::quantized(const std::string& suffix) const {
  return std::find(quantized_.begin(), quantized_.end(), suffix) != quantized_.end();
}

TensorView Layer::dequantized(const ModelParameter& p, DType dtype) {
  const sdk::Shape shape = p.quant.shape;
  Tensor& scratch = *dequant_scratch_;
  if (scratch.empty() || scratch.dtype() != dtype || scratch.shape().numel() < shape.numel())
    scratch = Tensor(backend_, dtype, sdk::Shape{shape.numel()});
  const TensorView out{scratch.view().data, dtype, shape};
  decode(facets(), p.quant, out);
  return out;
}

ModelParameter Layer::make_parameter(const std::string& suffix, sdk::Shape shape, bool decay,
                                     std::optional<DType> weight) {
  ModelParameter p;
  p.name = name_ + "." + suffix;
  p.weight_decay = decay;
  p.frozen = frozen(suffix);
  if (p.frozen && quantized(suffix)) {
    p.quant = make_quantized_weight(backend_, quant_format_, shape, quant_block_);
    return p;
  }
  const bool narrow = weight && ops::needs_working_copy(*weight);
  if (narrow) p.working = Tensor(backend_, *weight, shape);
  if (!(p.frozen && narrow)) p.master = Tensor(backend_, DType::fp32, shape);
  if (!p.frozen && parameter_gradients_) {
    p.grad = Tensor(backend_, DType::fp32, shape);
    backend_->fill(p.grad.view(), 0.0f);
  }
  return p;
}

void set_parameter_from_fp32(const std::shared_ptr<sdk::DeviceBackend>& backend, ModelParameter& p,
                             const float* host) {
  if (p.quantized()) return quantize_from_host(*backend, p.quant, host);
  if (!p.master.empty()) {
    backend->copy_from_host(p.master.view(), host);
    return;
  }
  // The same cast refresh_working_copies applies to a master, so a frozen copy holds the bits
  // a trained parameter's working copy would.
  const Tensor wide(backend, DType::fp32, p.working.shape());
  backend->copy_from_host(wide.view(), host);
  backend->cast(wide.view(), p.working.view());
}

std::vector<float> parameter_to_host_fp32(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                          const ModelParameter& p) {
  if (p.quantized()) return dequantize_to_host(*backend, p.quant);
  std::vector<float> out(static_cast<std::size_t>(p.numel()));
  Tensor scratch;
  copy_to_host_fp32(backend, p.value(), out.data(), scratch);
  return out;
}

ModelBuffer Layer::make_buffer(const std::string& suffix, sdk::Shape shape, float value) {
  ModelBuffer b;
  b.name = name_ + "." + suffix;
  b.value = Tensor(backend_, DType::fp32, shape);
  backend_->fill(b.value.view(), value);
  return b;
}

std::vector<ModelParameter*> Layer::used_parameters() {
  std::vector<ModelParameter*> out;
  for (const auto& [slot, bound] : shared_) out.push_back(bound);
  for (auto& p : params_) out.push_back(&p);
  return out;
}

TensorView Layer::scratch_tensor(Tensor& scratch, DType dtype, sdk::Shape shape) {
  if (scratch.empty() || scratch.dtype() != dtype || scratch.shape().numel() < shape.numel()) {
    if (pass_scratch_ && scratch.empty()) pass_made_.push_back(&scratch);
    scratch = Tensor(backend_, dtype, shape);
  }
  return {scratch.view().data, dtype, shape};
}

void Layer::release_pass_scratch() {
  for (Tensor* t : pass_made_) *t = Tensor();
  pass_made_.clear();
}

TensorView Layer::as_dtype(TensorView x, DType dtype, Tensor& scratch) {
  if (x.dtype == dtype) return x;
  const TensorView dst = scratch_tensor(scratch, dtype, x.shape);
  sdk::CastArgs args;
  args.saturate = sdk::is_fp8(dtype);  // unscaled FP8 (an override): clamp rather than NaN
  backend_->cast(x, dst, args);
  return dst;
}

}  // namespace mixtrain::core
