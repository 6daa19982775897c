#include "mixtrain/core/profiling/profiling_backend.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string_view>
#include <utility>

#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/backend_elementwise.h"
#include "mixtrain/sdk/backend_embedding.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/backend_loss.h"
#include "mixtrain/sdk/backend_normalization.h"
#include "mixtrain/sdk/backend_optimizer_updates.h"
#include "profiling/profile_scope.h"

namespace mixtrain::core {

thread_local const char* ProfileScope::current_ = nullptr;

namespace {

using sdk::DType;
using sdk::TensorView;
using Clock = std::chrono::steady_clock;
using Views = std::span<const TensorView>;

class ProfilingBackendImpl final : public ProfilingBackend,
                                   public sdk::GemmFacet,
                                   public sdk::ElementwiseFacet,
                                   public sdk::NormalizationFacet,
                                   public sdk::LossFacet,
                                   public sdk::OptimizerFacet,
                                   public sdk::AttentionFacet,
                                   public sdk::EmbeddingFacet,
                                   public sdk::ConvolutionFacet {
 public:
  explicit ProfilingBackendImpl(std::shared_ptr<sdk::DeviceBackend> inner)
      : in_(std::move(inner)),
        gemm_(in_->gemm_facet()),
        el_(in_->elementwise_facet()),
        norm_(in_->normalization_facet()),
        loss_(in_->loss_facet()),
        opt_(in_->optimizer_facet()),
        attn_(in_->attention_facet()),
        emb_(in_->embedding_facet()),
        conv_(in_->convolution_facet()),
        since_(Clock::now()) {}

  // --- the profiler ---
  std::vector<ProfileEntry> entries() const override {
    std::vector<ProfileEntry> out;
    out.reserve(table_.size());
    for (const auto& [key, e] : table_) out.push_back(e);
    std::sort(out.begin(), out.end(),
              [](const ProfileEntry& a, const ProfileEntry& b) { return a.seconds > b.seconds; });
    return out;
  }
  double recorded_seconds() const override {
    return recorded_ + (recording_ ? seconds_since(since_) : 0.0);
  }
  void set_recording(bool on) override {
    if (on == recording_) return;
    if (recording_) recorded_ += seconds_since(since_);
    since_ = Clock::now();
    recording_ = on;
  }
  void reset() override {
    table_.clear();
    recorded_ = 0.0;
    since_ = Clock::now();
  }

  // --- DeviceBackend ---
  sdk::BackendCapabilities capabilities() const override { return in_->capabilities(); }
  void* allocate(std::size_t bytes) override { return in_->allocate(bytes); }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(TensorView d, const void* s) override {
    timed("copy_from_host", [&] { in_->copy_from_host(d, s); });
  }
  void copy_to_host(void* d, TensorView s) override {
    timed("copy_to_host", [&] { in_->copy_to_host(d, s); });
  }
  void copy(TensorView d, TensorView s) override {
    timed("copy", [&] { in_->copy(d, s); });
  }
  void synchronize() override { in_->synchronize(); }
  void cast(TensorView s, TensorView d, const sdk::CastArgs& a) override {
    timed("cast", [&] { in_->cast(s, d, a); });
  }
  void fill(TensorView x, float v) override {
    timed("fill", [&] { in_->fill(x, v); });
  }
  sdk::GemmFacet* gemm_facet() override { return gemm_ ? this : nullptr; }
  sdk::ElementwiseFacet* elementwise_facet() override { return el_ ? this : nullptr; }
  sdk::NormalizationFacet* normalization_facet() override { return norm_ ? this : nullptr; }
  sdk::LossFacet* loss_facet() override { return loss_ ? this : nullptr; }
  sdk::OptimizerFacet* optimizer_facet() override { return opt_ ? this : nullptr; }
  sdk::AttentionFacet* attention_facet() override { return attn_ ? this : nullptr; }
  sdk::EmbeddingFacet* embedding_facet() override { return emb_ ? this : nullptr; }
  sdk::ConvolutionFacet* convolution_facet() override { return conv_ ? this : nullptr; }

  // --- GemmFacet ---
  bool supports(sdk::GemmOp op, std::span<const DType> d) const override {
    return gemm_->supports(op, d);
  }
  void gemm(const sdk::GemmArgs& a) override {
    timed("gemm", [&] { gemm_->gemm(a); });
  }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& a) override {
    timed("gemm_strided_batched", [&] { gemm_->gemm_strided_batched(a); });
  }

