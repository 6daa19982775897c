#include "graph/ops/attention.h"

#include <algorithm>
#include <cmath>

#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

namespace {
constexpr const char* kScores = "scores";
constexpr const char* kContext = "context";

// Batch 0's [rows, cols] view at `offset` elements into `base`, in `dtype`.
TensorView at(const Tensor& base, DType dtype, std::int64_t offset, std::int64_t rows,
              std::int64_t cols) {
  return {static_cast<std::byte*>(base.view().data) + offset * sdk::dtype_size(dtype), dtype,
          sdk::Shape{rows, cols}};
}

// C_i = op(A_i)·op(B_i) for i in [0, batch), batch i's operands `stride` elements apart.
void batched(const BoundFacets& facets, DType compute, TensorView a, bool ta, std::int64_t sa,
             TensorView b, bool tb, std::int64_t sb, TensorView c, std::int64_t sc,
             std::int64_t batch) {
  sdk::GemmBatchedArgs g;
  g.gemm.a.view = a;
  g.gemm.a.transpose = ta;
  g.gemm.b.view = b;
  g.gemm.b.transpose = tb;
  g.gemm.c = c;
  g.gemm.compute = compute;
  g.batch = batch;
  g.stride_a = sa;
  g.stride_b = sb;
  g.stride_c = sc;
  facets.call(sdk::GemmOp::gemm_strided_batched)->gemm_strided_batched(g);
}

// Bytes for `count` elements in the widest dtype a buffer may be viewed as (fp32).
Tensor widest(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t count) {
  return Tensor(backend, DType::fp32, sdk::Shape{std::max<std::int64_t>(count, 1)});
}

// One line per reason per process (ops::log_once).
void log_unfused_once(const std::string& reason) {
  ops::log_once("attention", reason,
                "attention runs unfused (head permutes, batched GEMMs and a [T, T] softmax kept "
                "for the backward): " +
                    reason);
}
}  // namespace

AttentionLayer::AttentionLayer(std::string name, std::int64_t tokens, std::int64_t width,
                               std::int64_t heads, bool fused)
    : Layer(std::move(name), "attention", 3 * width, width),
      tokens_(tokens),
      heads_(heads),
      head_dim_(width / heads),
      scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(width / heads)))),
      fused_(fused) {
  // Both products multiply activations: q·kᵀ reads two inputs, P·v likewise; their gradients
  // read grad_output with an input. No weight operand.
  traits_.gemms = {{kScores, {sdk::OperandRole::input, sdk::OperandRole::grad_output}},
                   {kContext, {sdk::OperandRole::input, sdk::OperandRole::grad_output}}};
  // q·kᵀ and P·v: 2·T·C multiply-adds each per row (the causal half is still computed).
  traits_.forward_flops_per_row = 4 * tokens_ * out_;
  // The unfused backward keeps its own head-major copies; choose_kernels() says what a flash one
  // reads.
  traits_.backward_reads_inputs = false;
}

void AttentionLayer::choose_kernels(sdk::DeviceBackend& backend) {
  const std::string reason = unfused_reason(backend);
  flash_ = reason.empty();
  chosen_ = true;
  if (!flash_ && fused_) log_unfused_once(reason);
  // The flash backward recomputes the scores from qkv and reads the output.
  traits_.backward_reads_inputs = flash_;
  traits_.backward_reads_output = flash_;
  // Decoding in one op (attention 1.3's flash_decode) where the node is fused and the backend
  // offers it for the cache's and the output's dtypes; whatever training's path.
  const sdk::AttentionFacet* f = sdk::facet<sdk::AttentionFacet>(backend, 0);
  const DType decode_dtypes[] = {gemm_dtype(), storage_of(precision_.activation)};
  flash_decode_ = fused_ && f != nullptr && f->version() >= sdk::FacetVersion{1, 3} &&
                  f->supports(sdk::AttentionOp::flash_decode, decode_dtypes);
}

DType AttentionLayer::gemm_dtype() const {
  return storage_of(precision_.gemm_input);
}

std::vector<BackendNeed> AttentionLayer::backend_needs(DType input) const {
  const DType g = gemm_dtype();
  const DType act = storage_of(precision_.activation);
  const DType grad = storage_of(precision_.activation_grad);
  const DType gc = precision_.gemm_input;  // tf32 asks for its own support
  return {{sdk::AttentionOp::split_heads, {input, g}},
          {sdk::AttentionOp::split_heads, {grad, g}},
          {sdk::AttentionOp::merge_heads, {act, act}},
          {sdk::AttentionOp::merge_heads, {grad, grad}},
          {sdk::AttentionOp::softmax_forward, {DType::fp32}},
          {sdk::AttentionOp::softmax_backward, {DType::fp32}},
          {sdk::GemmOp::gemm_strided_batched, {gc, gc, DType::fp32}},
          {sdk::GemmOp::gemm_strided_batched, {gc, gc, act}},
          {sdk::GemmOp::gemm_strided_batched, {gc, gc, grad}}};
}

