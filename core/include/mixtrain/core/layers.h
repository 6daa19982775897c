// Layers: explicit forward/backward over buffers allocated once, up front.
//
// Contract
// - A layer maps x [rows, in_features] to y [rows, out_features]; rows <= the max_rows given to
//   allocate(). The layer owns its output activation (stored in precision().activation), its
//   parameters (FP32 master + FP32 gradient + optional low-precision working copy) and any saved
//   statistics. Inputs are views owned by the previous layer, valid until the next forward.
// - backward(x, dy, dx, rows) writes FP32 parameter gradients (overwriting: one micro-batch per
//   step) and, when dx is not empty, the gradient w.r.t. the input in dx's dtype.
// - Math runs on the backend; a layer performs only the casts its precision plan asks for.
// - Epilogue fusion: a Linear followed by an activation can run the activation as its GEMM's
//   epilogue (LinearLayer::fuse_activation). The Linear then writes act(z) into the activation
//   layer's output, rounded once, and z into its own output only where the backward needs it
//   (gelu); the activation layer's forward does nothing and its relu backward reads its own
//   output (relu(z) > 0 exactly where z > 0). A Linear fused with a relu therefore allocates no
//   output of its own until it first runs unfused; until then output() is a view without data.
//   set_fusion(false) runs the pair unfused again (the non-finite replay names every tensor that
//   way).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::core {

struct ModelParameter {
  std::string name;  // "<layer>.weight"
  Tensor master;     // fp32
  Tensor grad;       // fp32
  Tensor working;    // low-precision copy; empty when the weight dtype is fp32 / tf32
  bool weight_decay = true;
  sdk::TensorView compute_view() const { return working.empty() ? master.view() : working.view(); }
};

class Layer {
 public:
  Layer(std::string name, std::string type, std::int64_t in, std::int64_t out);
  virtual ~Layer();

  const std::string& name() const { return name_; }
  const std::string& type() const { return type_; }
  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  virtual bool has_gemm() const { return false; }
  sdk::LayerDescription description() const;

  void set_precision(const sdk::LayerPrecision& p) { precision_ = p; }
  // For policies whose GEMM operands carry per-tensor scales (FP8): the layer asks the policy for
  // each operand's dtype and scale, casts with saturation and a fused amax, and reports the amax
  // back. Non-owning; the policy outlives the model. Layers without GEMMs ignore it.
  virtual void set_operand_scaling(sdk::PrecisionPolicy* /*policy*/) {}

  // Per scaled operand of the last step (when collection is on): what the FP8 cast did to it.
  struct ScaledOperandStats {
    std::string slot;  // "<layer>.<role>"
    sdk::DType dtype;
    float amax = 0.0f, scale = 1.0f;
    std::int64_t count = 0, saturated = 0, underflowed = 0, nonzero = 0;
  };
  void collect_operand_stats(bool on) {
    collect_stats_ = on;
    stats_.clear();
  }
  const std::vector<ScaledOperandStats>& operand_stats() const { return stats_; }
  const sdk::LayerPrecision& precision() const { return precision_; }

  virtual void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows);
  virtual void forward(sdk::TensorView x, std::int64_t rows) = 0;
  virtual void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                        std::int64_t rows) = 0;
  // Ops with several inputs (add) override these; single-input ops take xs[0] / dxs[0]. An empty
  // dxs[i] means input i needs no gradient.
  virtual std::size_t input_count() const { return 1; }
  virtual void forward_inputs(std::span<const sdk::TensorView> xs, std::int64_t rows) {
    forward(xs[0], rows);
  }
  virtual void backward_inputs(std::span<const sdk::TensorView> xs, sdk::TensorView dy,
                               std::span<const sdk::TensorView> dxs, std::int64_t rows) {
    backward(xs[0], dy, dxs[0], rows);
  }
  // A view op (reshape, flatten) computes nothing: its output is its input's memory seen with
  // another shape, and its input's gradient is its output's gradient, likewise.
  virtual bool is_view() const { return false; }
  // Host-side initialisation of parameters from a seed (PyTorch's defaults for the layer type).
  virtual void init_parameters(std::uint64_t /*seed*/) {}

  // The output activation; a view without data (data == nullptr) while it is not materialised.
  sdk::TensorView output(std::int64_t rows) const;
  std::vector<ModelParameter>& parameters() { return params_; }
  const std::vector<ModelParameter>& parameters() const { return params_; }

 protected:
  ModelParameter make_parameter(const std::string& suffix, sdk::Shape shape, bool decay);
  // Whether allocate() may leave the output unallocated (materialise_output() makes it later).
  virtual bool output_deferred() const { return false; }
  void materialise_output();
  // `x` as `dtype`: x itself when it already is, else a cast into `scratch` (grown on demand).
  sdk::TensorView as_dtype(sdk::TensorView x, sdk::DType dtype, Tensor& scratch);

  std::shared_ptr<sdk::DeviceBackend> backend_;
  std::string name_, type_;
  std::int64_t in_, out_;
  sdk::LayerPrecision precision_;
  std::int64_t max_rows_ = 0;
  Tensor output_;
  std::vector<ModelParameter> params_;
  bool collect_stats_ = false;
  std::vector<ScaledOperandStats> stats_;
};

