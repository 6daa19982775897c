#include "graph/ops/linear.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string_view>

#include "graph/ops/activation.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/support/backend_features.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "profiling/profile_scope.h"

namespace mixtrain::core {

using ops::fill_uniform;
using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

namespace {
constexpr sdk::OperandRole kRoles[3] = {sdk::OperandRole::input, sdk::OperandRole::weight,
                                        sdk::OperandRole::grad_output};
}  // namespace

LinearLayer::LinearLayer(std::string name, std::int64_t in, std::int64_t out, bool bias,
                         std::string tie_weight, sdk::SourceLocation tie_where, double init_std,
                         double scale, bool zero_init)
    : Layer(std::move(name), "linear", in, out),
      bias_(bias),
      init_std_(init_std),
      scale_(scale),
      zero_init_(zero_init),
      tie_weight_(std::move(tie_weight)),
      tie_where_(std::move(tie_where)),
      scaler_(name_, kGemm),
      blocks_(name_, kGemm) {
  use_operand_scaler(&scaler_);
  traits_.gemms = {{kGemm, {kRoles[0], kRoles[1], kRoles[2]}}};
  traits_.forward_flops_per_row = 2 * in_ * out_ + (bias_ ? out_ : 0);
  traits_.reads_input_as_gemm_operand = true;
  traits_.backward_keeps_output_gradient = true;  // dy is read as GEMM operands, or cast apart
  if (tie_weight_.empty())
    traits_.parameters.push_back({"weight", {out_, in_}});
  else
    traits_.shared_parameters = {{"weight", tie_weight_, tie_where_, "tie_weight", {out_, in_}}};
  if (bias_) traits_.parameters.push_back({"bias", {out_}});
}

void LinearLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                           std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  if (tie_weight_.empty())
    params_.push_back(make_parameter("weight", sdk::Shape{out_, in_}, true, precision_.weight));
  if (bias_) params_.push_back(make_parameter("bias", sdk::Shape{out_}, false));
}

void LinearLayer::init_parameters(std::uint64_t seed) {
  run_seed_ = seed;
  if (zero_init_) {
    // LoRA's B: the adapter adds nothing until it has trained. value(): a frozen weight may have
    // no master.
    if (tie_weight_.empty() && params_[0].quantized()) {
      const std::vector<float> zeros(static_cast<std::size_t>(params_[0].numel()), 0.0f);
      set_parameter_from_fp32(backend_, params_[0], zeros.data());
    } else if (tie_weight_.empty()) {
      backend_->fill(params_[0].value(), 0.0f);
    }
    if (bias_) backend_->fill(bias().value(), 0.0f);
    return;
  }
  // A tied weight is initialised by its owner.
  if (init_std_ > 0.0) {
    // GPT-2 / nanoGPT: weight N(0, std²), bias 0.
    if (tie_weight_.empty())
      ops::fill_normal(backend_, params_[0], init_std_,
                       derive_seed(seed, (name_ + ".weight").c_str()));
    if (bias_) backend_->fill(bias().master.view(), 0.0f);
    return;
  }
  // PyTorch nn.Linear: kaiming_uniform(a=√5) → U(-1/√in, 1/√in) for weight and bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  if (tie_weight_.empty())
    fill_uniform(backend_, params_[0], bound, derive_seed(seed, (name_ + ".weight").c_str()));
  if (bias_) fill_uniform(backend_, bias(), bound, derive_seed(seed, (name_ + ".bias").c_str()));
}

TensorView LinearLayer::weight_operand() {
  // Inside one pass's loss blocks the weight cannot change: the first block's operand serves them
  // all (a tied LM head under bf16 casts GPT-2's fp32 [50257, 768] embedding otherwise, twice a
  // block: 16 casts, 1.35 ms a step on an H200).
  if (!block_weight_.empty()) return block_weight_;
  ModelParameter& w = weight();
  if (w.quantized()) return dequantized(w, storage_of(precision_.weight));
  const TensorView view = w.compute_view();
  const DType want = storage_of(precision_.weight);
  if (tied() == nullptr || view.dtype == want) return view;
  return as_dtype(w.value(), want, w_scratch_);
}

bool LinearLayer::fuse_reader(Layer& reader) {
  auto* next = dynamic_cast<ActivationLayer*>(&reader);
  if (next == nullptr) return false;
  if (fused_ != nullptr) {
    fused_->fused_ = false;
    fused_->producer_ = nullptr;
    fused_->traits_.output_written_by_input = false;
  }
  fused_ = next;
  fused_->producer_ = this;
  update_fusion();
  return true;
}