std::string AttentionLayer::unfused_reason(sdk::DeviceBackend& backend) const {
  if (!fused_) return "the node asks for it (fused = false)";
  const sdk::AttentionFacet* f = sdk::facet<sdk::AttentionFacet>(backend, 0);
  if (f == nullptr) return "the backend has no attention facet";
  if (f->version() < sdk::FacetVersion{1, 1})
    return "the backend's attention facet is " + sdk::to_string(f->version()) +
           "; flash attention needs 1.1";
  const DType g = gemm_dtype();
  const DType act = storage_of(precision_.activation);
  const DType grad = storage_of(precision_.activation_grad);
  const DType fwd[] = {g}, bwd[] = {g, grad};
  if (!f->supports(sdk::AttentionOp::flash_forward, fwd) ||
      !f->supports(sdk::AttentionOp::flash_backward, bwd))
    return "the backend does not offer flash attention on " + std::string(sdk::dtype_name(g)) +
           " (gradients " + std::string(sdk::dtype_name(grad)) + ")";
  if (act != g)
    return "its activations are stored in " + std::string(sdk::dtype_name(act)) +
           " but its GEMMs read " + std::string(sdk::dtype_name(g)) +
           " (flash attention reads and writes one dtype)";
  // 1.2: a shape the backend's fused kernel has no variant for (batch 0: any batch).
  if (f->version() >= sdk::FacetVersion{1, 2}) {
    const std::string refusal = f->flash_refusal({0, tokens_, heads_, head_dim_, 3, 0, 0}, g);
    if (!refusal.empty())
      return "the backend's flash attention cannot take " + std::to_string(tokens_) +
             " tokens of " + std::to_string(heads_) + " heads of " + std::to_string(head_dim_) +
             " in " + std::string(sdk::dtype_name(g)) + ": " + refusal;
  }
  return {};
}

void AttentionLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                              std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  const std::int64_t n = max_rows / tokens_;  // sequences
  const std::int64_t bh = n * heads_;
  if (!chosen_) choose_kernels(*backend);  // an op allocated outside an executor
  chosen_ = false;
  for (Tensor* t : {&qkv_heads_, &probs_, &probs_gemm_, &context_, &dprobs_, &dqkv_heads_, &lse_})
    *t = Tensor();
  if (flash_) {
    lse_ = Tensor(backend, DType::fp32, sdk::Shape{std::max<std::int64_t>(bh * tokens_, 1)});
    return;
  }
  qkv_heads_ = widest(backend, 3 * max_rows * out_);
  probs_ = Tensor(backend, DType::fp32, sdk::Shape{bh * tokens_ * tokens_});
  probs_gemm_ = widest(backend, bh * tokens_ * tokens_);
  context_ = widest(backend, max_rows * out_);
  dprobs_ = Tensor(backend, DType::fp32, sdk::Shape{bh * tokens_ * tokens_});
  dqkv_heads_ = widest(backend, 3 * max_rows * out_);
}

void AttentionLayer::flash_forward(TensorView x, std::int64_t rows) {
  const std::int64_t n = rows / tokens_;
  const TensorView qkv = as_dtype(x, gemm_dtype(), x_cast_);
  const TensorView lse{lse_.view().data, DType::fp32, sdk::Shape{n * heads_ * tokens_}};
  facets()
      .call(sdk::AttentionOp::flash_forward)
      ->flash_forward(qkv, {n, tokens_, heads_, head_dim_, 3, 0, 0}, scale_, output(rows), lse);
}

