// Model: a graph of nodes (ops) ending in softmax-cross-entropy, with every buffer allocated once.
// It owns the three parts it is made of (docs/architecture.md, "The graph and its plans"):
// the immutable GraphPlan (graph_plan.h), the memory plans (memory_plan.h) and the Executor
// (executor.h) that runs them; decoding (decoder.h) and the step diagnostics (diagnostics.h) are
// clients of the executor.
//
// Contract
// - Lifecycle: construct from a ModelSpec (op objects only) → set each op's precision →
//   allocate(max_rows) → init_parameters(seed), then a checkpoint's load where there is one →
//   refresh_working_copies().
// - The graph: each node reads named inputs (other nodes, or "input", the batch [N, F]) and has an
//   N-d output, batch first; shapes below are per sample, without the batch dimension. Ops that
//   work on the last dimension (linear, relu, gelu, layernorm, add) see an output [N, d1..dk] as
//   [N*d1*..*d(k-1), dk] rows. In the sequential form (`layers`) each node reads the one before.
//   layers() lists the nodes in forward order (inputs first, then declaration order).
// - The batch: [N, F] fp32 features, or [N, T] int32 token ids (InputSpec; only ops that read
//   ids, the embedding, may take them). Labels are int32, `labels_per_sample` per sample: 1 for
//   a classifier, T next-token targets for a language model.
// - Exactly one node is read by no other: the logits, per-sample shape [classes], or [T, classes]
//   for a language model (one prediction per position; labels_per_sample = T).
// - Gradients: every tensor that needs one has its own buffer. A tensor read once gets its
//   reader's activation_grad dtype (the chain's behaviour, bit for bit); a tensor read by several
//   nodes (a residual, add(h, h)) keeps an FP32 gradient: the first contribution overwrites, later
//   ones add. Gradient buffers live in one arena placed by a liveness plan (memory_plan.h): a
//   buffer is live from its first contribution to its producer's backward.
// - Epilogue fusion is a graph rewrite: a linear whose output is read only by a relu/gelu runs it
//   as its GEMM epilogue (core/src/graph/ops/linear.h); a batchnorm2d read only by a relu applies
//   it inside the norm, forward and backward, and the relu node becomes a view of its output.
// - Images: conv2d, batchnorm2d and pooling keep their outputs channels-last
// (graph/ops/op_registry.h,
//   TensorLayout), element-wise ops keep their input's layout, a flatten or reshape of a
//   channels-last image permutes it back to PyTorch's order, and any other op reading one is a
//   plan-time error naming the node.
// - Each step: write the batch into input(rows) / labels(rows) (device views), forward(rows),
//   loss(rows, grad_scale, with_grad), backward(rows). `grad_scale` (the loss scale) multiplies the
//   gradient seed. A hook, when set, runs for each parameter as soon as its gradient is final in
//   backward (data-parallel bucketing hangs off it).
// - Gradient accumulation: begin_micro_batch(k, K) before each micro-batch's forward. k = 0
//   opens an optimizer step: every parameter gradient is logically zeroed (its next contribution
//   overwrites, bit for bit what a single micro-batch computes); later micro-batches and the
//   second user of a tied parameter add to it. The gradient-ready hook fires on the last one only.
// - Shared parameters: a node may use another node's parameter (a linear's tie_weight). The
//   parameter appears once in parameters() (its owner's), both users accumulate into its one FP32
//   gradient, and the hook fires after its last user's backward.
// - Freezing: ModelSpec::freeze names parameters that do not train (graph/freezing.h). They get
//   no gradient, so a node needs one only when a trainable parameter lies upstream or here, and
//   the gradient-ready hook never fires for them.
// - State: buffers() lists every op's non-trainable FP32 buffers; set_mode() puts every op in
//   training or evaluation mode (training after construction), and the executor in that mode's
//   memory placement: read an output in the mode whose pass wrote it.
// - Spec errors (unknown op, bad sizes or shapes, duplicate names, dangling inputs, cycles, the
//   last node not producing `classes` outputs, a tie to a missing parameter or of another shape)
//   raise sdk::ConfigError at the node's file:line:col.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/graph/executor.h"
#include "mixtrain/core/graph/graph_plan.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/model_spec.h"
#include "mixtrain/core/graph/tensor.h"