bool LinearLayer::fuse_input(std::size_t k, Layer& input) {
  auto* act = dynamic_cast<ActivationLayer*>(&input);
  // gemm_gradient defines gelu's gradient only; relu's mask is cheap beside its own pass.
  if (k != 0 || act == nullptr || act->activation() != sdk::Activation::gelu ||
      act->producer_ == nullptr)
    return false;
  grad_input_ = act;
  act->grad_reader_ = this;
  update_fusion();
  return true;
}

void LinearLayer::choose_kernels(sdk::DeviceBackend& backend) {
  // wgrad writes fp32, dgrad the input's gradient dtype (gelu's gradient: the activation's).
  const DType g = precision_.gemm_input;
  // A gelu epilogue of bf16 GEMMs that the backend runs faster apart (backend_features.h). FP8
  // and block-scaled operands keep theirs: their casts and quantizers are the fused work.
  const bool has_gelu = (fused_ != nullptr && fused_->activation() == sdk::Activation::gelu) ||
                        grad_input_ != nullptr;
  gelu_unfused_ = has_gelu && g == DType::bf16 && !scaler_.active() && !blocks_.active() &&
                  sdk::has_feature(backend.capabilities(), sdk::kFeatureGemmBf16GeluUnfused);
  if (gelu_unfused_ && fusion_on_)
    ops::log_once("linear", "gelu_unfused",
                  "the backend runs bf16 GEMMs faster without a gelu epilogue: node '" + name_ +
                      "' and the linears like it run their gelu as its own op, forward and "
                      "backward (the rounded z in, as PyTorch AMP)");
  gradient_gemm_ =
      !unmet(backend, {sdk::GemmOp::gemm_gradient, {g, g, DType::fp32}}) &&
      !unmet(backend, {sdk::GemmOp::gemm_gradient, {g, g, storage_of(precision_.activation_grad)}});
  // What the backward computes apart from the GEMMs when it cannot fold it in: the messages name
  // what this linear has (a relu-only model has no gelu to speak of).
  const auto apart = [&](const char* activation) {
    std::string what = bias_ ? "the bias gradients" : "";
    if (activation != nullptr)
      what += (what.empty() ? "" : " and ") + std::string(activation) + "'s gradient";
    return what;
  };
  const auto activation_of = [](const ActivationLayer* act) -> const char* {
    if (act == nullptr) return nullptr;
    return act->activation() == sdk::Activation::gelu ? "gelu" : "relu";
  };
  if (!gradient_gemm_ && fusion_on_ && (bias_ || grad_input_ != nullptr) && !scaler_.active())
    ops::log_once("linear", "gemm_gradient",
                  "the backend has no gemm_gradient (gemm facet 1.5) for node '" + name_ +
                      "' and the linears like it: their backward runs " +
                      apart(activation_of(grad_input_)) + " as separate passes");
  // FP8: dy's cast with its epilogues, for whichever FP8 dtype the policy gives the gradient, under
  // delayed scaling (current scaling would measure dy's amax, not dz's).
  gradient_cast_dtype_ = storage_of(precision_.activation_grad);
  gradient_cast_ = scaler_.active() && scaler_.delayed();
  for (const DType to : {DType::fp8_e4m3, DType::fp8_e5m2})
    for (const auto op : {sdk::GemmOp::cast_transpose, sdk::GemmOp::cast_transpose_gradient})
      gradient_cast_ = gradient_cast_ && !unmet(backend, {op, {gradient_cast_dtype_, to}});
  if (scaler_.active() && scaler_.delayed() && !gradient_cast_ && fusion_on_ &&
      (bias_ || fused_ != nullptr))
    ops::log_once("linear", "cast_transpose_gradient",
                  "the backend's gemm facet has no cast_transpose_gradient (1.7) for " +
                      std::string(sdk::dtype_name(gradient_cast_dtype_)) + " gradients (node '" +
                      name_ + "' and the FP8 linears like it): their backward runs " +
                      apart(activation_of(fused_)) + " as passes of their own before the cast");
  // x is read by wgrad alone (FP8 and block-scaled: its copies from the forward), so a frozen
  // weight of its own (LoRA's base, train.frozen) keeps nothing of it for the backward: the memory
  // plan ends x's life at its forward reads unless another op's backward reads it. A tied weight
  // is another op's parameter, bound after the plans: x is kept.
  traits_.backward_reads_inputs = !(traits_.shared_parameters.empty() && frozen("weight"));
  update_fusion();
}

