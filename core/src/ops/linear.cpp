#include "ops/linear.h"

#include <cmath>

#include "ops/activation.h"
#include "ops/op_registry.h"
#include "ops/op_support.h"

namespace mixtrain::core {

using ops::fill_uniform;
using ops::needs_working_copy;
using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

namespace {
constexpr sdk::OperandRole kRoles[3] = {sdk::OperandRole::input, sdk::OperandRole::weight,
                                        sdk::OperandRole::grad_output};
}  // namespace

LinearLayer::LinearLayer(std::string name, std::int64_t in, std::int64_t out, bool bias,
                         std::string tie_weight, sdk::SourceLocation tie_where, double init_std)
    : Layer(std::move(name), "linear", in, out),
      bias_(bias),
      init_std_(init_std),
      tie_weight_(std::move(tie_weight)),
      tie_where_(std::move(tie_where)) {
  for (auto role : kRoles) slots_.emplace_back(name_, kGemm, role);
}

std::vector<sdk::GemmDescription> LinearLayer::gemms() const {
  return {{kGemm, {kRoles[0], kRoles[1], kRoles[2]}}};
}

void LinearLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                           std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  tied_ = nullptr;  // the model binds it again after allocate()
  if (tie_weight_.empty()) {
    params_.push_back(make_parameter("weight", sdk::Shape{out_, in_}, true));
    if (needs_working_copy(precision_.weight))
      params_.back().working = Tensor(backend, precision_.weight, sdk::Shape{out_, in_});
  }
  if (bias_) params_.push_back(make_parameter("bias", sdk::Shape{out_}, false));
}

void LinearLayer::init_parameters(std::uint64_t seed) {
  // A tied weight is initialised by its owner.
  if (init_std_ > 0.0) {
    // GPT-2 / nanoGPT: weight N(0, std²), bias 0.
    if (tie_weight_.empty())
      ops::fill_normal(*backend_, params_[0].master, init_std_,
                       derive_seed(seed, (name_ + ".weight").c_str()));
    if (bias_) backend_->fill(bias().master.view(), 0.0f);
    return;
  }
  // PyTorch nn.Linear: kaiming_uniform(a=√5) → U(-1/√in, 1/√in) for weight and bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  if (tie_weight_.empty())
    fill_uniform(*backend_, params_[0].master, bound,
                 derive_seed(seed, (name_ + ".weight").c_str()));
  if (bias_)
    fill_uniform(*backend_, bias().master, bound, derive_seed(seed, (name_ + ".bias").c_str()));
}

std::vector<std::int64_t> LinearLayer::parameter_shape(const std::string& suffix) const {
  if (suffix == "weight" && tie_weight_.empty()) return {out_, in_};
  if (suffix == "bias" && bias_) return {out_};
  return {};
}

std::vector<SharedParameter> LinearLayer::shared_parameters() const {
  if (tie_weight_.empty()) return {};
  return {{"weight", tie_weight_, tie_where_, "tie_weight", {out_, in_}}};
}

void LinearLayer::bind_shared_parameter(const std::string& suffix, ModelParameter& source) {
  if (suffix == "weight") tied_ = &source;
}

std::vector<ModelParameter*> LinearLayer::used_parameters() {
  auto out = Layer::used_parameters();
  if (tied_ != nullptr) out.insert(out.begin(), tied_);
  return out;
}

TensorView LinearLayer::weight_operand() {
  ModelParameter& w = weight();
  const TensorView view = w.compute_view();
  const DType want = storage_of(precision_.weight);
  if (tied_ == nullptr || view.dtype == want) return view;
  return as_dtype(w.master.view(), want, w_scratch_);
}

namespace {
int role_slot(sdk::OperandRole role) {
  switch (role) {
    case sdk::OperandRole::input:
      return 0;
    case sdk::OperandRole::weight:
      return 1;
    default:
      return 2;
  }
}
}  // namespace

sdk::GemmOperand LinearLayer::scale_operand(TensorView src, sdk::OperandRole role,
                                            ScaledOperand& dst) {
  if (amax_.empty()) {
    amax_ = Tensor(backend_, DType::fp32, sdk::Shape{3});
    backend_->fill(amax_.view(), 0.0f);
  }
  const int slot = role_slot(role);
  const sdk::OperandSlot& operand = slots_[static_cast<std::size_t>(slot)];
  const TensorView amax_slot{static_cast<float*>(amax_.view().data) + slot, DType::fp32,
                             sdk::Shape{1}};
  const bool current = scaling_->wants_current_amax();
  float measured = 0.0f;
  if (current) {
    // Current scaling: the scale comes from this very tensor, so its amax is measured (a cast at
    // scale 1 with a fused amax into the scratch the real cast overwrites next) and read before
    // the scale is asked for: the one host wait this scaling needs per operand.
    auto probe = scaling_->operand_scaling(operand);
    if (dst.data.empty() || dst.data.dtype() != probe.dtype ||
        dst.data.shape().numel() < src.numel())
      dst.data = Tensor(backend_, probe.dtype, src.shape);
    backend_->fill(amax_slot, 0.0f);
    sdk::CastArgs measure;
    measure.saturate = true;
    measure.amax = amax_slot;
    backend_->cast(src, TensorView{dst.data.view().data, probe.dtype, src.shape}, measure);
    backend_->copy_to_host(&measured, amax_slot);
    scaling_->record_amax(operand, measured);
  }
  const auto s = scaling_->operand_scaling(operand);
  if (dst.data.empty() || dst.data.dtype() != s.dtype || dst.data.shape().numel() < src.numel())
    dst.data = Tensor(backend_, s.dtype, src.shape);
  TensorView out{dst.data.view().data, s.dtype, src.shape};
  sdk::CastArgs args;
  args.scale = s.scale;
  args.saturate = true;
  if (!current) {
    // Delayed scaling: the amax of this cast feeds later steps' scales only, so it stays on the
    // device until flush_operand_amaxes() (after the step's found_inf read). Micro-batches after
    // the first of a step add to the same measurement: the step's amax is their maximum.
    if (micro_batch_ == 0 || !amax_pending_[slot]) backend_->fill(amax_slot, 0.0f);
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
    ScaledOperandStats st{operand.name(), s.dtype, amax, s.scale, src.numel(), 0, 0, 0};
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
    scaling_->record_amax(slots_[static_cast<std::size_t>(i)], host[i]);
  }
}

