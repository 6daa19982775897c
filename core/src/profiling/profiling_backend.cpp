#include "mixtrain/core/profiling/profiling_backend.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string_view>
#include <tuple>
#include <utility>

#include "profiling/profile_scope.h"

namespace mixtrain::core {

thread_local const char* ProfileScope::current_ = nullptr;

namespace {

using sdk::DType;
using sdk::TensorView;
using Clock = std::chrono::steady_clock;
using Views = std::span<const TensorView>;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The table of (scope, op) times every profiled facet and the core ops add to.
class Recorder {
 public:
  explicit Recorder(sdk::DeviceBackend& inner) : in_(inner), since_(Clock::now()) {}

  template <class F>
  void timed(const char* op, F&& f) {
    if (!recording_) {
      f();
      return;
    }
    const auto t0 = Clock::now();
    f();
    in_.synchronize();
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

  std::vector<ProfileEntry> entries() const {
    std::vector<ProfileEntry> out;
    out.reserve(table_.size());
    for (const auto& [key, e] : table_) out.push_back(e);
    std::sort(out.begin(), out.end(),
              [](const ProfileEntry& a, const ProfileEntry& b) { return a.seconds > b.seconds; });
    return out;
  }
  double recorded_seconds() const { return recorded_ + (recording_ ? seconds_since(since_) : 0.0); }
  void set_recording(bool on) {
    if (on == recording_) return;
    if (recording_) recorded_ += seconds_since(since_);
    since_ = Clock::now();
    recording_ = on;
  }
  void reset() {
    table_.clear();
    recorded_ = 0.0;
    since_ = Clock::now();
  }

 private:
  sdk::DeviceBackend& in_;
  std::map<std::pair<std::string, std::string>, ProfileEntry> table_;  // by (scope, op)
  bool recording_ = true;
  double recorded_ = 0.0;
  Clock::time_point since_;
};

// A facet F of the inner backend, each op timed; supports() is the inner facet's answer.
template <class F>
class Profiled : public F {
 public:
  using Inner = F;
  Profiled(Recorder& recorder, F& inner) : rec_(recorder), in_(inner) {}
  ~Profiled() override = default;

 protected:
  Recorder& rec_;
  F& in_;
};

class ProfiledGemm final : public Profiled<sdk::GemmFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::GemmOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void gemm(const sdk::GemmArgs& a) override {
    rec_.timed("gemm", [&] { in_.gemm(a); });
  }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& a) override {
    rec_.timed("gemm_strided_batched", [&] { in_.gemm_strided_batched(a); });
  }
};

class ProfiledActivation final : public Profiled<sdk::ActivationFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::ActivationOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void bias_grad(TensorView dy, TensorView db, bool acc) override {
    rec_.timed("bias_grad", [&] { in_.bias_grad(dy, db, acc); });
  }
  void activation_forward(sdk::Activation act, TensorView x, TensorView y) override {
    rec_.timed("activation_forward", [&] { in_.activation_forward(act, x, y); });
  }
  void activation_backward(sdk::Activation act, TensorView x, TensorView dy,
                           TensorView dx) override {
    rec_.timed("activation_backward", [&] { in_.activation_backward(act, x, dy, dx); });
  }
  void axpy(float alpha, TensorView x, TensorView y) override {
    rec_.timed("axpy", [&] { in_.axpy(alpha, x, y); });
  }
};

class ProfiledResidual final : public Profiled<sdk::ResidualFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::ResidualOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void add(Views xs, bool relu, TensorView y) override {
    rec_.timed("add", [&] { in_.add(xs, relu, y); });
  }
};