bool LinearLayer::folds_gradient_cast(DType grad) const {
  return gradient_cast_ && fusion_on_ && !collect_stats_ && grad == gradient_cast_dtype_;
}

bool LinearLayer::casts_gelu_gradient(DType grad) const {
  return epilogue_fused_ && fused_->activation() == sdk::Activation::gelu &&
         folds_gradient_cast(grad) && storage_of(precision_.activation) == grad;
}

bool LinearLayer::declines(const ActivationLayer* act) const {
  return gelu_unfused_ && act != nullptr && act->activation() == sdk::Activation::gelu;
}

bool LinearLayer::input_gradient_fusable() const {
  return grad_input_ != nullptr && fusion_on_ && !declines(grad_input_) && gradient_gemm_ &&
         !scaler_.active() && !blocks_.active() && loss_chunk_rows() == 0;
}

bool LinearLayer::can_accumulate_input_gradient(std::size_t k) const {
  // dgrad's C is then the FP32 sum with beta = 1: {g, g, fp32}, the GEMM wgrad needs anyway.
  return k == 0 && fusion_on_ && !scaler_.active() && !blocks_.active() &&
         !input_gradient_fusable();
}

bool LinearLayer::bias_grad_in_reader() const {
  return fused_ != nullptr && fused_->gradient_in_reader();
}

void LinearLayer::update_fusion() {
  epilogue_fused_ = fused_ != nullptr && fusion_on_ && !declines(fused_);
  if (fused_ != nullptr) {
    fused_->fused_ = epilogue_fused_;
    // The epilogue writes the activation's output in this GEMM, at this op's step.
    fused_->traits_.output_written_by_input = epilogue_fused_;
  }
  // A fused relu's backward reads the activation's output, so z is never needed.
  const bool relu_epilogue = epilogue_fused_ && fused_->activation() == sdk::Activation::relu;
  // Run by the add that reads it (the sum of linears): no output of its own while fused.
  const bool in_reader = runs_in_reader();
  traits_.output_deferred = relu_epilogue || in_reader;
  traits_.forward_in_reader = in_reader;
  // Unfused (the replay), z goes into the relu's output and the relu rectifies it in place; its
  // backward's mask [relu(z) > 0] is [z > 0]. The first linear of a sum goes into the add's
  // output, which the add then adds the other into.
  traits_.output_in_reader = relu_epilogue || (in_reader && home_in_reader_);
  // The gelu whose gradient this dgrad writes where the gelu's output gradient lies asks the plan
  // for one buffer for both (activation.h).
  if (grad_input_ != nullptr)
    grad_input_->set_gradient_through(fusion_on_ && !declines(grad_input_) && gradient_gemm_,
                                      grad_input_->through_for_producer_);
  // So does a gelu whose gradient this linear's FP8 cast computes, which then reads z in this
  // backward: z lives until then (planned once, so whether or not fusion is on at the time).
  const bool gelu_cast =
      fused_ != nullptr && fused_->activation() == sdk::Activation::gelu && gradient_cast_;
  traits_.backward_reads_output = gelu_cast;
  // The gelu's gradient shares its output gradient's memory only while fusion is on, as the
  // reader's fusion asks (the replay's unfused gelu then works in place in the planned buffer).
  if (fused_ != nullptr)
    fused_->set_gradient_through(fused_->through_for_reader_, gelu_cast && fusion_on_);
}

bool LinearLayer::set_block_scaling(const sdk::BlockScalingFacet* facet) {
  blocks_.set_facet(facet);
  traits_.varies_per_step = blocks_.varies_per_step();
  return true;
}

void LinearLayer::defer_into_reader(bool home) {
  into_reader_ = true;
  home_in_reader_ = home;
  update_fusion();
}

bool LinearLayer::can_run_in_reader() const {
  return !scaler_.active() && !blocks_.active() && fused_ == nullptr && loss_chunk_rows() == 0;
}

void LinearLayer::allow_run_in_reader(bool allowed) {
  reader_allows_ = allowed;
  update_fusion();
}

void LinearLayer::forward_into(TensorView y, float beta) {
  // Run inside the add's pass, counted as this node's (train --profile); inside its
  // recomputation, as a recomputation.
  const bool again = std::string_view(ProfileScope::current()) == "recompute";
  const ProfileScope scope(again ? "recompute" : type().c_str(), name().c_str());
  // y[rows, out] (+)= x[rows, in] · Wᵀ (+ b), x as forward() kept it.
  sdk::GemmArgs g = forward_args(reader_x_);
  g.c = y;
  g.beta = beta;
  facets().call(sdk::GemmOp::gemm)->gemm(g);
}

