// The profiled facets: for each facet the profiler knows, a wrapper that forwards every op to the
// inner backend's facet and times it in a Recorder; supports() is the inner facet's answer.
// Internal to the core (profiling/). A new facet gets its wrapper here and its slot in
// ProfilingBackendImpl's tuple (profiling_backend.cpp).
#pragma once

#include <span>

#include "mixtrain/sdk/device_backend.h"
#include "profiling/recorder.h"

namespace mixtrain::core::profiling {

using sdk::DType;
using sdk::TensorView;
using Views = std::span<const TensorView>;

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
  void batchnorm_statistics(TensorView x, const sdk::BatchNormShape& sh, TensorView mean,
                            TensorView var) override {
    rec_.timed("batchnorm_statistics", [&] { in_.batchnorm_statistics(x, sh, mean, var); });
  }
  void batchnorm_backward_reduce(TensorView dy, TensorView x, TensorView y, TensorView mean,
                                 TensorView var, const sdk::BatchNormShape& sh, TensorView sdy,
                                 TensorView sdyx) override {
    rec_.timed("batchnorm_backward_reduce",
               [&] { in_.batchnorm_backward_reduce(dy, x, y, mean, var, sh, sdy, sdyx); });
  }
  void batchnorm_backward_elementwise(TensorView dy, TensorView x, TensorView y, TensorView g,
                                      TensorView mean, TensorView var, TensorView mdy,
                                      TensorView mdyx, const sdk::BatchNormShape& sh,
                                      TensorView dx) override {
    rec_.timed("batchnorm_backward_elementwise", [&] {
      in_.batchnorm_backward_elementwise(dy, x, y, g, mean, var, mdy, mdyx, sh, dx);
    });
  }
};

class ProfiledLoss final : public Profiled<sdk::LossFacet> {
 public:
  using Profiled::Profiled;
  bool supports(sdk::LossOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void softmax_cross_entropy(TensorView logits, TensorView labels, float gs, float smoothing,
                             TensorView loss, TensorView correct, TensorView dlogits) override {
    rec_.timed("softmax_cross_entropy", [&] {
      in_.softmax_cross_entropy(logits, labels, gs, smoothing, loss, correct, dlogits);
    });
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

}  // namespace mixtrain::core::profiling