bool LinearLayer::fuse_reader(Layer& reader) {
  auto* next = dynamic_cast<ActivationLayer*>(&reader);
  if (next == nullptr) return false;
  if (fused_ != nullptr) fused_->fused_ = false;
  fused_ = next;
  fused_->fused_ = fusion_on_;
  return true;
}

bool LinearLayer::output_deferred() const {
  // A fused relu's backward reads the activation's output, so z is never needed.
  return fused() && fused_->activation() == sdk::Activation::relu;
}

void LinearLayer::set_fusion(bool on) {
  fusion_on_ = on;
  if (fused_ != nullptr) fused_->fused_ = on;
}

std::vector<BackendNeed> LinearLayer::backend_needs(DType) const {
  // The input is cast to the GEMM's dtype first (casts are the backend's core), so the GEMMs see
  // the plan's dtypes: y = x·Wᵀ into the activation, dW into fp32, dx into the input's gradient.
  const DType g = precision_.gemm_input;
  std::vector<BackendNeed> needs = {
      {sdk::GemmOp::gemm, {g, g, storage_of(precision_.activation)}},
      {sdk::GemmOp::gemm, {g, g, DType::fp32}},
      {sdk::GemmOp::gemm, {g, g, storage_of(precision_.activation_grad)}}};
  if (bias_)
    needs.push_back(
        {sdk::ElementwiseOp::bias_grad, {storage_of(precision_.activation), DType::fp32}});
  return needs;
}

void LinearLayer::forward(TensorView x, std::int64_t rows) {
  const DType in_storage = storage_of(precision_.gemm_input);
  sdk::GemmArgs g;
  if (scaling_ != nullptr) {
    g.a = scale_operand(x, sdk::OperandRole::input, x8_);
    g.b = scale_operand(weight_operand(), sdk::OperandRole::weight, w8_);
  } else {
    g.a.view = as_dtype(x, in_storage, x_scratch_);
    g.b.view = weight_operand();
  }
  g.b.transpose = true;
  if (fused()) {
    g.c = fused_->output(rows);
    g.has_activation = true;
    g.activation = fused_->activation();
    if (g.activation != sdk::Activation::relu) {
      materialise_output();
      g.pre_activation = output(rows);
    }
  } else {
    materialise_output();  // a deferred output, the first time this layer runs unfused
    g.c = output(rows);
  }
  if (bias_) g.bias = bias().master.view();
  g.compute = precision_.gemm_input;
  gemm_of(*backend_).gemm(g);
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
    w_g.view = weight_operand();
  }
  // dW[out, in] (+)= dyᵀ[out, rows] · x[rows, in]
  sdk::GemmArgs gw;
  gw.a = dy_g;
  gw.a.transpose = true;
  gw.b = x_g;
  gw.c = weight().grad.view();
  gw.beta = weight().take_grad_beta();
  gw.compute = precision_.gemm_input;
  gemm_of(*backend_).gemm(gw);
  if (bias_)
    elementwise_of(*backend_).bias_grad(dy, bias().grad.view(), bias().take_grad_beta() != 0.0f);
  if (!dx.empty()) {
    // dx[rows, in] = dy[rows, out] · W[out, in]
    sdk::GemmArgs gx;
    gx.a = dy_g;
    gx.a.transpose = false;
    gx.b = w_g;
    gx.c = dx;
    gx.compute = precision_.gemm_input;
    gemm_of(*backend_).gemm(gx);
  }
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition linear_op() {
  OpDefinition op;
  op.type = "linear";
  op.summary = "y = x Wᵀ + b on the last dimension";
  op.has_parameters = true;
  op.schema = [] {
    return sdk::OptionSchema{
        sdk::OptionSpec::required("out", sdk::OptionType::integer, "output features")
            .at_least(1)
            .at_most(static_cast<double>(ops::kMaxDim)),
        sdk::OptionSpec::boolean("bias", true, "add a learned bias"),
        sdk::OptionSpec::string("tie_weight", "",
                                "use another node's parameter as this weight (weight tying), "
                                "e.g. \"embed.weight\"; it must be [out, in]"),
        sdk::OptionSpec::number("init_std", 0.0,
                                "0: PyTorch's nn.Linear init; > 0: weight N(0, std²) and bias 0 "
                                "(GPT-2 uses 0.02)")
            .at_least(0.0)};
  };
  op.build = [](const OpNode& node) {
    const auto& in = node.inputs;
    const std::int64_t out = node.options.get_int("out");
    PerSampleShape shape = in[0];
    shape.back() = out;
    return BuiltOp{std::make_unique<LinearLayer>(
                       node.name, in[0].back(), out, node.options.get_bool("bias"),
                       node.options.get_string("tie_weight"), node.options.where("tie_weight"),
                       node.options.get_double("init_std")),
                   shape};
  };
  return op;
}

}  // namespace mixtrain::core