void LinearLayer::set_fusion(bool on) {
  fusion_on_ = on;
  update_fusion();
}

// A quantized frozen weight is decoded into the weight's dtype before the GEMMs read it.
void LinearLayer::add_decoding_need(std::vector<BackendNeed>& needs) const {
  if (!quantized("weight")) return;
  const DType w = storage_of(precision_.weight);
  if (quant_format_ == FrozenFormat::nf4)
    needs.push_back({sdk::QuantizedWeightOp::dequantize_nf4, {DType::fp32, w}});
  else
    needs.push_back({sdk::QuantizedWeightOp::dequantize_block_scaled, {w}});
}

std::vector<BackendNeed> LinearLayer::backend_needs(DType input) const {
  // The input is cast to the GEMM's dtype first (casts are the backend's core), so the GEMMs see
  // the plan's dtypes: y = x·Wᵀ into the activation, dW into fp32, dx into the input's gradient.
  const DType g = precision_.gemm_input;
  if (blocks_.active()) {
    // Each operand is quantized from its own storage; the GEMMs write the plan's dtypes.
    std::vector<BackendNeed> needs = {
        {sdk::GemmOp::quantize_block_scaled, {storage_of(input)}},
        {sdk::GemmOp::quantize_block_scaled, {storage_of(precision_.weight)}},
        {sdk::GemmOp::quantize_block_scaled, {storage_of(precision_.activation)}},
        {sdk::GemmOp::gemm_block_scaled, {storage_of(precision_.activation)}},
        {sdk::GemmOp::gemm_block_scaled, {DType::fp32}},
        {sdk::GemmOp::gemm_block_scaled, {storage_of(precision_.activation_grad)}}};
    if (bias_)
      needs.push_back(
          {sdk::ActivationOp::bias_grad, {storage_of(precision_.activation), DType::fp32}});
    add_decoding_need(needs);
    return needs;
  }
  std::vector<BackendNeed> needs = {
      {sdk::GemmOp::gemm, {g, g, storage_of(precision_.activation)}},
      {sdk::GemmOp::gemm, {g, g, DType::fp32}},
      {sdk::GemmOp::gemm, {g, g, storage_of(precision_.activation_grad)}}};
  if (bias_)
    needs.push_back(
        {sdk::ActivationOp::bias_grad, {storage_of(precision_.activation), DType::fp32}});
  add_decoding_need(needs);
  return needs;
}

sdk::GemmArgs LinearLayer::forward_args(TensorView x) {
  sdk::GemmArgs g;
  if (scaler_.active()) {
    // FP8 (operand_scaler.h): x staged for this GEMM and xᵀ kept for the wgrad (x itself kept
    // where the backend cannot write the transpose in the cast); without a wgrad to come
    // (evaluation, a frozen weight) x is only staged. W and, for the dgrad, Wᵀ are kept.
    auto* stats = collect_stats_ ? &stats_ : nullptr;
    const bool wgrad = training() && !weight().frozen;
    const ScaledLayouts xs =
        scaler_.scale_layouts(backend_, facets(), x, sdk::OperandRole::input, Keep::transient,
                              wgrad ? Keep::kept : Keep::no, stats);
    const ScaledLayouts ws =
        scaler_.scale_layouts(backend_, facets(), weight_operand(), sdk::OperandRole::weight,
                              Keep::kept, training() ? Keep::kept : Keep::no, stats);
    g.a = xs.operand(false, false);
    g.b = ws.operand(true, true);  // op(B) = Wᵀ
  } else {
    g.a.view = as_dtype(x, storage_of(precision_.gemm_input), x_scratch_);
    g.b.view = weight_operand();
    g.b.transpose = true;
  }
  if (bias_) g.bias = bias().master.view();
  g.alpha = static_cast<float>(scale_);
  g.compute = precision_.gemm_input;
  return g;
}

void LinearLayer::forward(TensorView x, std::int64_t rows) {
  if (runs_in_reader()) {
    reader_x_ = x;  // the add that reads this output runs the GEMM (forward_into)
    return;
  }
  if (blocks_.active()) return forward_block_scaled(x, rows);
  sdk::GemmArgs g = forward_args(x);
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
  facets().call(sdk::GemmOp::gemm)->gemm(g);
}

