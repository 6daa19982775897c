// Model: a sequence of layers ending in softmax-cross-entropy, with every buffer allocated once.
//
// Contract
// - Lifecycle: construct from a ModelSpec (layer objects only) → set each layer's precision →
//   allocate(max_rows) → init_parameters(seed) or load masters → refresh_working_copies().
// - Each step: write the batch into input(rows) / labels(rows) (device views), forward(rows),
//   loss(rows, grad_scale, with_grad), backward(rows). The last layer's output are the logits
//   [rows, classes]; `grad_scale` (the loss scale) multiplies the gradient seed.
// - ModelSpec errors (unknown layer type, bad sizes, duplicate names, last layer not producing
//   `classes` outputs) raise sdk::ConfigError at the layer's file:line:col.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/layers.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain::core {

struct LayerSpec {
  std::string type;  // linear | relu | gelu | layernorm
  std::string name;  // defaults to "<type><index>"
  std::int64_t out = 0;  // linear only
  bool bias = true;      // linear only
  double eps = 1e-5;     // layernorm only
  sdk::SourceLocation where;
};

struct ModelSpec {
  std::vector<LayerSpec> layers;
  std::string loss = "softmax_cross_entropy";
  bool fuse_epilogues = true;  // Linear + relu/gelu as one GEMM with an activation epilogue
  sdk::SourceLocation where;
};

struct LossValues {
  float loss = 0.0f;         // mean over rows, FP32
  std::int32_t correct = 0;  // rows whose argmax equals the label
};

class Model {
 public:
  Model(std::shared_ptr<sdk::DeviceBackend> backend, const ModelSpec& spec,
        std::int64_t input_features, std::int32_t classes);

  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  std::int64_t input_features() const { return input_features_; }
  std::int32_t classes() const { return classes_; }

  void allocate(std::int64_t max_rows);
  void init_parameters(std::uint64_t seed);
  void refresh_working_copies();  // working = cast(master) for every parameter that has one

  sdk::TensorView input(std::int64_t rows) const { return input_.rows(rows); }
  sdk::TensorView labels(std::int64_t rows) const;
  sdk::TensorView logits(std::int64_t rows) const { return layers_.back()->output(rows); }

  void forward(std::int64_t rows);
  // Enqueues the loss (and, with_grad, the scaled gradient of the logits) without waiting for it.
  void compute_loss(std::int64_t rows, float grad_scale, bool with_grad);
  // Reads back the last computed loss and correct count (waits for the device).
  LossValues read_loss();
  // compute_loss, then read_loss.
  LossValues loss(std::int64_t rows, float grad_scale, bool with_grad);
  void backward(std::int64_t rows);

  // Linear + relu/gelu pairs run the activation as the GEMM epilogue (on by default; see
  // layers.h). Off: every layer runs its own kernel, as the non-finite replay does.
  void set_epilogue_fusion(bool on);
  std::int64_t fused_pairs() const;
  // Hands the amaxes of this step's delayed-scaling FP8 casts to the precision policy; call once
  // per step before PrecisionPolicy::on_step_end (it reads a device buffer per FP8 layer).
  void flush_operand_amaxes();

  // Re-runs forward, loss and backward on the current batch, checking every tensor as it is
  // written, and names the first one holding an inf or NaN ("forward fc2.output",
  // "loss", "backward fc1.weight.grad", "backward relu1 input gradient"); empty when all are
  // finite. Overwrites gradients: call it only for a step that will not be applied.
  std::string locate_first_nonfinite(std::int64_t rows, float grad_scale);

  // Gradient underflow, measured: replays the loss and backward of the last forward with every
  // activation gradient kept in FP32, and counts for each layer boundary the non-zero values that
  // would round to zero when stored (still multiplied by `grad_scale`) in the dtype the plan
  // stores them in. Overwrites parameter gradients; call it before the step's real backward.
  struct UnderflowCount {
    std::string tensor;  // "fc2 input gradient", "logits gradient"
    sdk::DType dtype;
    std::int64_t nonzero = 0, flushed = 0;
  };
  std::vector<UnderflowCount> measure_gradient_underflow(std::int64_t rows, float grad_scale);

  std::vector<ModelParameter*> parameters();
  std::int64_t parameter_count() const;
  std::int64_t max_rows() const { return max_rows_; }

 private:
  std::shared_ptr<sdk::DeviceBackend> backend_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::int64_t input_features_;
  std::int32_t classes_;
  std::int64_t max_rows_ = 0;
  Tensor input_, labels_, loss_, correct_;
  Tensor grad_a_, grad_b_;  // ping-pong buffers for activation gradients, any dtype
};

}  // namespace mixtrain::core