namespace mixtrain::core {

class OperandStaging;  // graph/ops/operand_scaler.h

// ModelSpec::loss_pad_classes when unset: kLossPadClasses on a backend that declares
// sdk::kFeatureGemmWantsAlignedRows for a class count that is not a multiple of 8, else 0.
std::int64_t default_loss_pad_classes(const sdk::DeviceBackend& backend, std::int64_t classes);
// ModelSpec::loss_chunk_rows when unset: 0 below kLossChunkClasses classes, else
// kLossChunkRowsFewRows on a backend that declares sdk::kFeatureGemmFullRateAtFewRows and
// kLossChunkRows on any other.
std::int64_t default_loss_chunk_rows(const sdk::DeviceBackend& backend, std::int64_t classes);

class Model {
 public:
  Model(std::shared_ptr<sdk::DeviceBackend> backend, const ModelSpec& spec,
        std::int64_t input_features, std::int32_t classes, InputSpec input = {});
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  std::vector<std::unique_ptr<Layer>>& layers() { return ops_; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return ops_; }
  const GraphPlan& plan() const { return plan_; }
  Executor& executor() { return executor_; }
  sdk::DeviceBackend& backend() { return *backend_; }
  // The backend's facets, bound once when the model was made: the step's kernels go through them.
  const BoundFacets& facets() const { return executor_.facets(); }
  const std::shared_ptr<sdk::DeviceBackend>& backend_ptr() const { return backend_; }
  std::int64_t input_features() const { return plan_.input_features(); }
  std::int32_t classes() const { return plan_.classes(); }
  sdk::DType input_dtype() const { return plan_.input().dtype; }
  std::int64_t labels_per_sample() const { return plan_.input().labels_per_sample; }

  // Checks the backend first (check_backend), then allocates every buffer once. With
  // reserve_fp32_gradients the all-FP32 pass of measure_gradient_underflow (diagnostics.h) gets
  // its gradient arena up front, and reuses it.
  void allocate(std::int64_t max_rows, bool reserve_fp32_gradients = false) {
    allocate(Executor::PassRows{max_rows, max_rows}, reserve_fp32_gradients);
  }
  // A training step of up to rows.train rows and an evaluation of up to rows.evaluation: an
  // evaluation of more rows than the step gets a forward-only placement of its own, which
  // evaluation mode uses (Executor's contract); rows.train = 0 plans no training at all, and
  // gives the parameters no gradient tensors.
  void allocate(Executor::PassRows rows, bool reserve_fp32_gradients = false);
  // The chunked loss's block (ModelSpec::loss_chunk_rows unless set here, before allocate(); 0
  // computes the logits whole), and what allocate() decided (Executor::loss_chunking()).
  void set_loss_chunk_rows(std::int64_t rows) { loss_chunk_rows_ = rows; }
  const Executor::LossChunking& loss_chunking() const { return executor_.loss_chunking(); }
  // Asks the backend, before anything runs, for every facet op each node will call under its
  // precision plan, and for the loss; throws ConfigError at the first node it cannot run, naming
  // the node, the op, the dtypes and the backend, with the node's config location.
  void check_backend() const;
  // Every op's initial parameters and buffers from `seed` (each parameter's draw is seeded by its
  // own name, so skipping one moves no other). `filled_by_load` names the parameters a checkpoint's
  // load overwrites before the model is used (a resume's, init_from's, eval's): they are zeroed
  // rather than drawn (GPT-2 small's 124 M normals were half of `mixtrain sample`'s start on 2
  // cores, bench/RESULTS.md). A caller that skips a draw and then does not load leaves zeros.
  void init_parameters(std::uint64_t seed,
                       const std::function<bool(const ModelParameter&)>& filled_by_load = {});
  void refresh_working_copies();  // working = cast(master) for every parameter that has one

  sdk::TensorView input(std::int64_t rows) const { return executor_.input(rows); }
  sdk::TensorView labels(std::int64_t rows) const { return executor_.labels(rows); }
  // The last forward's logits, computed now when the chunked loss left them out of it.
  sdk::TensorView logits(std::int64_t rows) { return executor_.logits(Extent::batch_of(rows)); }

  // `visit` (optional) sees each node as it runs (Executor::forward / backward).
  void forward(std::int64_t rows, const Executor::ForwardVisitor& visit = {}) {
    executor_.forward(Extent::batch_of(rows), visit);
  }
  // Enqueues the training objective — the loss with the spec's label smoothing — (and, with_grad,
  // the scaled gradient of the logits) without waiting for it.
  void compute_loss(std::int64_t rows, float grad_scale, bool with_grad);
  // Reads back the last computed loss and correct count (waits for the device).
  LossValues read_loss() { return executor_.read_loss(); }
  // The last computed loss on the device (fp32 [1]), for sums that stay there.
  sdk::TensorView loss_value() const { return executor_.loss_value(); }
  // compute_loss, then read_loss.
  LossValues loss(std::int64_t rows, float grad_scale, bool with_grad);
  // Evaluation's loss: plain cross-entropy whatever the label smoothing, no gradient; waits.
  LossValues evaluation_loss(std::int64_t rows);
  // ModelSpec::label_smoothing: what the training objective (and a replay of it) uses.
  float label_smoothing() const { return label_smoothing_; }
  void backward(std::int64_t rows, const Executor::BackwardVisitor& visit = {});