std::string LinearLayer::row_block_refusal() const {
  if (scaler_.active()) return "its FP8 operands are scaled by one amax over the whole batch";
  if (blocks_.active()) return "its operands are block-scaled over the whole batch";
  if (fused_ != nullptr) return "it runs an activation as its epilogue";
  return "";
}

void LinearLayer::forward_rows(TensorView x, TensorView y) {
  if (scaler_.active() || blocks_.active() || fused_ != nullptr)
    throw std::logic_error("forward_rows: node '" + name_ + "': " + row_block_refusal());
  sdk::GemmArgs g = forward_args(x);
  if (padded_block(y)) {
    // y [rows, padded] = x · W_paddedᵀ + b_padded: the extra rows of W are zero, so the extra
    // columns are exactly the bias's lowest finite value (a padded head has no bias of its own).
    g.b.view = padded_w_.view();
    g.bias = padded_bias_.view();
  }
  g.c = y;
  facets().call(sdk::GemmOp::gemm)->gemm(g);
}

void LinearLayer::set_loss_block_padding(std::int64_t multiple) {
  padded_out_ = 0;
  if (multiple <= 1 || out_ % multiple == 0 || bias_ || !row_block_refusal().empty()) return;
  padded_out_ = (out_ / multiple + 1) * multiple;
}

std::optional<DType> LinearLayer::shared_working_dtype(const std::string& suffix) {
  const DType want = storage_of(precision_.weight);
  if (suffix != "weight" || (want != DType::bf16 && want != DType::fp16) || gemm_decodes(want))
    return std::nullopt;
  return want;
}

bool LinearLayer::gemm_decodes(DType weight) {
  if (weight != DType::bf16 && weight != DType::fp16) return false;
  if (!gemm_decodes_known_) {
    const sdk::BackendCapabilities caps = backend_->capabilities();
    decodes_bf16_ = caps.supports(DType::bf16) && !caps.native(DType::bf16);
    decodes_fp16_ = caps.supports(DType::fp16) && !caps.native(DType::fp16);
    gemm_decodes_known_ = true;
  }
  return weight == DType::bf16 ? decodes_bf16_ : decodes_fp16_;
}

namespace {

// Rows [first, first + count) of a row-major [rows, cols] view.
TensorView row_range(const TensorView& v, std::int64_t first, std::int64_t count,
                     std::int64_t cols) {
  return {static_cast<std::byte*>(v.data) +
              static_cast<std::size_t>(first * cols) * sdk::dtype_size(v.dtype),
          v.dtype, sdk::Shape{count, cols}};
}

}  // namespace

