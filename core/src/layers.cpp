#include "mixtrain/core/layers.h"

#include <cmath>
#include <vector>

#include "mixtrain/core/random.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {
// tf32 is fp32 storage rounded inside the GEMM; every other dtype is its own storage.
DType storage_of(DType t) { return t == DType::tf32 ? DType::fp32 : t; }
bool needs_working_copy(DType weight) { return weight != DType::fp32 && weight != DType::tf32; }
// The first n elements of a rank-1 tensor.
TensorView prefix(const Tensor& t, std::int64_t n) { return {t.view().data, t.dtype(), sdk::Shape{n}}; }

void fill_uniform(sdk::DeviceBackend& backend, const Tensor& t, double bound, std::uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> host(static_cast<std::size_t>(t.shape().numel()));
  for (auto& v : host) v = static_cast<float>(rng.uniform(-bound, bound));
  backend.copy_from_host(t.view(), host.data());
}
}  // namespace

Layer::Layer(std::string name, std::string type, std::int64_t in, std::int64_t out)
    : name_(std::move(name)), type_(std::move(type)), in_(in), out_(out) {}
Layer::~Layer() = default;

sdk::LayerDescription Layer::description() const {
  return {name_, type_, in_, out_, has_gemm()};
}

void Layer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) {
  backend_ = backend;
  max_rows_ = max_rows;
  output_ = Tensor();
  if (!output_deferred()) materialise_output();
}

void Layer::materialise_output() {
  if (output_.empty())
    output_ = Tensor(backend_, storage_of(precision_.activation), sdk::Shape{max_rows_, out_});
}

TensorView Layer::output(std::int64_t rows) const {
  if (output_.empty()) return {nullptr, storage_of(precision_.activation), sdk::Shape{rows, out_}};
  return output_.rows(rows);
}

ModelParameter Layer::make_parameter(const std::string& suffix, sdk::Shape shape, bool decay) {
  ModelParameter p;
  p.name = name_ + "." + suffix;
  p.master = Tensor(backend_, DType::fp32, shape);
  p.grad = Tensor(backend_, DType::fp32, shape);
  backend_->fill(p.grad.view(), 0.0f);
  p.weight_decay = decay;
  return p;
}

TensorView Layer::as_dtype(TensorView x, DType dtype, Tensor& scratch) {
  if (x.dtype == dtype) return x;
  if (scratch.empty() || scratch.dtype() != dtype ||
      scratch.shape().numel() < x.numel())
    scratch = Tensor(backend_, dtype, x.shape);
  TensorView dst{scratch.view().data, dtype, x.shape};
  sdk::CastArgs args;
  args.saturate = sdk::is_fp8(dtype);  // unscaled FP8 (an override): clamp rather than NaN
  backend_->cast(x, dst, args);
  return dst;
}

// --- Linear -------------------------------------------------------------------------------------

LinearLayer::LinearLayer(std::string name, std::int64_t in, std::int64_t out, bool bias)
    : Layer(std::move(name), "linear", in, out), bias_(bias) {}

void LinearLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                           std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  params_.push_back(make_parameter("weight", sdk::Shape{out_, in_}, true));
  if (needs_working_copy(precision_.weight))
    params_.back().working = Tensor(backend, precision_.weight, sdk::Shape{out_, in_});
  if (bias_) params_.push_back(make_parameter("bias", sdk::Shape{out_}, false));
}

void LinearLayer::init_parameters(std::uint64_t seed) {
  // PyTorch nn.Linear: kaiming_uniform(a=√5) → U(-1/√in, 1/√in) for weight and bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  fill_uniform(*backend_, params_[0].master, bound, derive_seed(seed, (name_ + ".weight").c_str()));
  if (bias_) fill_uniform(*backend_, params_[1].master, bound, derive_seed(seed, (name_ + ".bias").c_str()));
}