  // --- ElementwiseFacet ---
  bool supports(sdk::ElementwiseOp op, std::span<const DType> d) const override {
    return el_->supports(op, d);
  }
  void bias_grad(TensorView dy, TensorView db, bool acc) override {
    timed("bias_grad", [&] { el_->bias_grad(dy, db, acc); });
  }
  void activation_forward(sdk::Activation act, TensorView x, TensorView y) override {
    timed("activation_forward", [&] { el_->activation_forward(act, x, y); });
  }
  void activation_backward(sdk::Activation act, TensorView x, TensorView dy,
                           TensorView dx) override {
    timed("activation_backward", [&] { el_->activation_backward(act, x, dy, dx); });
  }
  void axpy(float alpha, TensorView x, TensorView y) override {
    timed("axpy", [&] { el_->axpy(alpha, x, y); });
  }
  void add(Views xs, bool relu, TensorView y) override {
    timed("add", [&] { el_->add(xs, relu, y); });
  }
  bool unscale_and_check_finite(Views g, float inv) override {
    bool r = false;
    timed("unscale_and_check_finite", [&] { r = el_->unscale_and_check_finite(g, inv); });
    return r;
  }
  GradientCheck unscale_check_and_sum_squares(Views g, float inv) override {
    GradientCheck r;
    timed("unscale_check_and_sum_squares", [&] { r = el_->unscale_check_and_sum_squares(g, inv); });
    return r;
  }
  int first_nonfinite(Views t) override {
    int r = -1;
    timed("first_nonfinite", [&] { r = el_->first_nonfinite(t); });
    return r;
  }
  void foreach_mul_scalar(Views s, float v) override {
    timed("foreach_mul_scalar", [&] { el_->foreach_mul_scalar(s, v); });
  }
  void foreach_mul(Views s, Views o) override {
    timed("foreach_mul", [&] { el_->foreach_mul(s, o); });
  }
  void foreach_add_scalar(Views s, float v) override {
    timed("foreach_add_scalar", [&] { el_->foreach_add_scalar(s, v); });
  }
  void foreach_add(Views s, Views o, float alpha) override {
    timed("foreach_add", [&] { el_->foreach_add(s, o, alpha); });
  }
  void foreach_addcmul(Views s, Views t1, Views t2, float v) override {
    timed("foreach_addcmul", [&] { el_->foreach_addcmul(s, t1, t2, v); });
  }
  void foreach_sqrt(Views s) override {
    timed("foreach_sqrt", [&] { el_->foreach_sqrt(s); });
  }
  void foreach_sign(Views s) override {
    timed("foreach_sign", [&] { el_->foreach_sign(s); });
  }
  void foreach_lerp(Views s, Views e, float w) override {
    timed("foreach_lerp", [&] { el_->foreach_lerp(s, e, w); });
  }
  void foreach_clamp(Views s, float lo, float hi) override {
    timed("foreach_clamp", [&] { el_->foreach_clamp(s, lo, hi); });
  }

  // --- NormalizationFacet ---
  bool supports(sdk::NormalizationOp op, std::span<const DType> d) const override {
    return norm_->supports(op, d);
  }
  void layernorm_forward(TensorView x, TensorView g, TensorView b, float eps, TensorView y,
                         TensorView mean, TensorView rstd) override {
    timed("layernorm_forward", [&] { norm_->layernorm_forward(x, g, b, eps, y, mean, rstd); });
  }
  void layernorm_backward(TensorView dy, TensorView x, TensorView g, TensorView mean,
                          TensorView rstd, TensorView dx, TensorView dg, TensorView db,
                          bool acc) override {
    timed("layernorm_backward",
          [&] { norm_->layernorm_backward(dy, x, g, mean, rstd, dx, dg, db, acc); });
  }
  std::size_t batchnorm_workspace_bytes(const sdk::BatchNormShape& sh, DType x) const override {
    return norm_->batchnorm_workspace_bytes(sh, x);
  }
  void batchnorm_forward_training(TensorView x, TensorView g, TensorView b,
                                  const sdk::BatchNormShape& sh, float momentum, TensorView y,
                                  TensorView mean, TensorView var, TensorView rmean,
                                  TensorView rvar, TensorView ws) override {
    timed("batchnorm_forward_training", [&] {
      norm_->batchnorm_forward_training(x, g, b, sh, momentum, y, mean, var, rmean, rvar, ws);
    });
  }
  void batchnorm_forward_inference(TensorView x, TensorView g, TensorView b, TensorView rmean,
                                   TensorView rvar, const sdk::BatchNormShape& sh,
                                   TensorView y) override {
    timed("batchnorm_forward_inference",
          [&] { norm_->batchnorm_forward_inference(x, g, b, rmean, rvar, sh, y); });
  }
  void batchnorm_backward(TensorView dy, TensorView x, TensorView y, TensorView g, TensorView mean,
                          TensorView var, const sdk::BatchNormShape& sh, TensorView ws,
                          TensorView dx, TensorView dg, TensorView db, bool acc) override {
    timed("batchnorm_backward",
          [&] { norm_->batchnorm_backward(dy, x, y, g, mean, var, sh, ws, dx, dg, db, acc); });
  }

