// Helpers of the core's CNN tests (test_cnn_ops.cpp, test_cnn_fusion.cpp): image inputs, graph
// specs, random batches, and a batch norm facet that refuses some of its ops (what an older
// backend looks like to the plan). Test code only; every helper runs on the core tests' CPU
// backend (cpu_test_backend.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "cpu_test_backend.h"
#include "forwarding_backend.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::core::cnn_testing {

using sdk::DType;
using test_support::cpu;
using test_support::random_vector;
using test_support::write;

inline InputSpec image(std::int64_t c, std::int64_t h, std::int64_t w) {
  InputSpec in;
  in.sample_shape = {c, h, w};
  return in;
}

inline ModelSpec graph(std::vector<LayerSpec> nodes) {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = std::move(nodes);
  return spec;
}

inline void feed(Model& m, std::int64_t batch, unsigned seed) {
  write(m.input(batch), random_vector(static_cast<std::size_t>(batch * m.input_features()), seed));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int32_t>((i * 7 + seed) % static_cast<unsigned>(m.classes()));
  cpu()->copy_from_host(m.labels(batch), labels.data());
}

// One training step of `rows` rows (fed already): the loss, then every parameter's gradient,
// flattened in the model's parameter order.
inline std::vector<float> loss_and_gradients(Model& m, std::int64_t rows) {
  m.forward(rows);
  std::vector<float> out{m.loss(rows, 1.0f, true).loss};
  m.backward(rows);
  for (auto* t : m.parameters()) {
    const auto g = test_support::read(t->grad.view());
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

// ‖a − b‖ / ‖b‖ of two steps' loss and gradients (0 when b is all zeros).
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : 0.0;
}

// A convolution facet passing every op to `in` (not owned): a test's stand-in derives from it and
// overrides what it changes. It keeps the SDK's defaults for the caller's workspace (1.2): none
// asked for, so every call comes through the methods above, which a stand-in counts.
class ForwardingConvolution : public sdk::ConvolutionFacet {
 public:
  explicit ForwardingConvolution(sdk::ConvolutionFacet& in) : in_(in) {}
  bool supports(sdk::ConvolutionOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void conv2d_forward(const sdk::Conv2dForwardArgs& a) override { in_.conv2d_forward(a); }
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& a) override {
    in_.conv2d_backward_data(a);
  }
  void conv2d_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& a) override {
    in_.conv2d_backward_data_accumulate(a);
  }
  void conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& a) override {
    in_.conv2d_backward_weights(a);
  }
  std::size_t pool2d_workspace_bytes(const sdk::Pool2dGeometry& g, DType x) const override {
    return in_.pool2d_workspace_bytes(g, x);
  }
  void pool2d_forward(const sdk::Pool2dGeometry& g, sdk::TensorView x, sdk::TensorView y,
                      sdk::TensorView ws) override {
    in_.pool2d_forward(g, x, y, ws);
  }
  void pool2d_backward(const sdk::Pool2dGeometry& g, sdk::TensorView dy, sdk::TensorView x,
                       sdk::TensorView y, sdk::TensorView ws, sdk::TensorView dx) override {
    in_.pool2d_backward(g, dy, x, y, ws, dx);
  }
  void to_channels_last(sdk::TensorView src, std::int64_t c, std::int64_t h, std::int64_t w,
                        sdk::TensorView dst) override {
    in_.to_channels_last(src, c, h, w, dst);
  }
  void to_channels_first(sdk::TensorView src, std::int64_t c, std::int64_t h, std::int64_t w,
                         sdk::TensorView dst) override {
    in_.to_channels_first(src, c, h, w, dst);
  }

 protected:
  sdk::ConvolutionFacet& in_;
};