void LinearLayer::begin_loss_blocks() {
  block_weight_ = {};
  const DType want = storage_of(precision_.weight);
  ModelParameter& param = weight();
  if (padded_out_ == 0 && tied() != nullptr && !param.quantized() &&
      param.compute_view().dtype != want && gemm_decodes(want)) {
    // A tied head (GPT-2's LM head reads the embedding's fp32 weight) whose backend decodes
    // `want`: weight_operand() would round the whole weight into a `want` copy (73.6 MiB for
    // GPT-2) to decode it here. Instead each 4 MiB slice of rows is rounded into a small buffer
    // and decoded into the fp32 copy: the same values, without the whole 16-bit copy at the
    // loss step's peak.
    decoded_w_ = Tensor(backend_, DType::fp32, sdk::Shape{out_, in_});
    const std::int64_t rows = std::max<std::int64_t>(
        1, (std::int64_t{4} << 20) / (in_ * static_cast<std::int64_t>(sdk::dtype_size(want))));
    Tensor rounded(backend_, want, sdk::Shape{std::min(rows, out_), in_});
    const TensorView source = param.value();
    for (std::int64_t r = 0; r < out_; r += rows) {
      const std::int64_t n = std::min(rows, out_ - r);
      const TensorView mid = row_range(rounded.view(), 0, n, in_);
      backend_->cast(row_range(source, r, n, in_), mid);
      backend_->cast(mid, row_range(decoded_w_.view(), r, n, in_));
    }
    block_weight_ = decoded_w_.view();
    return;
  }
  const TensorView w = weight_operand();
  // Where the backend's GEMMs take this dtype by decoding it to fp32 (the CPU's emulated bf16 and
  // fp16), the pass's GEMMs read W decoded once, in fp32: the same products (the decode is exact)
  // instead of W decoded again at every block's forward and data gradient (32 times a step for
  // GPT-2 small at 4 × 1024 tokens in 256-row blocks). The copy lives for the pass.
  const bool decode_once = gemm_decodes(w.dtype);
  const DType wd = decode_once ? DType::fp32 : w.dtype;
  if (padded_out_ == 0) {
    if (!decode_once) {
      block_weight_ = w;
      return;
    }
    decoded_w_ = Tensor(backend_, DType::fp32, sdk::Shape{out_, in_});
    backend_->cast(w, decoded_w_.view());
    block_weight_ = decoded_w_.view();
    return;
  }
  if (padded_w_.empty() || padded_w_.view().dtype != wd) {
    padded_w_ = Tensor(backend_, wd, sdk::Shape{padded_out_, in_});
    backend_->fill(padded_w_.view(), 0.0f);
    // 0 on the real classes; the lowest finite value of the logits' dtype on the padded ones:
    // exp(lowest - max) is 0 in any float format, and it stays finite for the checks.
    const DType logits = storage_of(precision_.activation);
    const float lowest = logits == DType::bf16   ? -sdk::decode_bf16(sdk::kBf16MaxBits)
                         : logits == DType::fp16 ? -sdk::decode_fp16(sdk::kFp16MaxBits)
                                                 : std::numeric_limits<float>::lowest();
    padded_bias_ = Tensor(backend_, DType::fp32, sdk::Shape{padded_out_});
    backend_->fill(padded_bias_.view(), 0.0f);
    backend_->fill({static_cast<float*>(padded_bias_.view().data) + out_, DType::fp32,
                    sdk::Shape{padded_out_ - out_}},
                   lowest);
  }
  // The weight's first `out` rows are the padded copy's first out·in elements.
  const TensorView prefix{padded_w_.view().data, wd, sdk::Shape{out_, in_}};
  if (decode_once)
    backend_->cast(w, prefix);
  else
    backend_->copy(prefix, w);
  wgrad_padded_ = false;
}

void LinearLayer::end_loss_blocks() {
  block_weight_ = {};
  decoded_w_ = Tensor{};
  if (padded_out_ == 0 || !wgrad_padded_) return;
  wgrad_padded_ = false;
  // dW is the padded sum's first `out` rows (the rest is zero: the padded classes' gradient).
  const TensorView sum{padded_dw_.view().data, DType::fp32, sdk::Shape{out_, in_}};
  const TensorView grad = weight().grad.view();
  if (weight().take_grad_beta() == 0.0f)
    backend_->copy(grad, sum);
  else
    facets().call(sdk::ActivationOp::axpy)->axpy(1.0f, sum, grad);
}

void LinearLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  input_gradient_done_ = false;
  if (blocks_.active()) return backward_block_scaled(dy, dx);
  // A padded loss block (no scaler, no bias: set_loss_block_padding) reads the padded W, and its
  // dW is summed over the pass's blocks in the padded scratch, whose prefix end_loss_blocks() adds.
  const bool padded = padded_block(dy);
  const DType in_storage = storage_of(precision_.gemm_input);
  // The GEMMs' operands: dy_g (op = dy) and w_g (op = W) for dgrad, dyt_g (op = dyᵀ) and x_g
  // (op = x) for wgrad.
  sdk::GemmOperand dy_g, dyt_g, x_g, w_g;
  const bool bias_grad = bias_ && !bias().frozen && !bias_grad_in_reader();
  // FP8: dy's cast may sum the bias gradient, and compute the gradient of the gelu this linear
  // runs as its epilogue, whose backward then left dy as it was (gemm facet 1.7).
  const bool gelu_in_cast = fused_ != nullptr && fused_->gradient_in_producer_;
  bool bias_in_cast = false;
  if (scaler_.active()) {
    GradientCast fold;
    const bool folding = folds_gradient_cast(dy.dtype);
    if (gelu_in_cast && !folding)
      throw std::logic_error("linear '" + name_ + "': its gelu left its gradient to this cast");
    if (folding && bias_grad) {
      fold.column_sums = bias().grad.view();
      fold.accumulate_column_sums = bias().take_grad_beta() != 0.0f;
      bias_in_cast = true;
    }
    if (gelu_in_cast) fold.gelu_input = output(rows);
    // x and W were cast (and scaled) by the forward of this step; dy is cast here, into the
    // staging (read by the two GEMMs below alone), with its transpose where the backend writes it.
    const ScaledLayouts dys = scaler_.scale_layouts(
        backend_, facets(), dy, sdk::OperandRole::grad_output, Keep::transient, Keep::transient,
        collect_stats_ ? &stats_ : nullptr, bias_in_cast || gelu_in_cast ? &fold : nullptr);
    dy_g = dys.operand(false, false);
    dyt_g = dys.operand(true, false);
    x_g = scaler_.kept(sdk::OperandRole::input, x.shape).operand(false, true);
    w_g = scaler_.kept(sdk::OperandRole::weight, sdk::Shape{out_, in_}).operand(false, true);
  } else {
    dy_g.view = as_dtype(dy, in_storage, dy_scratch_);
    dyt_g = dy_g;
    dyt_g.transpose = true;
    if (!weight().frozen) x_g.view = as_dtype(x, in_storage, x_scratch_);  // dW's operand only
    w_g.view = padded ? padded_w_.view() : weight_operand();
  }
  // wgrad sums the bias gradient as its epilogue when it reads dy as stored (the same terms).
  const bool bias_in_wgrad = bias_grad && !weight().frozen && gradient_gemm_ && fusion_on_ &&
                             !scaler_.active() && dy_g.view.data == dy.data &&
                             dy_g.view.dtype == dy.dtype;
  if (!weight().frozen) {
    // dW[out, in] (+)= dyᵀ[out, rows] · x[rows, in]
    sdk::GemmArgs gw;
    gw.a = dyt_g;
    gw.b = x_g;
    if (padded) {
      if (padded_dw_.empty())
        padded_dw_ = Tensor(backend_, DType::fp32, sdk::Shape{padded_out_, in_});
      gw.c = padded_dw_.view();
      gw.beta = wgrad_padded_ ? 1.0f : 0.0f;
      wgrad_padded_ = true;
    } else {
      gw.c = weight().grad.view();
      gw.beta = weight().take_grad_beta();
    }
    gw.alpha = static_cast<float>(scale_);
    gw.compute = precision_.gemm_input;
    if (bias_in_wgrad) {
      // dbias[out] (+)= Σ_rows dy[rows, out], the row sums of op(A) = dyᵀ
      sdk::GemmGradientArgs gg;
      gg.gemm = gw;
      gg.a_row_sums = bias().grad.view();
      gg.accumulate_a_row_sums = bias().take_grad_beta() != 0.0f;
      facets().call(sdk::GemmOp::gemm_gradient)->gemm_gradient(gg);
    } else {
      facets().call(sdk::GemmOp::gemm)->gemm(gw);
    }
  }
  if (bias_grad && !bias_in_wgrad && !bias_in_cast)
    facets()
        .call(sdk::ActivationOp::bias_grad)
        ->bias_grad(dy, bias().grad.view(), bias().take_grad_beta() != 0.0f);
  if (!dx.empty()) dgrad(dy_g, w_g, dx, rows);
}

void LinearLayer::dgrad(const sdk::GemmOperand& dy, const sdk::GemmOperand& w, TensorView dx,
                        std::int64_t rows) {
  // dx[rows, in] = dy[rows, out] · W[out, in]
  sdk::GemmArgs gx;
  gx.a = dy;
  gx.b = w;
  gx.c = dx;
  gx.alpha = static_cast<float>(scale_);
  gx.beta = accumulate_input_gradient(0) ? 1.0f : 0.0f;  // dx is then the FP32 sum (layer.h)
  gx.compute = precision_.gemm_input;
  if (!input_gradient_fusable()) {
    facets().call(sdk::GemmOp::gemm)->gemm(gx);
    return;
  }
  // The gelu before this linear: dz[rows, in] = dx · gelu'(z), z its producer's output, and the
  // producer's bias gradient Σ_rows dz, all in this GEMM's epilogue.
  LinearLayer& producer = *grad_input_->producer_;
  sdk::GemmGradientArgs gg;
  gg.gemm = gx;
  gg.has_activation_grad = true;
  gg.activation = sdk::Activation::gelu;
  gg.pre_activation = producer.output(rows);
  if (producer.bias_ && !producer.bias().frozen) {
    gg.c_column_sums = producer.bias().grad.view();
    gg.accumulate_c_column_sums = producer.bias().take_grad_beta() != 0.0f;
  }
  facets().call(sdk::GemmOp::gemm_gradient)->gemm_gradient(gg);
  input_gradient_done_ = true;
}