void AttentionLayer::flash_backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  if (dx.data == nullptr) return;  // no parameters: nothing else to compute
  const std::int64_t n = rows / tokens_;
  // The cast of forward, made again: scratch the forward made may have been another pass's.
  const TensorView qkv = as_dtype(x, gemm_dtype(), x_cast_);
  const TensorView lse{lse_.view().data, DType::fp32, sdk::Shape{n * heads_ * tokens_}};
  // dy comes in the planned gradient dtype, which allocate() checked, except in passes that keep
  // every gradient in FP32 (the underflow measurement): cast it where the backend refuses that.
  // An FP32 dy into a 16-bit dx of qkv's dtype (an FP32 gradient sum: the output read by two
  // nodes, as LoRA's adapter and its base read it) is rounded into that dtype first, once, as the
  // gradient it becomes anyway: the kernel then runs its 16-bit products and writes dx itself, as
  // a backend that takes one dtype (cuDNN's) does after the cast below. An FP32 dx (the underflow
  // measurement's all-FP32 pass) keeps dy as it is.
  TensorView dout = dy;
  const auto* attention = facets().find<sdk::AttentionFacet>();
  const DType bwd[] = {qkv.dtype, dy.dtype}, narrowed[] = {qkv.dtype, dx.dtype};
  if (!attention->supports(sdk::AttentionOp::flash_backward, bwd))
    dout = as_dtype(dy, storage_of(precision_.activation_grad), dy_cast_);
  else if (dy.dtype == DType::fp32 && dx.dtype == qkv.dtype && sdk::dtype_size(dx.dtype) == 2 &&
           attention->supports(sdk::AttentionOp::flash_backward, narrowed))
    dout = as_dtype(dy, dx.dtype, dy_cast_);
  const bool direct = dx.dtype == dout.dtype;
  const TensorView dqkv = direct ? dx : scratch_tensor(dx_scratch_, dout.dtype, dx.shape);
  facets()
      .call(sdk::AttentionOp::flash_backward)
      ->flash_backward(qkv, output(rows), dout, lse, {n, tokens_, heads_, head_dim_, 3, 0, 0},
                       scale_, dqkv);
  if (!direct) backend_->cast(dqkv, dx);
}

void AttentionLayer::forward(TensorView x, std::int64_t rows) {
  if (flash_) return flash_forward(x, rows);
  // x is qkv [N, T, 3C]; q, k, v are [N·H, T, D] head-major; S and P are [N·H, T, T].
  const std::int64_t n = rows / tokens_, bh = n * heads_, t = tokens_, d = head_dim_;
  const DType g = gemm_dtype();
  const DType act = storage_of(precision_.activation);
  const std::int64_t part = bh * t * d;
  const sdk::HeadLayout qkv{n, t, heads_, d, 3, 0, 0};
  facets().call(sdk::AttentionOp::split_heads)->split_heads(x, qkv, {qkv_heads_.view().data, g, sdk::Shape{3 * part}});
  const TensorView q = at(qkv_heads_, g, 0, t, d), k = at(qkv_heads_, g, part, t, d),
                   v = at(qkv_heads_, g, 2 * part, t, d);
  // S = q·kᵀ in FP32, then P = softmax(S/√D) in place, FP32.
  const TensorView s = at(probs_, DType::fp32, 0, t, t);
  batched(facets(), precision_.gemm_input, q, false, t * d, k, true, t * d, s, t * t, bh);
  const TensorView all_s{probs_.view().data, DType::fp32, sdk::Shape{bh * t * t}};
  facets().call(sdk::AttentionOp::softmax_forward)->softmax_forward(all_s, {bh, t, t, true}, scale_, all_s);
  // O = P·v, with P rounded to the GEMM dtype only as this product's operand.
  TensorView p = s;
  if (g != DType::fp32) {
    const TensorView pg{probs_gemm_.view().data, g, sdk::Shape{bh * t * t}};
    backend_->cast(all_s, pg);
    p = at(probs_gemm_, g, 0, t, t);
    probs_gemm_holds_p_ = true;
  }
  const TensorView o = at(context_, act, 0, t, d);
  batched(facets(), precision_.gemm_input, p, false, t * t, v, false, t * d, o, t * d, bh);
  const sdk::HeadLayout ctx{n, t, heads_, d, 1, 0, 0};
  facets().call(sdk::AttentionOp::merge_heads)->merge_heads({context_.view().data, act, sdk::Shape{part}}, ctx, output(rows));
}