namespace {
int role_slot(sdk::OperandRole role) {
  switch (role) {
    case sdk::OperandRole::input: return 0;
    case sdk::OperandRole::weight: return 1;
    default: return 2;
  }
}
constexpr sdk::OperandRole kRoles[3] = {sdk::OperandRole::input, sdk::OperandRole::weight,
                                        sdk::OperandRole::grad_output};
}  // namespace

sdk::GemmOperand LinearLayer::scale_operand(TensorView src, sdk::OperandRole role,
                                            ScaledOperand& dst) {
  if (amax_.empty()) {
    amax_ = Tensor(backend_, DType::fp32, sdk::Shape{3});
    backend_->fill(amax_.view(), 0.0f);
  }
  const int slot = role_slot(role);
  const TensorView amax_slot{static_cast<float*>(amax_.view().data) + slot, DType::fp32,
                             sdk::Shape{1}};
  const bool current = scaling_->wants_current_amax();
  float measured = 0.0f;
  if (current) {
    // Current scaling: the scale comes from this very tensor, so its amax is measured (a cast at
    // scale 1 with a fused amax into the scratch the real cast overwrites next) and read before
    // the scale is asked for: the one host wait this scaling needs per operand.
    auto probe = scaling_->operand_scaling(name_, role);
    if (dst.data.empty() || dst.data.dtype() != probe.dtype || dst.data.shape().numel() < src.numel())
      dst.data = Tensor(backend_, probe.dtype, src.shape);
    backend_->fill(amax_slot, 0.0f);
    sdk::CastArgs measure;
    measure.saturate = true;
    measure.amax = amax_slot;
    backend_->cast(src, TensorView{dst.data.view().data, probe.dtype, src.shape}, measure);
    backend_->copy_to_host(&measured, amax_slot);
    scaling_->record_amax(name_, role, measured);
  }
  const auto s = scaling_->operand_scaling(name_, role);
  if (dst.data.empty() || dst.data.dtype() != s.dtype || dst.data.shape().numel() < src.numel())
    dst.data = Tensor(backend_, s.dtype, src.shape);
  TensorView out{dst.data.view().data, s.dtype, src.shape};
  sdk::CastArgs args;
  args.scale = s.scale;
  args.saturate = true;
  if (!current) {
    // Delayed scaling: the amax of this cast feeds later steps' scales only, so it stays on the
    // device until flush_operand_amaxes() (after the step's found_inf read).
    backend_->fill(amax_slot, 0.0f);
    args.amax = amax_slot;
    amax_pending_[slot] = true;
  }
  backend_->cast(src, out, args);
  dst.scale_inv = s.scale_inv;
  if (collect_stats_) {
    // Diagnostics only: what saturated and what flushed to zero in this cast.
    float amax = measured;
    if (!current) backend_->copy_to_host(&amax, amax_slot);
    std::vector<float> in(static_cast<std::size_t>(src.numel())), back(in.size());
    TensorView as_fp32{nullptr, DType::fp32, src.shape};
    Tensor tmp(backend_, DType::fp32, src.shape);
    as_fp32.data = tmp.view().data;
    backend_->cast(src, as_fp32);
    backend_->copy_to_host(in.data(), as_fp32);
    backend_->cast(out, as_fp32);
    backend_->copy_to_host(back.data(), as_fp32);
    const float max_finite = s.dtype == DType::fp8_e5m2 ? 57344.0f : 448.0f;
    ScaledOperandStats st{name_ + "." + std::string(sdk::operand_role_name(role)), s.dtype, amax,
                          s.scale, src.numel(), 0, 0, 0};
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (in[i] == 0.0f) continue;
      ++st.nonzero;
      if (std::abs(in[i] * s.scale) > max_finite) ++st.saturated;
      if (back[i] == 0.0f) ++st.underflowed;
    }
    stats_.push_back(st);
  }
  return {out, false, s.scale_inv};
}