  // Linear + relu/gelu pairs run the activation as the GEMM epilogue (on by default; see
  // core/src/graph/ops/linear.h). Off: every layer runs its own kernel, as the non-finite replay
  // does.
  void set_epilogue_fusion(bool on);
  // The last setting: ModelSpec::fuse_epilogues (which the plan gives every op) until then.
  bool epilogue_fusion() const { return epilogue_fusion_; }
  std::int64_t fused_pairs() const;
  // Hands the amaxes of this step's delayed-scaling FP8 casts to the precision policy; call once
  // per step before PrecisionPolicy::on_step_end. Every FP8 layer's amaxes live in one device
  // table that allocate() binds: one read for all of them, none when no cast is pending.
  // `reduce`, when given, sees every pending amax of the step in one buffer first and may change
  // them (data parallel: the max over the ranks, so every rank's scales stay the same).
  void flush_operand_amaxes(const std::function<void(std::span<float>)>& reduce = {});

  // Every parameter once, in forward order of their owners; tied users do not repeat it.
  std::vector<ModelParameter*> parameters();
  // The same, less the frozen ones (graph/freezing.h): what the optimizer updates.
  std::vector<ModelParameter*> trainable_parameters();
  std::int64_t parameter_count() const;
  // Every op's buffers, in forward order.
  std::vector<ModelBuffer*> buffers();

  enum class Mode { train, eval };
  void set_mode(Mode mode);
  Mode mode() const { return mode_; }

  // Before each micro-batch's forward: index in [0, count). Index 0 starts the optimizer step's
  // gradients afresh; the gradient-ready hook fires in the backward of index count - 1. A
  // backward() without it is a step of one micro-batch (its gradients overwrite). `step` is the
  // optimizer step the micro-batch belongs to (the trainer's count, restored on resume): random
  // ops draw from it, so a replay of the step draws the same and the next step anew. Each
  // data-parallel replica (its rank) computes `samples` of the micro-batch's global batch:
  // dropout keys its masks by global sample (a sample's mask does not depend on the rank count),
  // stochastic rounding by the draw replica · count + index (each replica its own bits).
  // Replica 0 with samples from 0 draws what one process draws.
  void begin_micro_batch(std::int64_t index, std::int64_t count, std::int64_t step = 0,
                         std::int64_t replica = 0, SampleRange samples = {});
  // The most rows of any pass (the input batch's).
  std::int64_t max_rows() const { return executor_.max_rows(); }

  // Runs for each parameter when backward has written its final gradient for the step.
  void set_gradient_ready_hook(std::function<void(ModelParameter&)> hook) {
    executor_.set_gradient_ready_hook(std::move(hook));
  }
  // A host callback runs during backward: a recorded step graph would skip it (train/step_graph.h).
  bool has_gradient_ready_hook() const noexcept { return executor_.has_gradient_ready_hook(); }
  // Where the layers' outputs live for `max_rows` batch rows: their liveness over one forward,
  // loss and backward, under the current precision plan (what allocate() uses; callable before
  // it). `as_dtype` sizes every output in that dtype instead (what fp32 would take).
  LivenessPlan plan_activations(std::int64_t max_rows,
                                std::optional<sdk::DType> as_dtype = std::nullopt) const;
  // The arenas allocate() placed: their bytes, and what they would take without reuse.
  const LivenessPlan& activation_plan() const { return executor_.activation_plan(); }
  const LivenessPlan& gradient_plan() const { return executor_.gradient_plan(); }

 private:
  std::shared_ptr<sdk::DeviceBackend> backend_;
  std::vector<std::unique_ptr<Layer>> ops_;
  GraphPlan plan_;
  Executor executor_;
  Mode mode_ = Mode::train;
  float label_smoothing_ = 0.0f;
  bool epilogue_fusion_ = true;  // ModelSpec::fuse_epilogues, then set_epilogue_fusion()
  std::int64_t loss_chunk_rows_ = 0;
  // ModelSpec::loss_pad_classes, or default_loss_pad_classes() when unset; 0 with label smoothing.
  std::int64_t loss_pad_classes_ = 0;
  // fp32 [3 per op with an FP8 operand scaler]: their delayed-scaling amaxes, read at once;
  // scalers_[i] holds slice i.
  Tensor operand_amaxes_;
  // The buffer every FP8 scaler shares for its transient operand layouts (operand_scaler.h).
  std::shared_ptr<OperandStaging> operand_staging_;
  std::vector<OperandScaler*> scalers_;
  void bind_operand_amaxes();
  // The micro-batch begin_micro_batch() opened, until its backward.
  struct MicroBatch {
    bool last = true;
  };
  std::optional<MicroBatch> open_micro_batch_;
};

}  // namespace mixtrain::core
