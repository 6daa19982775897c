// batchnorm2d: batch normalisation of images [C, H, W] per channel, PyTorch's BatchNorm2d.
//
// Contract
// - Options: eps (1e-5), momentum (0.1), affine (true).
// - Statistics are FP32 whatever the policy (the backend computes them in FP32 from 16-bit
//   activations); the output is stored in the plan's activation dtype, as PyTorch's autocast and
//   cuDNN do, so a bf16 network keeps 16-bit activations end to end.
// - Parameters: weight (1) and bias (0), fp32 [C], never weight-decayed; absent when not affine.
//   Buffers: running_mean (0) and running_var (1), fp32 [C], PyTorch's names
//   ("<node>.running_mean"): updated in training mode with PyTorch's momentum rule (unbiased
//   variance), used in evaluation mode, saved in checkpoints and exports.
// - A relu that is its only reader is taken in (take_relu): forward applies it, backward masks
//   with it, and the relu node is a view of this output.
// - BN + add + ReLU: an add that alone reads this output runs this batch norm inside its own pass
//   (AddLayer::fuse_input, forward_with_residual: the backend's batchnorm_add_forward, BatchNorm
//   facet 1.2): y_add = act(BN(x) + residual), BN(x) never stored. forward() then only keeps x
//   for the backward, and the output stays deferred (written only when the pair runs unfused:
//   set_fusion(false), the non-finite replay). The backward is unchanged: the add writes this
//   output's gradient (masked by its ReLU). Unfused, with the reason logged once, when the
//   backend lacks the op (choose_kernels), under synchronized batch norm, or for a residual of
//   another dtype.
// - Layout: channels-last output; a plain input is permuted first (ops/image_input.h).
// - Synchronized batch norm (`[distributed] batch_norm = "sync"`, PyTorch's SyncBatchNorm):
//   with a statistics reducer installed (set_statistics_reducer; data parallel installs one that
//   sums a host vector over the ranks, in place), training normalises with the global batch's
//   statistics: the backend's batchnorm_statistics, the per-channel (count·mean, count·E[x²],
//   count) summed by the reducer in double, then batchnorm_forward_inference with the global mean
//   and biased variance, which are also what backward reads; the running statistics move with the
//   global mean and unbiased variance. Backward sums Σg and Σg·x̂ locally
//   (batchnorm_backward_reduce), keeps them as this rank's dbeta and dgamma (data parallel
//   averages parameter gradients afterwards), reduces them and writes dx with their global means
//   (batchnorm_backward_elementwise). Every rank must run the same batch-norm layers in the same
//   order (the reducer is a collective). Needs BatchNormFacet version 2's ops (backend_needs).
//   Evaluation is unchanged (running statistics). With a reducer that leaves the vector as it is
//   (one rank) the result is plain batch norm.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/ops/image_input.h"
#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

class BatchNorm2dLayer final : public Layer {
 public:
  BatchNorm2dLayer(std::string name, std::int64_t channels, std::int64_t height, std::int64_t width,
                   float eps, float momentum, bool affine, bool plain_input);
  std::int64_t channels() const { return channels_; }
  bool relu() const { return relu_; }
  // The reducer sums `values` over the ranks in place (every rank calls it with the same length);
  // empty: local statistics.
  void set_statistics_reducer(StatisticsReducer reducer) override;
  bool synchronized() const { return static_cast<bool>(reducer_); }
  // The version-2 ops the synchronized path calls (in backend_needs() once a reducer is set).
  std::vector<BackendNeed> synchronized_needs() const override;
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  bool take_relu() override;
  // The add `reader` will run this batch norm in its pass (BN + add + ReLU), when fusion is on
  // and the backend offers it; false when this op cannot (its ReLU taken in).
  bool defer_into_reader();
  void set_fusion(bool on) override;
  void choose_kernels(sdk::DeviceBackend& backend) override;
  // Fused: y = act(BN(the x of the last forward) + residual) into the add's output y, rows of
  // the add; relu: the add's ReLU. Returns false (and has written its own output instead, for the
  // add to read) when the pair cannot run fused now: a residual or y of another dtype.
  bool forward_with_residual(sdk::TensorView residual, bool relu, sdk::TensorView y,
                             std::int64_t rows);
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;

 private:
  sdk::DType dtype() const;  // what x, y, dy and dx are in for the facet
  sdk::BatchNormShape shape_at(std::int64_t batch) const;
  void update_fusion();  // fused() and output_deferred from what decides them
  // The unfused forward of x (channels-last) into this op's own output.
  void forward_into_output(sdk::TensorView xs, std::int64_t rows, const sdk::BatchNormShape& s);
  sdk::TensorView gamma() const;
  sdk::TensorView beta() const;
  // Parameter k's gradient (0: weight, 1: bias); empty when not affine or frozen.
  sdk::TensorView parameter_grad(std::size_t k) const;
  void forward_synchronized(sdk::TensorView xs, sdk::TensorView y, const sdk::BatchNormShape& s);
  void backward_synchronized(sdk::TensorView dys, sdk::TensorView xs, sdk::TensorView y,
                             const sdk::BatchNormShape& s, sdk::TensorView dx, bool accumulate);

  std::int64_t channels_, height_, width_;
  float eps_, momentum_;
  bool affine_;
  bool relu_ = false;
  bool into_reader_ = false;    // an add reads it alone and takes it in (defer_into_reader)
  bool fusion_on_ = true;       // set_fusion
  bool backend_offers_ = true;  // batchnorm_add_forward (choose_kernels)
  ChannelsLastInput input_;
  sdk::TensorView x_cl_;  // the forward's input, channels-last, for backward
  Tensor save_mean_, save_var_;
  BatchWorkspace workspace_;
  Tensor dy_scratch_, dx_scratch_;
  StatisticsReducer reducer_;
  Tensor sum_dy_, sum_dy_xhat_;  // synchronized: the backward's sums, then their global means
  double global_rows_ = 0.0;     // synchronized: the last training forward's global row count
};

}  // namespace mixtrain::core