void LinearLayer::flush_operand_amaxes() {
  if (scaling_ == nullptr || amax_.empty()) return;
  if (!amax_pending_[0] && !amax_pending_[1] && !amax_pending_[2]) return;
  float host[3] = {0.0f, 0.0f, 0.0f};
  backend_->copy_to_host(host, amax_.view());
  for (int i = 0; i < 3; ++i) {
    if (!amax_pending_[i]) continue;
    amax_pending_[i] = false;
    scaling_->record_amax(name_, kRoles[i], host[i]);
  }
}

void LinearLayer::fuse_activation(ActivationLayer* next) {
  if (fused_ != nullptr) fused_->fused_ = false;
  fused_ = next;
  if (fused_ != nullptr) fused_->fused_ = fusion_on_;
}

bool LinearLayer::output_deferred() const {
  // A fused relu's backward reads the activation's output, so z is never needed.
  return fused() && fused_->activation() == sdk::Activation::relu;
}

void LinearLayer::set_fusion(bool on) {
  fusion_on_ = on;
  if (fused_ != nullptr) fused_->fused_ = on;
}

void LinearLayer::forward(TensorView x, std::int64_t rows) {
  const DType in_storage = storage_of(precision_.gemm_input);
  sdk::GemmArgs g;
  if (scaling_ != nullptr) {
    g.a = scale_operand(x, sdk::OperandRole::input, x8_);
    g.b = scale_operand(params_[0].compute_view(), sdk::OperandRole::weight, w8_);
  } else {
    g.a.view = as_dtype(x, in_storage, x_scratch_);
    g.b.view = params_[0].compute_view();
  }
  g.b.transpose = true;
  if (fused()) {
    g.c = fused_->output(rows);
    g.has_activation = true;
    g.activation = fused_->activation();
    if (g.activation != sdk::Activation::relu) {
      materialise_output();
      g.pre_activation = output_.rows(rows);
    }
  } else {
    materialise_output();  // a deferred output, the first time this layer runs unfused
    g.c = output_.rows(rows);
  }
  if (bias_) g.bias = params_[1].master.view();
  g.compute = precision_.gemm_input;
  backend_->gemm(g);
}

void LinearLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  (void)rows;
  const DType in_storage = storage_of(precision_.gemm_input);
  sdk::GemmOperand dy_g, x_g, w_g;
  if (scaling_ != nullptr) {
    // The input and weight operands were cast (and scaled) by the forward of this step.
    dy_g = scale_operand(dy, sdk::OperandRole::grad_output, dy8_);
    x_g = {TensorView{x8_.data.view().data, x8_.data.dtype(), x.shape}, false, x8_.scale_inv};
    w_g = {TensorView{w8_.data.view().data, w8_.data.dtype(), sdk::Shape{out_, in_}}, false,
           w8_.scale_inv};
  } else {
    dy_g.view = as_dtype(dy, in_storage, dy_scratch_);
    x_g.view = as_dtype(x, in_storage, x_scratch_);
    w_g.view = params_[0].compute_view();
  }
  // dW[out, in] = dyᵀ[out, rows] · x[rows, in]
  sdk::GemmArgs gw;
  gw.a = dy_g;
  gw.a.transpose = true;
  gw.b = x_g;
  gw.c = params_[0].grad.view();
  gw.compute = precision_.gemm_input;
  backend_->gemm(gw);
  if (bias_) backend_->bias_grad(dy, params_[1].grad.view(), false);
  if (!dx.empty()) {
    // dx[rows, in] = dy[rows, out] · W[out, in]
    sdk::GemmArgs gx;
    gx.a = dy_g;
    gx.a.transpose = false;
    gx.b = w_g;
    gx.c = dx;
    gx.compute = precision_.gemm_input;
    backend_->gemm(gx);
  }
}

// --- Activations --------------------------------------------------------------------------------

ActivationLayer::ActivationLayer(std::string name, sdk::Activation act, std::int64_t features)
    : Layer(std::move(name), act == sdk::Activation::relu ? "relu" : "gelu", features, features),
      act_(act) {}

void ActivationLayer::forward(TensorView x, std::int64_t rows) {
  if (fused_) return;  // the Linear before it wrote act(z) here as its GEMM epilogue
  backend_->activation_forward(act_, x, output_.rows(rows));
}

void ActivationLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  if (dx.empty()) return;
  // Fused relu: z was not stored; relu'(z) = [z > 0] = [relu(z) > 0], so the output serves.
  const TensorView in = fused_ && act_ == sdk::Activation::relu ? output_.rows(rows) : x;
  backend_->activation_backward(act_, in, dy, dx);
}

// --- LayerNorm ----------------------------------------------------------------------------------

LayerNormLayer::LayerNormLayer(std::string name, std::int64_t features, float eps)
    : Layer(std::move(name), "layernorm", features, features), eps_(eps) {}

void LayerNormLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                              std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  params_.push_back(make_parameter("weight", sdk::Shape{in_}, false));
  params_.push_back(make_parameter("bias", sdk::Shape{in_}, false));
  mean_ = Tensor(backend, DType::fp32, sdk::Shape{max_rows});
  rstd_ = Tensor(backend, DType::fp32, sdk::Shape{max_rows});
}

void LayerNormLayer::init_parameters(std::uint64_t) {
  backend_->fill(params_[0].master.view(), 1.0f);
  backend_->fill(params_[1].master.view(), 0.0f);
}

void LayerNormLayer::forward(TensorView x, std::int64_t rows) {
  backend_->layernorm_forward(x, params_[0].master.view(), params_[1].master.view(), eps_,
                              output_.rows(rows), prefix(mean_, rows), prefix(rstd_, rows));
}

void LayerNormLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  Tensor unused;
  TensorView dx_target = dx;
  if (dx.empty()) {  // first layer: the input gradient is not needed but the kernel writes one
    unused = Tensor(backend_, DType::fp32, sdk::Shape{rows, in_});
    dx_target = unused.view();
  }
  backend_->layernorm_backward(dy, x, params_[0].master.view(), prefix(mean_, rows),
                               prefix(rstd_, rows), dx_target, params_[0].grad.view(),
                               params_[1].grad.view(), false);
}

// --- Add ----------------------------------------------------------------------------------------

AddLayer::AddLayer(std::string name, std::size_t inputs, std::int64_t features)
    : Layer(std::move(name), "add", features, features), inputs_(inputs) {}

void AddLayer::forward(TensorView x, std::int64_t rows) {
  const TensorView xs[1] = {x};
  forward_inputs(xs, rows);
}

void AddLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  const TensorView xs[1] = {x}, dxs[1] = {dx};
  backward_inputs(xs, dy, dxs, rows);
}

void AddLayer::forward_inputs(std::span<const TensorView> xs, std::int64_t rows) {
  // x is [rows, features] per input; y = sum in FP32 (axpy), rounded once into y's dtype.
  const TensorView y = output_.rows(rows);
  TensorView acc = y;
  if (y.dtype != DType::fp32) {
    if (sum_.empty()) sum_ = Tensor(backend_, DType::fp32, sdk::Shape{max_rows_, out_});
    acc = sum_.rows(rows);
  }
  if (xs[0].dtype == DType::fp32)
    backend_->copy(acc, xs[0]);
  else
    backend_->cast(xs[0], acc);
  for (std::size_t i = 1; i < xs.size(); ++i) backend_->axpy(1.0f, xs[i], acc);
  if (acc.data != y.data) backend_->cast(acc, y);
}

void AddLayer::backward_inputs(std::span<const TensorView>, TensorView dy,
                               std::span<const TensorView> dxs, std::int64_t) {
  for (const TensorView& dx : dxs) {
    if (dx.empty()) continue;
    if (dx.dtype == dy.dtype)
      backend_->copy(dx, dy);
    else
      backend_->cast(dy, dx);
  }
}

// --- Views ----------------------------------------------------------------------------------------

ViewLayer::ViewLayer(std::string name, std::string type, std::int64_t in, std::int64_t out)
    : Layer(std::move(name), std::move(type), in, out) {}

}  // namespace mixtrain::core