class ProfiledGradientCheck final : public Profiled<sdk::GradientCheckFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::GradientCheckOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  bool unscale_and_check_finite(Views g, float inv) override {
    bool r = false;
    rec_.timed("unscale_and_check_finite", [&] { r = in_.unscale_and_check_finite(g, inv); });
    return r;
  }
  GradientCheck unscale_check_and_sum_squares(Views g, float inv) override {
    GradientCheck r;
    rec_.timed("unscale_check_and_sum_squares",
               [&] { r = in_.unscale_check_and_sum_squares(g, inv); });
    return r;
  }
  int first_nonfinite(Views t) override {
    int r = -1;
    rec_.timed("first_nonfinite", [&] { r = in_.first_nonfinite(t); });
    return r;
  }
};

class ProfiledForeach final : public Profiled<sdk::ForeachFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::ForeachOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void foreach_mul_scalar(Views s, float v) override {
    rec_.timed("foreach_mul_scalar", [&] { in_.foreach_mul_scalar(s, v); });
  }
  void foreach_mul(Views s, Views o) override {
    rec_.timed("foreach_mul", [&] { in_.foreach_mul(s, o); });
  }
  void foreach_add_scalar(Views s, float v) override {
    rec_.timed("foreach_add_scalar", [&] { in_.foreach_add_scalar(s, v); });
  }
  void foreach_add(Views s, Views o, float alpha) override {
    rec_.timed("foreach_add", [&] { in_.foreach_add(s, o, alpha); });
  }
  void foreach_addcmul(Views s, Views t1, Views t2, float v) override {
    rec_.timed("foreach_addcmul", [&] { in_.foreach_addcmul(s, t1, t2, v); });
  }
  void foreach_sqrt(Views s) override {
    rec_.timed("foreach_sqrt", [&] { in_.foreach_sqrt(s); });
  }
  void foreach_sign(Views s) override {
    rec_.timed("foreach_sign", [&] { in_.foreach_sign(s); });
  }
  void foreach_lerp(Views s, Views e, float w) override {
    rec_.timed("foreach_lerp", [&] { in_.foreach_lerp(s, e, w); });
  }
  void foreach_clamp(Views s, float lo, float hi) override {
    rec_.timed("foreach_clamp", [&] { in_.foreach_clamp(s, lo, hi); });
  }
};

class ProfiledLayerNorm final : public Profiled<sdk::LayerNormFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::LayerNormOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void layernorm_forward(TensorView x, TensorView g, TensorView b, float eps, TensorView y,
                         TensorView mean, TensorView rstd) override {
    rec_.timed("layernorm_forward", [&] { in_.layernorm_forward(x, g, b, eps, y, mean, rstd); });
  }
  void layernorm_backward(TensorView dy, TensorView x, TensorView g, TensorView mean,
                          TensorView rstd, TensorView dx, TensorView dg, TensorView db,
                          bool acc) override {
    rec_.timed("layernorm_backward",
               [&] { in_.layernorm_backward(dy, x, g, mean, rstd, dx, dg, db, acc); });
  }
};

class ProfiledBatchNorm final : public Profiled<sdk::BatchNormFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::BatchNormOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  std::size_t batchnorm_workspace_bytes(const sdk::BatchNormShape& sh, DType x) const override {
    return in_.batchnorm_workspace_bytes(sh, x);
  }
  void batchnorm_forward_training(TensorView x, TensorView g, TensorView b,
                                  const sdk::BatchNormShape& sh, float momentum, TensorView y,
                                  TensorView mean, TensorView var, TensorView rmean,
                                  TensorView rvar, TensorView ws) override {
    rec_.timed("batchnorm_forward_training", [&] {
      in_.batchnorm_forward_training(x, g, b, sh, momentum, y, mean, var, rmean, rvar, ws);
    });
  }
  void batchnorm_forward_inference(TensorView x, TensorView g, TensorView b, TensorView rmean,
                                   TensorView rvar, const sdk::BatchNormShape& sh,
                                   TensorView y) override {
    rec_.timed("batchnorm_forward_inference",
               [&] { in_.batchnorm_forward_inference(x, g, b, rmean, rvar, sh, y); });
  }
  void batchnorm_backward(TensorView dy, TensorView x, TensorView y, TensorView g, TensorView mean,
                          TensorView var, const sdk::BatchNormShape& sh, TensorView ws,
                          TensorView dx, TensorView dg, TensorView db, bool acc) override {
    rec_.timed("batchnorm_backward",
               [&] { in_.batchnorm_backward(dy, x, y, g, mean, var, sh, ws, dx, dg, db, acc); });
  }
};