void AttentionLayer::backward(TensorView x, TensorView dy, TensorView dx, std::int64_t rows) {
  if (flash_) return flash_backward(x, dy, dx, rows);
  // dy is [N, T, C]; dO, dq, dk, dv are [N·H, T, D]; dP, dS are [N·H, T, T] in FP32.
  const std::int64_t n = rows / tokens_, bh = n * heads_, t = tokens_, d = head_dim_;
  const DType g = gemm_dtype();
  const DType dxt = dx.dtype;
  const std::int64_t part = bh * t * d;
  const DType gc = precision_.gemm_input;
  const TensorView q = at(qkv_heads_, g, 0, t, d), k = at(qkv_heads_, g, part, t, d),
                   v = at(qkv_heads_, g, 2 * part, t, d);
  const sdk::HeadLayout ctx{n, t, heads_, d, 1, 0, 0};
  facets().call(sdk::AttentionOp::split_heads)->split_heads(dy, ctx, {context_.view().data, g, sdk::Shape{part}});
  const TensorView d_o = at(context_, g, 0, t, d);
  // dP = dO·vᵀ (FP32); dv = Pᵀ·dO.
  const TensorView dp = at(dprobs_, DType::fp32, 0, t, t);
  batched(facets(), gc, d_o, false, t * d, v, true, t * d, dp, t * t, bh);
  const TensorView all_p{probs_.view().data, DType::fp32, sdk::Shape{bh * t * t}};
  if (g != DType::fp32 && !probs_gemm_holds_p_) {
    backend_->cast(all_p, {probs_gemm_.view().data, g, sdk::Shape{bh * t * t}});
    probs_gemm_holds_p_ = true;
  }
  const TensorView p =
      g == DType::fp32 ? at(probs_, DType::fp32, 0, t, t) : at(probs_gemm_, g, 0, t, t);
  const TensorView dq = at(dqkv_heads_, dxt, 0, t, d), dk = at(dqkv_heads_, dxt, part, t, d),
                   dv = at(dqkv_heads_, dxt, 2 * part, t, d);
  batched(facets(), gc, p, true, t * t, d_o, false, t * d, dv, t * d, bh);
  // dS = P ∘ (dP − rowsum(dP ∘ P)) / √D, FP32, in place.
  const TensorView all_dp{dprobs_.view().data, DType::fp32, sdk::Shape{bh * t * t}};
  facets().call(sdk::AttentionOp::softmax_backward)->softmax_backward(all_p, all_dp, {bh, t, t, true}, scale_, all_dp);
  TensorView ds = dp;
  if (g != DType::fp32) {
    backend_->cast(all_dp, {probs_gemm_.view().data, g, sdk::Shape{bh * t * t}});
    ds = at(probs_gemm_, g, 0, t, t);
    probs_gemm_holds_p_ = false;
  }
  // dq = dS·k, dk = dSᵀ·q.
  batched(facets(), gc, ds, false, t * t, k, false, t * d, dq, t * d, bh);
  batched(facets(), gc, ds, true, t * t, q, false, t * d, dk, t * d, bh);
  const sdk::HeadLayout qkv{n, t, heads_, d, 3, 0, 0};
  facets().call(sdk::AttentionOp::merge_heads)->merge_heads({dqkv_heads_.view().data, dxt, sdk::Shape{3 * part}}, qkv, dx);
}

namespace {
// One sequence's KV cache: [3, 1, H, capacity, D] in the GEMM dtype (q, k, v: split_heads writes
// all three parts; q's rows hold only the newest tokens). Under the flash path the layer keeps no
// [T, T] buffers, so where the backend has no flash_decode the cache holds a step's scores, their
// GEMM-dtype copy and the head-major context itself, sized for a step of `capacity` new tokens.
struct KvCache final : DecodeState {
  Tensor qkv;
  Tensor probs, probs_gemm, context;  // flash path only; else the layer's own
  std::int64_t capacity = 0;
};
}  // namespace

std::unique_ptr<DecodeState> AttentionLayer::make_decode_state(std::int64_t capacity) const {
  // Unfused, a step's scores, at most capacity new queries against capacity positions, fit the
  // training pass's probs_ and probs_gemm_ ([N·H, T, T], N >= 1, capacity <= T): the cache is all
  // it adds.
  if (capacity > tokens_)
    throw sdk::UserError("a KV cache of " + std::to_string(capacity) +
                             " positions is longer than the " + std::to_string(tokens_) +
                             " tokens node '" + name_ + "' attends over",
                         "decode at most " + std::to_string(tokens_) + " positions at once");
  auto cache = std::make_unique<KvCache>();
  cache->qkv = widest(backend_, 3 * heads_ * capacity * head_dim_);
  cache->capacity = capacity;
  if (flash_ && !flash_decode_) {
    const std::int64_t scores = heads_ * capacity * capacity;
    cache->probs = Tensor(backend_, DType::fp32, sdk::Shape{std::max<std::int64_t>(scores, 1)});
    if (gemm_dtype() != DType::fp32)
      cache->probs_gemm =
          Tensor(backend_, gemm_dtype(), sdk::Shape{std::max<std::int64_t>(scores, 1)});
    cache->context = widest(backend_, capacity * out_);
  }
  return cache;
}