// The CPU's batch norm refusing some of its ops (what an older backend's answer looks like to the
// plan), every other facet the CPU's.
class NarrowedBatchNorm final : public sdk::BatchNormFacet {
 public:
  NarrowedBatchNorm(sdk::BatchNormFacet& in, std::vector<sdk::BatchNormOp> refused)
      : in_(in), refused_(std::move(refused)) {}
  bool supports(sdk::BatchNormOp op, std::span<const DType> d) const override {
    return !refuses(op) && in_.supports(op, d);
  }
  std::size_t batchnorm_workspace_bytes(const sdk::BatchNormShape& s, DType x) const override {
    return in_.batchnorm_workspace_bytes(s, x);
  }
  void batchnorm_forward_training(sdk::TensorView x, sdk::TensorView g, sdk::TensorView b,
                                  const sdk::BatchNormShape& s, float momentum, sdk::TensorView y,
                                  sdk::TensorView m, sdk::TensorView v, sdk::TensorView rm,
                                  sdk::TensorView rv, sdk::TensorView ws) override {
    in_.batchnorm_forward_training(x, g, b, s, momentum, y, m, v, rm, rv, ws);
  }
  void batchnorm_forward_inference(sdk::TensorView x, sdk::TensorView g, sdk::TensorView b,
                                   sdk::TensorView rm, sdk::TensorView rv,
                                   const sdk::BatchNormShape& s, sdk::TensorView y) override {
    in_.batchnorm_forward_inference(x, g, b, rm, rv, s, y);
  }
  void batchnorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                          sdk::TensorView g, sdk::TensorView m, sdk::TensorView v,
                          const sdk::BatchNormShape& s, sdk::TensorView ws, sdk::TensorView dx,
                          sdk::TensorView dg, sdk::TensorView db, bool acc) override {
    in_.batchnorm_backward(dy, x, y, g, m, v, s, ws, dx, dg, db, acc);
  }
  void batchnorm_statistics(sdk::TensorView x, const sdk::BatchNormShape& s, sdk::TensorView m,
                            sdk::TensorView v) override {
    if (refused_call(sdk::BatchNormOp::batchnorm_statistics)) return;
    in_.batchnorm_statistics(x, s, m, v);
  }
  void batchnorm_backward_reduce(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                 sdk::TensorView m, sdk::TensorView v, const sdk::BatchNormShape& s,
                                 sdk::TensorView sd, sdk::TensorView sdx) override {
    if (refused_call(sdk::BatchNormOp::batchnorm_backward_reduce)) return;
    in_.batchnorm_backward_reduce(dy, x, y, m, v, s, sd, sdx);
  }
  void batchnorm_backward_elementwise(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                      sdk::TensorView g, sdk::TensorView m, sdk::TensorView v,
                                      sdk::TensorView md, sdk::TensorView mdx,
                                      const sdk::BatchNormShape& s, sdk::TensorView dx) override {
    if (refused_call(sdk::BatchNormOp::batchnorm_backward_elementwise)) return;
    in_.batchnorm_backward_elementwise(dy, x, y, g, m, v, md, mdx, s, dx);
  }
  void batchnorm_add_forward(const sdk::BatchNormAddArgs& a) override {
    if (refused_call(sdk::BatchNormOp::batchnorm_add_forward)) return;
    in_.batchnorm_add_forward(a);
  }

 private:
  bool refuses(sdk::BatchNormOp op) const {
    return std::find(refused_.begin(), refused_.end(), op) != refused_.end();
  }
  bool refused_call(sdk::BatchNormOp op) const {
    if (refuses(op)) ADD_FAILURE() << "called " << sdk::op_name(op) << ", which it refuses";
    return refuses(op);
  }

  sdk::BatchNormFacet& in_;
  std::vector<sdk::BatchNormOp> refused_;
};

class NarrowedBatchNormBackend final : public test_support::ForwardingBackend {
 public:
  explicit NarrowedBatchNormBackend(std::vector<sdk::BatchNormOp> refused)
      : bn_(*sdk::facet<sdk::BatchNormFacet>(*cpu()), std::move(refused)) {}
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::BatchNormFacet::kName ? &bn_ : in_->find_facet(name);
  }

 private:
  NarrowedBatchNorm bn_;
};

// What an older backend (batch norm 1.0) offers.
inline std::shared_ptr<sdk::DeviceBackend> no_split_batch_norm() {
  return std::make_shared<NarrowedBatchNormBackend>(std::vector<sdk::BatchNormOp>{
      sdk::BatchNormOp::batchnorm_statistics, sdk::BatchNormOp::batchnorm_backward_reduce,
      sdk::BatchNormOp::batchnorm_backward_elementwise});
}

}  // namespace mixtrain::core::cnn_testing