void LinearLayer::forward_block_scaled(TensorView x, std::int64_t rows) {
  using sdk::GemmPass;
  using sdk::OperandRole;
  sdk::GemmFacet& gemm = *facets().call(sdk::GemmOp::quantize_block_scaled);
  // x for forward and (its second quantization, along the batch) wgrad — a frozen weight has no
  // wgrad, so x is quantized once; W for forward and dgrad. An evaluation (eval, predict, sample)
  // has no backward: the forward's quantizations alone, and no Hadamard transform of x.
  blocks_.quantize(backend_, gemm, x, OperandRole::input, run_seed_, step_, draw(),
                   training() && !weight().frozen);
  blocks_.quantize(backend_, gemm, weight_operand(), OperandRole::weight, run_seed_, step_, draw(),
                   training());
  sdk::BlockScaledGemmArgs g;
  g.a = blocks_.operand(OperandRole::input, GemmPass::forward, false);
  g.b = blocks_.operand(OperandRole::weight, GemmPass::forward, true);
  if (fused()) {
    g.c = fused_->output(rows);
    g.has_activation = true;
    g.activation = fused_->activation();
    if (g.activation != sdk::Activation::relu) {
      materialise_output();
      g.pre_activation = output(rows);
    }
  } else {
    materialise_output();
    g.c = output(rows);
  }
  if (bias_) g.bias = bias().value();
  g.alpha = static_cast<float>(scale_);
  facets().call(sdk::GemmOp::gemm_block_scaled)->gemm_block_scaled(g);
}

void LinearLayer::backward_block_scaled(TensorView dy, TensorView dx) {
  using sdk::GemmPass;
  using sdk::OperandRole;
  // A frozen weight has no wgrad: dy is quantized for dgrad only.
  blocks_.quantize(backend_, *facets().call(sdk::GemmOp::quantize_block_scaled), dy,
                   OperandRole::grad_output, run_seed_, step_, draw(), !weight().frozen);
  if (!weight().frozen) {
    // dW[out, in] (+)= dyᵀ[out, rows] · x[rows, in], both blocked along the batch.
    sdk::BlockScaledGemmArgs gw;
    gw.a = blocks_.operand(OperandRole::grad_output, GemmPass::wgrad, true);
    gw.b = blocks_.operand(OperandRole::input, GemmPass::wgrad, false);
    gw.c = weight().grad.view();
    gw.alpha = static_cast<float>(scale_);
    gw.beta = weight().take_grad_beta();
    facets().call(sdk::GemmOp::gemm_block_scaled)->gemm_block_scaled(gw);
  }
  if (bias_ && !bias().frozen && !bias_grad_in_reader())
    facets()
        .call(sdk::ActivationOp::bias_grad)
        ->bias_grad(dy, bias().grad.view(), bias().take_grad_beta() != 0.0f);
  if (!dx.empty()) {
    // dx[rows, in] = dy[rows, out] · W[out, in], both blocked along out.
    sdk::BlockScaledGemmArgs gx;
    gx.a = blocks_.operand(OperandRole::grad_output, GemmPass::dgrad, false);
    gx.b = blocks_.operand(OperandRole::weight, GemmPass::dgrad, false);
    gx.c = dx;
    gx.alpha = static_cast<float>(scale_);
    facets().call(sdk::GemmOp::gemm_block_scaled)->gemm_block_scaled(gx);
  }
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition linear_op() {
  OpDefinition op;
  op.type = "linear";
  op.summary = "y = x Wᵀ + b on the last dimension";
  op.has_parameters = true;
  // Its FP8 or block-scaled copies of x are made again with the same scales, its amax recorded
  // again (a maximum: the same); a linear running its gelu as the GEMM's epilogue is kept.
  op.recomputable = true;
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
            .at_least(0.0),
        sdk::OptionSpec::number("scale", 1.0,
                                "y = scale · x Wᵀ + b (LoRA's alpha / r on its B adapter)")
            .greater_than(0.0),
        sdk::OptionSpec::boolean("zero_init", false,
                                 "start the weight and bias at 0 (LoRA's B adapter)")};
  };
  op.build = [](const OpNode& node) {
    const auto& in = node.inputs;
    const std::int64_t out = node.options.get_int("out");
    PerSampleShape shape = in[0];
    shape.back() = out;
    return BuiltOp{std::make_unique<LinearLayer>(
                       node.name, in[0].back(), out, node.options.get_bool("bias"),
                       node.options.get_string("tie_weight"), node.options.where("tie_weight"),
                       node.options.get_double("init_std"), node.options.get_double("scale"),
                       node.options.get_bool("zero_init")),
                   shape};
  };
  return op;
}

}  // namespace mixtrain::core