void AttentionLayer::decode_forward(std::span<const TensorView> xs, std::int64_t start,
                                    std::int64_t rows, DecodeState* state) {
  // x is qkv [1, n, 3C] for positions [L, L + n); the cache holds q, k, v [3, 1, H, cap, D].
  const TensorView x = xs[0];
  const KvCache& kv = static_cast<KvCache&>(*state);
  const Tensor& cache = kv.qkv;
  const std::int64_t cap = kv.capacity;
  const Tensor& probs = flash_ ? kv.probs : probs_;
  const Tensor& probs_gemm = flash_ ? kv.probs_gemm : probs_gemm_;
  const Tensor& context = flash_ ? kv.context : context_;
  if (!flash_) probs_gemm_holds_p_ = false;  // a decode step's scores, not a training P
  const std::int64_t nt = rows, len = start + rows, d = head_dim_;
  if (len > cap)
    throw std::logic_error("attention node '" + name_ + "': the KV cache holds " +
                           std::to_string(cap) + " positions; this step needs " +
                           std::to_string(len));
  const DType g = gemm_dtype();
  const DType act = storage_of(precision_.activation);
  const std::int64_t part = heads_ * cap * d;
  const sdk::HeadLayout layout{1, nt, heads_, d, 3, cap, start};
  const TensorView all{cache.view().data, g, sdk::Shape{3 * part}};
  facets().call(sdk::AttentionOp::split_heads)->split_heads(x, layout, all);
  if (flash_decode_) {  // no scores, no permute back: the output where the projection reads it
    facets().call(sdk::AttentionOp::flash_decode)->flash_decode(all, layout, scale_, output(rows));
    return;
  }
  const TensorView q = at(cache, g, start * d, nt, d), k = at(cache, g, part, len, d),
                   v = at(cache, g, 2 * part, len, d);
  const TensorView s = at(probs, DType::fp32, 0, nt, len);
  batched(facets(), precision_.gemm_input, q, false, cap * d, k, true, cap * d, s, nt * len,
          heads_);
  const TensorView all_s{probs.view().data, DType::fp32, sdk::Shape{heads_ * nt * len}};
  facets().call(sdk::AttentionOp::softmax_forward)->softmax_forward(all_s, {heads_, nt, len, true}, scale_, all_s);
  TensorView p = s;
  if (g != DType::fp32) {
    backend_->cast(all_s, {probs_gemm.view().data, g, sdk::Shape{heads_ * nt * len}});
    p = at(probs_gemm, g, 0, nt, len);
  }
  const TensorView o = at(context, act, 0, nt, d);
  batched(facets(), precision_.gemm_input, p, false, nt * len, v, false, cap * d, o, nt * d,
          heads_);
  facets()
      .call(sdk::AttentionOp::merge_heads)
      ->merge_heads({context.view().data, act, sdk::Shape{heads_ * nt * d}},
                    {1, nt, heads_, d, 1, 0, 0}, output(rows));
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition attention_op() {
  OpDefinition op;
  op.type = "attention";
  op.summary = "causal multi-head self-attention of a fused qkv [T, 3C] (FP32 softmax)";
  // Flash: the row log-sum-exp written again with the same values; unfused: P.
  op.recomputable = true;
  op.schema = [] {
    return sdk::OptionSchema{
        sdk::OptionSpec::required("heads", sdk::OptionType::integer, "attention heads")
            .at_least(1)
            .at_most(static_cast<double>(ops::kMaxDim)),
        sdk::OptionSpec::boolean("fused", true,
                                 "flash attention (the backend's fused kernel, no [T, T] tensor "
                                 "kept) where the backend offers it; false: the unfused "
                                 "permutes, batched GEMMs and softmax")};
  };
  op.build = [](const OpNode& node) {
    const auto& in = node.inputs[0];
    const std::int64_t heads = node.options.get_int("heads");
    const bool fused = node.options.get_bool("fused");
    if (in.size() != 2)
      throw OpSpecError("", "takes qkv [T, 3C] per sample, but its input is " + ops::shape_text(in),
                        "feed it a linear with out = 3 * width on a [T, C] sequence");
    if (in[1] % 3 != 0)
      throw OpSpecError("",
                        "takes qkv [T, 3C], but the input's last dimension " +
                            std::to_string(in[1]) + " is not a multiple of 3",
                        "give the qkv linear out = 3 * width");
    const std::int64_t width = in[1] / 3;
    if (width % heads != 0)
      throw OpSpecError("heads",
                        "width " + std::to_string(width) +
                            " is not divisible by heads = " + std::to_string(heads),
                        "choose heads so that it divides the width (n_embd % n_head == 0)");
    return BuiltOp{std::make_unique<AttentionLayer>(node.name, in[0], width, heads, fused),
                   PerSampleShape{in[0], width}};
  };
  return op;
}

}  // namespace mixtrain::core