  // --- LossFacet ---
  bool supports(sdk::LossOp op, std::span<const DType> d) const override {
    return loss_->supports(op, d);
  }
  void softmax_cross_entropy(TensorView logits, TensorView labels, float gs, TensorView loss,
                             TensorView correct, TensorView dlogits) override {
    timed("softmax_cross_entropy",
          [&] { loss_->softmax_cross_entropy(logits, labels, gs, loss, correct, dlogits); });
  }

  // --- OptimizerFacet ---
  bool supports(sdk::OptimizerOp op, std::span<const DType> d) const override {
    return opt_->supports(op, d);
  }
  void sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> p) override {
    timed("sgd_update", [&] { opt_->sgd_update(h, p); });
  }
  void adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> p) override {
    timed("adamw_update", [&] { opt_->adamw_update(h, p); });
  }

  // --- AttentionFacet ---
  bool supports(sdk::AttentionOp op, std::span<const DType> d) const override {
    return attn_->supports(op, d);
  }
  void split_heads(TensorView x, const sdk::HeadLayout& l, TensorView y) override {
    timed("split_heads", [&] { attn_->split_heads(x, l, y); });
  }
  void merge_heads(TensorView y, const sdk::HeadLayout& l, TensorView x) override {
    timed("merge_heads", [&] { attn_->merge_heads(y, l, x); });
  }
  void softmax_forward(TensorView s, const sdk::SoftmaxShape& sh, float scale,
                       TensorView p) override {
    timed("softmax_forward", [&] { attn_->softmax_forward(s, sh, scale, p); });
  }
  void softmax_backward(TensorView p, TensorView dp, const sdk::SoftmaxShape& sh, float scale,
                        TensorView ds) override {
    timed("softmax_backward", [&] { attn_->softmax_backward(p, dp, sh, scale, ds); });
  }

  // --- EmbeddingFacet ---
  bool supports(sdk::EmbeddingOp op, std::span<const DType> d) const override {
    return emb_->supports(op, d);
  }
  void gather(TensorView ids, TensorView table, TensorView out, bool acc) override {
    timed("gather", [&] { emb_->gather(ids, table, out, acc); });
  }
  void scatter_add(TensorView ids, TensorView dy, TensorView dtable, float beta) override {
    timed("scatter_add", [&] { emb_->scatter_add(ids, dy, dtable, beta); });
  }

  // --- ConvolutionFacet ---
  bool supports(sdk::ConvolutionOp op, std::span<const DType> d) const override {
    return conv_->supports(op, d);
  }
  void conv2d_forward(const sdk::Conv2dForwardArgs& a) override {
    timed("conv2d_forward", [&] { conv_->conv2d_forward(a); });
  }
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& a) override {
    timed("conv2d_backward_data", [&] { conv_->conv2d_backward_data(a); });
  }
  void conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& a) override {
    timed("conv2d_backward_weights", [&] { conv_->conv2d_backward_weights(a); });
  }
  std::size_t pool2d_workspace_bytes(const sdk::Pool2dGeometry& g, DType x) const override {
    return conv_->pool2d_workspace_bytes(g, x);
  }
  void pool2d_forward(const sdk::Pool2dGeometry& g, TensorView x, TensorView y,
                      TensorView ws) override {
    timed("pool2d_forward", [&] { conv_->pool2d_forward(g, x, y, ws); });
  }
  void pool2d_backward(const sdk::Pool2dGeometry& g, TensorView dy, TensorView x, TensorView y,
                       TensorView ws, TensorView dx) override {
    timed("pool2d_backward", [&] { conv_->pool2d_backward(g, dy, x, y, ws, dx); });
  }
  void to_channels_last(TensorView src, std::int64_t c, std::int64_t h, std::int64_t w,
                        TensorView dst) override {
    timed("to_channels_last", [&] { conv_->to_channels_last(src, c, h, w, dst); });
  }
  void to_channels_first(TensorView src, std::int64_t c, std::int64_t h, std::int64_t w,
                         TensorView dst) override {
    timed("to_channels_first", [&] { conv_->to_channels_first(src, c, h, w, dst); });
  }

 private:
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }

  template <class F>
  void timed(const char* op, F&& f) {
    if (!recording_) {
      f();
      return;
    }
    const auto t0 = Clock::now();
    f();
    in_->synchronize();
    const double s = seconds_since(t0);
    const char* scope = ProfileScope::current();
    auto [it, fresh] = table_.try_emplace(std::make_pair(std::string(scope), std::string(op)));
    if (fresh) {
      it->second.scope = scope;
      it->second.op = op;
    }
    it->second.calls += 1;
    it->second.seconds += s;
  }

  std::shared_ptr<sdk::DeviceBackend> in_;
  sdk::GemmFacet* gemm_;
  sdk::ElementwiseFacet* el_;
  sdk::NormalizationFacet* norm_;
  sdk::LossFacet* loss_;
  sdk::OptimizerFacet* opt_;
  sdk::AttentionFacet* attn_;
  sdk::EmbeddingFacet* emb_;
  sdk::ConvolutionFacet* conv_;
  std::map<std::pair<std::string, std::string>, ProfileEntry> table_;  // by (scope, op)
  bool recording_ = true;
  double recorded_ = 0.0;
  Clock::time_point since_;
};

}  // namespace