class ActivationLayer;

// y = x · Wᵀ + b with W [out, in] (PyTorch layout), FP32 accumulation.
class LinearLayer final : public Layer {
 public:
  LinearLayer(std::string name, std::int64_t in, std::int64_t out, bool bias);
  bool has_gemm() const override { return true; }
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;
  void set_operand_scaling(sdk::PrecisionPolicy* policy) override { scaling_ = policy; }
  // Pairs this layer with the activation that follows it (non-owning; both belong to one model).
  void fuse_activation(ActivationLayer* next);
  void set_fusion(bool on);
  bool fused() const { return fused_ != nullptr && fusion_on_; }
  bool output_deferred() const override;
  // Delayed scaling: hands the amaxes measured by this step's operand casts to the policy (one
  // read of the device buffer). Casts leave them on the device, so a step does not wait on them.
  void flush_operand_amaxes();

 private:
  struct ScaledOperand {
    Tensor data;  // fp8 copy of the operand
    float scale_inv = 1.0f;
  };
  // Casts `src` to the dtype and scale the policy gives for `role`, with saturation and a fused
  // amax that is reported back to the policy.
  sdk::GemmOperand scale_operand(sdk::TensorView src, sdk::OperandRole role, ScaledOperand& dst);

  bool bias_;
  Tensor x_scratch_, dy_scratch_;
  sdk::PrecisionPolicy* scaling_ = nullptr;
  ScaledOperand x8_, w8_, dy8_;
  Tensor amax_;              // fp32 [3]: the last cast's amax per role (input, weight, grad_output)
  bool amax_pending_[3] = {false, false, false};
  ActivationLayer* fused_ = nullptr;
  bool fusion_on_ = true;
};

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(std::string name, sdk::Activation act, std::int64_t features);
  sdk::Activation activation() const { return act_; }
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;

 private:
  friend class LinearLayer;  // sets fused_ when it takes over the forward
  sdk::Activation act_;
  bool fused_ = false;
};

// Per-row normalisation with FP32 statistics; gamma/beta are FP32 and never weight-decayed.
class LayerNormLayer final : public Layer {
 public:
  LayerNormLayer(std::string name, std::int64_t features, float eps);
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;

 private:
  float eps_;
  Tensor mean_, rstd_;
};

// y = x1 + x2 + ... (a residual join): the sum in FP32, rounded once into y's dtype; each input's
// gradient is dy.
class AddLayer final : public Layer {
 public:
  AddLayer(std::string name, std::size_t inputs, std::int64_t features);
  std::size_t input_count() const override { return inputs_; }
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void forward_inputs(std::span<const sdk::TensorView> xs, std::int64_t rows) override;
  void backward_inputs(std::span<const sdk::TensorView> xs, sdk::TensorView dy,
                       std::span<const sdk::TensorView> dxs, std::int64_t rows) override;

 private:
  std::size_t inputs_;
  Tensor sum_;  // fp32 [max_rows, features] when y is not fp32
};

// reshape / flatten: a view. `in` and `out` are the last dimensions before and after.
class ViewLayer final : public Layer {
 public:
  ViewLayer(std::string name, std::string type, std::int64_t in, std::int64_t out);
  bool is_view() const override { return true; }
  void forward(sdk::TensorView, std::int64_t) override {}
  void backward(sdk::TensorView, sdk::TensorView, sdk::TensorView, std::int64_t) override {}

 protected:
  bool output_deferred() const override { return true; }  // never allocated: the input's memory
};

}  // namespace mixtrain::core