class ProfiledLoss final : public Profiled<sdk::LossFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::LossOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void softmax_cross_entropy(TensorView logits, TensorView labels, float gs, TensorView loss,
                             TensorView correct, TensorView dlogits) override {
    rec_.timed("softmax_cross_entropy",
               [&] { in_.softmax_cross_entropy(logits, labels, gs, loss, correct, dlogits); });
  }
};

class ProfiledOptimizer final : public Profiled<sdk::OptimizerFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::OptimizerOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> p) override {
    rec_.timed("sgd_update", [&] { in_.sgd_update(h, p); });
  }
  void adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> p) override {
    rec_.timed("adamw_update", [&] { in_.adamw_update(h, p); });
  }
};

class ProfiledAttention final : public Profiled<sdk::AttentionFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::AttentionOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void split_heads(TensorView x, const sdk::HeadLayout& l, TensorView y) override {
    rec_.timed("split_heads", [&] { in_.split_heads(x, l, y); });
  }
  void merge_heads(TensorView y, const sdk::HeadLayout& l, TensorView x) override {
    rec_.timed("merge_heads", [&] { in_.merge_heads(y, l, x); });
  }
  void softmax_forward(TensorView s, const sdk::SoftmaxShape& sh, float scale,
                       TensorView p) override {
    rec_.timed("softmax_forward", [&] { in_.softmax_forward(s, sh, scale, p); });
  }
  void softmax_backward(TensorView p, TensorView dp, const sdk::SoftmaxShape& sh, float scale,
                        TensorView ds) override {
    rec_.timed("softmax_backward", [&] { in_.softmax_backward(p, dp, sh, scale, ds); });
  }
};

class ProfiledEmbedding final : public Profiled<sdk::EmbeddingFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::EmbeddingOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void gather(TensorView ids, TensorView table, TensorView out, bool acc) override {
    rec_.timed("gather", [&] { in_.gather(ids, table, out, acc); });
  }
  void scatter_add(TensorView ids, TensorView dy, TensorView dtable, float beta) override {
    rec_.timed("scatter_add", [&] { in_.scatter_add(ids, dy, dtable, beta); });
  }
};

class ProfiledConvolution final : public Profiled<sdk::ConvolutionFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::ConvolutionOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void conv2d_forward(const sdk::Conv2dForwardArgs& a) override {
    rec_.timed("conv2d_forward", [&] { in_.conv2d_forward(a); });
  }
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& a) override {
    rec_.timed("conv2d_backward_data", [&] { in_.conv2d_backward_data(a); });
  }
  void conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& a) override {
    rec_.timed("conv2d_backward_weights", [&] { in_.conv2d_backward_weights(a); });
  }
  std::size_t pool2d_workspace_bytes(const sdk::Pool2dGeometry& g, DType x) const override {
    return in_.pool2d_workspace_bytes(g, x);
  }
  void pool2d_forward(const sdk::Pool2dGeometry& g, TensorView x, TensorView y,
                      TensorView ws) override {
    rec_.timed("pool2d_forward", [&] { in_.pool2d_forward(g, x, y, ws); });
  }
  void pool2d_backward(const sdk::Pool2dGeometry& g, TensorView dy, TensorView x, TensorView y,
                       TensorView ws, TensorView dx) override {
    rec_.timed("pool2d_backward", [&] { in_.pool2d_backward(g, dy, x, y, ws, dx); });
  }
  void to_channels_last(TensorView src, std::int64_t c, std::int64_t h, std::int64_t w,
                        TensorView dst) override {
    rec_.timed("to_channels_last", [&] { in_.to_channels_last(src, c, h, w, dst); });
  }
  void to_channels_first(TensorView src, std::int64_t c, std::int64_t h, std::int64_t w,
                         TensorView dst) override {
    rec_.timed("to_channels_first", [&] { in_.to_channels_first(src, c, h, w, dst); });
  }
};