std::shared_ptr<ProfilingBackend> make_profiling_backend(
    std::shared_ptr<sdk::DeviceBackend> inner) {
  return std::make_shared<ProfilingBackendImpl>(std::move(inner));
}

std::string profile_group(const ProfileEntry& e) {
  const std::string_view s = e.scope, op = e.op;
  if (s == "classifier") return "classifier (LM head GEMMs + cross-entropy)";
  if (s == "optimizer") return "optimizer";
  if (s == "gradient checks") return "gradient checks (unscale, inf/NaN, norm)";
  if (s == "data") return "data (batch to device)";
  if (op == "gemm" || op == "gemm_strided_batched") return "GEMMs";
  if (s == "attention" && (op == "softmax_forward" || op == "softmax_backward"))
    return "attention softmax";
  if (s == "attention") return "attention head permutes";
  if (s == "layernorm") return "layer norm";
  if (op.starts_with("conv2d_")) return "convolutions";
  if (op.starts_with("batchnorm_")) return "batch norm";
  if (op.starts_with("pool2d_")) return "pooling";
  if (op == "to_channels_last" || op == "to_channels_first") return "layout permutes";
  if (op == "activation_forward" || op == "activation_backward") return "activations";
  if (s == "embedding" || s == "position_embedding") return "embeddings";
  if (op == "cast") return "casts";
  return "other ops";
}

std::string format_profile(const ProfilingBackend& p, std::int64_t steps) {
  const double total = p.recorded_seconds();
  const auto rows = p.entries();
  const double per_step = steps > 0 ? 1.0 / static_cast<double>(steps) : 0.0;
  std::map<std::string, double> groups;
  double in_ops = 0.0;
  for (const auto& e : rows) {
    groups[profile_group(e)] += e.seconds;
    in_ops += e.seconds;
  }
  std::vector<std::pair<std::string, double>> sorted(groups.begin(), groups.end());
  sorted.emplace_back("outside backend ops (host)", std::max(0.0, total - in_ops));
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  char line[256];
  auto pct = [&](double s) { return total > 0 ? 100.0 * s / total : 0.0; };
  std::snprintf(line, sizeof line, "profile: %lld steps, %.3f s (%.2f ms/step)\n",
                static_cast<long long>(steps), total, 1e3 * total * per_step);
  out += line;
  std::snprintf(line, sizeof line, "  %-44s %10s %7s\n", "group", "ms/step", "%");
  out += line;
  for (const auto& [name, s] : sorted) {
    std::snprintf(line, sizeof line, "  %-44s %10.3f %6.1f%%\n", name.c_str(), 1e3 * s * per_step,
                  pct(s));
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-20s %-30s %9s %10s %7s\n", "scope", "op", "calls/step",
                "ms/step", "%");
  out += line;
  for (const auto& e : rows) {
    std::snprintf(line, sizeof line, "  %-20s %-30s %9.1f %10.3f %6.1f%%\n", e.scope.c_str(),
                  e.op.c_str(), static_cast<double>(e.calls) * per_step, 1e3 * e.seconds * per_step,
                  pct(e.seconds));
    out += line;
  }
  return out;
}

}  // namespace mixtrain::core