class ProfiledDropout final : public Profiled<sdk::DropoutFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::DropoutOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void dropout_forward(TensorView x, TensorView y, float p, sdk::DropoutKey key) override {
    rec_.timed("dropout_forward", [&] { in_.dropout_forward(x, y, p, key); });
  }
  void dropout_backward(TensorView dy, TensorView dx, float p, sdk::DropoutKey key) override {
    rec_.timed("dropout_backward", [&] { in_.dropout_backward(dy, dx, p, key); });
  }
};

class ProfilingBackendImpl final : public ProfilingBackend {
 public:
  explicit ProfilingBackendImpl(std::shared_ptr<sdk::DeviceBackend> inner)
      : in_(std::move(inner)), rec_(*in_) {
    std::apply([&](auto&... w) { (wrap(w), ...); }, facets_);
  }

  // --- the profiler ---
  std::vector<ProfileEntry> entries() const override { return rec_.entries(); }
  double recorded_seconds() const override { return rec_.recorded_seconds(); }
  void set_recording(bool on) override { rec_.set_recording(on); }
  void reset() override { rec_.reset(); }

  // --- DeviceBackend ---
  sdk::BackendCapabilities capabilities() const override { return in_->capabilities(); }
  void* allocate(std::size_t bytes) override { return in_->allocate(bytes); }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(TensorView d, const void* s) override {
    rec_.timed("copy_from_host", [&] { in_->copy_from_host(d, s); });
  }
  void copy_to_host(void* d, TensorView s) override {
    rec_.timed("copy_to_host", [&] { in_->copy_to_host(d, s); });
  }
  void copy(TensorView d, TensorView s) override {
    rec_.timed("copy", [&] { in_->copy(d, s); });
  }
  void synchronize() override { in_->synchronize(); }
  void cast(TensorView s, TensorView d, const sdk::CastArgs& a) override {
    rec_.timed("cast", [&] { in_->cast(s, d, a); });
  }
  void fill(TensorView x, float v) override {
    rec_.timed("fill", [&] { in_->fill(x, v); });
  }

  // A facet the profiler wraps, when the inner backend has it at the version the profiler
  // speaks; anything else is the inner backend's own answer (nullptr, an older version the host
  // will refuse by name, or a facet this profiler does not know, unprofiled).
  sdk::Facet* find_facet(std::string_view name) override {
    sdk::Facet* found = nullptr;
    std::apply(
        [&](auto&... w) {
          ((found == nullptr && w != nullptr && name == w->name() ? void(found = w.get()) : void()),
           ...);
        },
        facets_);
    return found != nullptr ? found : in_->find_facet(name);
  }

 private:
  template <class W>
  void wrap(std::unique_ptr<W>& w) {
    if (auto* f = sdk::facet<typename W::Inner>(*in_)) w = std::make_unique<W>(rec_, *f);
  }

  std::shared_ptr<sdk::DeviceBackend> in_;
  Recorder rec_;
  std::tuple<std::unique_ptr<ProfiledGemm>, std::unique_ptr<ProfiledActivation>,
             std::unique_ptr<ProfiledResidual>, std::unique_ptr<ProfiledGradientCheck>,
             std::unique_ptr<ProfiledForeach>, std::unique_ptr<ProfiledLayerNorm>,
             std::unique_ptr<ProfiledBatchNorm>, std::unique_ptr<ProfiledLoss>,
             std::unique_ptr<ProfiledOptimizer>, std::unique_ptr<ProfiledAttention>,
             std::unique_ptr<ProfiledEmbedding>, std::unique_ptr<ProfiledConvolution>,
             std::unique_ptr<ProfiledDropout>>
      facets_;
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
  if (op.starts_with("dropout_")) return "dropout";
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
