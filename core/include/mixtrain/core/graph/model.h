// Model: a graph of nodes (ops) ending in softmax-cross-entropy, with every buffer allocated once.
//
// Contract
// - Lifecycle: construct from a ModelSpec (op objects only) → set each op's precision →
//   allocate(max_rows) → init_parameters(seed) or load masters → refresh_working_copies().
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
//   ones add. Gradient buffers live in one arena placed by a liveness plan (graph/liveness_plan.h): a
//   buffer is live from its first contribution to its producer's backward.
// - Epilogue fusion is a graph rewrite: a linear whose output is read only by a relu/gelu runs it
//   as its GEMM epilogue (core/src/graph/ops/linear.h); a batchnorm2d read only by a relu applies it
//   inside the norm, forward and backward, and the relu node becomes a view of its output.
// - Images: conv2d, batchnorm2d and pooling keep their outputs channels-last (ops/op_registry.h,
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
// - State: buffers() lists every op's non-trainable FP32 buffers; set_mode() puts every op in
//   training or evaluation mode (training after construction).
// - Spec errors (unknown op, bad sizes or shapes, duplicate names, dangling inputs, cycles, the
//   last node not producing `classes` outputs, a tie to a missing parameter or of another shape)
//   raise sdk::ConfigError at the node's file:line:col.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/liveness_plan.h"
#include "mixtrain/core/graph/tensor.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

struct LayerSpec {
  std::string type;  // an op of core/src/graph/ops/op_registry.cpp: linear, relu, add, reshape, ...
  std::string name;  // defaults to "<type><index>"
  sdk::SourceLocation where;
  std::string table;  // the config entry, for messages ("model.blocks.res.nodes[1]"); empty:
                      // "model.nodes[i]" / "model.layers[i]" by position
  std::vector<std::string> inputs;  // graph form: node names or "input"; sequential form: empty
  std::vector<std::int64_t> shape;  // reshape only: per-sample shape, one entry may be -1
  // The op's own options ("out", "bias", "eps"), validated against its schema when the model
  // is built (and by the config before that, with file:line:col).
  std::vector<sdk::RawOption> options;
};

// A node's options resolved against its op's schema (defaults filled in). Throws sdk::ConfigError
// at the node's line for an unknown type, an unknown key or a value out of range.
sdk::Options layer_options(const LayerSpec& layer, const std::string& table = "model.layers");

inline constexpr const char* kGraphInput = "input";

struct ModelSpec {
  std::vector<LayerSpec> layers;  // the nodes, in declaration order
  bool graph = false;             // true: each node names its inputs (model.nodes)
  std::string loss = "softmax_cross_entropy";
  bool fuse_epilogues = true;  // Linear + relu/gelu as one GEMM with an activation epilogue
  sdk::SourceLocation where;
};

// What the data feeds the model besides the feature count and the classes.
struct InputSpec {
  sdk::DType dtype = sdk::DType::fp32;  // fp32 features or int32 token ids
  std::int64_t labels_per_sample = 1;
  // Images: the per-sample shape [C, H, W] (channels first, as the data holds them; the product
  // is the feature count). Ops that read images see the batch with this shape; the others see it
  // flattened to [C·H·W]. Empty: [features].
  std::vector<std::int64_t> sample_shape;
};

struct LossValues {
  float loss = 0.0f;         // mean over rows, FP32
  std::int32_t correct = 0;  // labels the argmax matched (rows × labels_per_sample in all)
};

class Model {
 public:
  Model(std::shared_ptr<sdk::DeviceBackend> backend, const ModelSpec& spec,
        std::int64_t input_features, std::int32_t classes, InputSpec input = {});

  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  std::int64_t input_features() const { return input_features_; }
  std::int32_t classes() const { return classes_; }
  sdk::DType input_dtype() const { return input_spec_.dtype; }
  std::int64_t labels_per_sample() const { return input_spec_.labels_per_sample; }

  // Checks the backend first (check_backend), then allocates every buffer once.
  void allocate(std::int64_t max_rows);
  // Asks the backend, before anything runs, for every facet op each node will call under its
  // precision plan, and for the loss; throws ConfigError at the first node it cannot run, naming
  // the node, the op, the dtypes and the backend, with the node's config location.
  void check_backend() const;
  void init_parameters(std::uint64_t seed);
  void refresh_working_copies();  // working = cast(master) for every parameter that has one

  sdk::TensorView input(std::int64_t rows) const { return input_.rows(rows); }
  sdk::TensorView labels(std::int64_t rows) const;  // [rows · labels_per_sample]
  sdk::TensorView logits(std::int64_t rows) const {
    return activation(static_cast<int>(layers_.size()) - 1, rows);
  }

  void forward(std::int64_t rows);
  // Enqueues the loss (and, with_grad, the scaled gradient of the logits) without waiting for it.
  void compute_loss(std::int64_t rows, float grad_scale, bool with_grad);
  // Reads back the last computed loss and correct count (waits for the device).
  LossValues read_loss();
  // The last computed loss on the device (fp32 [1]), for sums that stay there.
  sdk::TensorView loss_value() const { return loss_.view(); }
  // compute_loss, then read_loss.
  LossValues loss(std::int64_t rows, float grad_scale, bool with_grad);
  void backward(std::int64_t rows);

  // Linear + relu/gelu pairs run the activation as the GEMM epilogue (on by default; see
  // core/src/graph/ops/linear.h). Off: every layer runs its own kernel, as the non-finite replay does.
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
  // stores them in. Overwrites parameter gradients; call it before the first micro-batch's
  // backward.
  struct UnderflowCount {
    std::string tensor;  // "fc2 input gradient", "logits gradient"
    sdk::DType dtype;
    std::int64_t nonzero = 0, flushed = 0;
  };
  std::vector<UnderflowCount> measure_gradient_underflow(std::int64_t rows, float grad_scale);
  // Call before allocate() when measure_gradient_underflow() will run: the gradient arena is then
  // sized for the FP32 pass too, which reuses it instead of allocating a second arena per call.
  void reserve_fp32_gradient_pass() { reserve_fp32_pass_ = true; }

  // Every parameter once, in forward order of their owners; tied users do not repeat it.
  std::vector<ModelParameter*> parameters();
  std::int64_t parameter_count() const;
  // Every op's buffers, in forward order.
  std::vector<ModelBuffer*> buffers();

  enum class Mode { train, eval };
  void set_mode(Mode mode);
  Mode mode() const { return mode_; }

  // Before each micro-batch's forward: index in [0, count). Index 0 starts the optimizer step's
  // gradients afresh; the gradient-ready hook fires in the backward of index count - 1. A
  // backward() without it is a step of one micro-batch (its gradients overwrite).
  void begin_micro_batch(std::int64_t index, std::int64_t count);
  std::int64_t max_rows() const { return max_rows_; }

  // Decoding one sequence of a language model with a KV cache (`mixtrain sample`): every node
  // must be per position (rows_per_sample = T, no op mixing positions but attention), so a
  // forward can run on just the new tokens. begin_decode(capacity <= T) puts the model in
  // evaluation mode and the ops in decode mode; decode(ids) feeds the next ids (at most
  // max_rows() · T at once, positions continuing from the last call) and returns the logits of
  // the last one, fp32 [classes] on the host; end_decode() returns to training layout (the mode
  // stays eval). Throws sdk::UserError when the model cannot decode or the cache is full.
  void begin_decode(std::int64_t capacity);
  std::vector<float> decode(std::span<const std::int32_t> ids);
  void end_decode();
  std::int64_t decode_length() const { return decode_length_; }

  // Runs for each parameter when backward has written its final gradient for the step.
  void set_gradient_ready_hook(std::function<void(ModelParameter&)> hook) {
    grad_ready_ = std::move(hook);
  }
  // The inputs of layers()[i] (indices into layers(), -1 for the batch) and its per-sample shape.
  const std::vector<int>& node_inputs(std::size_t i) const { return nodes_[i].inputs; }
  const std::vector<std::int64_t>& node_shape(std::size_t i) const { return nodes_[i].shape; }
  // Whether layers()[i]'s output is a channels-last image (ops/op_registry.h: TensorLayout).
  bool node_channels_last(std::size_t i) const { return nodes_[i].channels_last; }
  const std::vector<std::int64_t>& input_sample_shape() const { return input_spec_.sample_shape; }
  // Where the layers' outputs live for `max_rows` batch rows: their liveness over one forward,
  // loss and backward, under the current precision plan (what allocate() uses; callable before
  // it). `as_dtype` sizes every output in that dtype instead (what fp32 would take).
  LivenessPlan plan_activations(std::int64_t max_rows,
                                std::optional<sdk::DType> as_dtype = std::nullopt) const;
  std::size_t activation_arena_bytes() const { return act_plan_.arena_bytes; }
  std::size_t activation_sum_bytes() const { return act_plan_.sum_bytes; }
  // Bytes of the gradient arena and what it would take without reuse (after allocate()).
  std::size_t gradient_arena_bytes() const { return grad_plan_.arena_bytes; }
  std::size_t gradient_sum_bytes() const { return grad_plan_.sum_bytes; }

 private:
  struct Node {
    std::vector<int> inputs;           // tensor ids: -1 the batch, else a node (layers_ index)
    std::vector<std::int64_t> shape;   // per-sample output shape
    std::int64_t rows_per_sample = 1;  // product of shape[0..k-2]
    bool channels_last = false;        // an image stored [H, W, C] per sample
    int root = 0;               // the node whose memory this output is (itself unless a view)
    bool needs_grad = false;    // some parameter lies upstream (or here)
    sdk::SourceLocation where;  // the node's table in the config, for plan-time errors
    std::string key;            // "model.nodes[3]"
  };
  // Gradient bookkeeping per root tensor.
  struct GradSlot {
    int reads = 0;  // contributions per backward
    sdk::DType dtype = sdk::DType::fp32;
    std::size_t offset = 0;       // in grad_arena_
    std::size_t offset_fp32 = 0;  // in the FP32 pass's arena (the same one when reserved)
  };
  std::int64_t rows_of(int tensor, std::int64_t batch) const;
  std::int64_t features_of(int tensor) const;
  sdk::TensorView activation(int tensor, std::int64_t batch) const;
  sdk::TensorView gradient(int tensor, std::int64_t batch) const;  // of the tensor's root
  sdk::DType contribution_dtype(std::size_t reader) const;
  sdk::DType logits_grad_dtype() const;  // what the loss stores the logits' gradient in
  void plan_gradients();
  // One backward pass. all_fp32: every gradient in FP32 (underflow measurement); `visit` sees each
  // node after its backward with its input gradients (as stored) and returns false to stop.
  using BackwardVisit = std::function<bool(std::size_t node, std::span<const sdk::TensorView> dxs)>;
  void run_backward(std::int64_t batch, bool all_fp32, const BackwardVisit& visit);
  // The ProfileScope of a node: its op type, "classifier" for the logits node.
  const char* profile_scope(std::size_t node) const;
  // One forward pass; `visit` sees each computing node after its forward, false stops.
  void run_forward(std::int64_t batch, const std::function<bool(std::size_t node)>& visit);
  sdk::TensorView scratch(std::size_t slot, sdk::DType dtype, std::int64_t rows, std::int64_t cols);

  std::shared_ptr<sdk::DeviceBackend> backend_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Node> nodes_;
  std::int64_t input_features_;
  std::int32_t classes_;
  InputSpec input_spec_;
  std::int64_t max_rows_ = 0;
  Tensor input_, labels_, loss_, correct_;
  std::vector<GradSlot> grad_slots_;  // per node (used at roots that need a gradient)
  LivenessPlan grad_plan_, grad_plan_fp32_, act_plan_;
  Tensor act_arena_;
  Tensor grad_arena_;  // bytes, every gradient buffer at its planned offset
  bool reserve_fp32_pass_ = false;
  bool fp32_pass_ = false;       // measure_gradient_underflow: every gradient in FP32
  Tensor fp32_arena_;            // that pass's arena, when grad_arena_ was not sized for it
  std::vector<Tensor> scratch_;  // contributions that need a cast or an add
  std::function<void(ModelParameter&)> grad_ready_;
  // Weight tying, resolved at construction: node `user` takes `suffix` from parameter `source`.
  struct Tie {
    std::size_t user;
    std::string suffix, source;
  };
  std::vector<Tie> ties_;
  void bind_ties();  // after the layers allocate their own parameters
  // Per node: the parameters whose gradient is final after its backward (their first user in
  // forward order is this node).
  std::vector<std::vector<ModelParameter*>> ready_after_;
  bool final_micro_batch_ = true;
  bool micro_batch_open_ = false;  // begin_micro_batch() ran since the last backward()
  Mode mode_ = Mode::train;
  std::int64_t decode_rows_ = 0;  // > 0 while decoding: the rows of every tensor in this forward
  std::int64_t decode_capacity_ = 0, decode_length_ = 0;
  void start_gradients();  // every parameter's next contribution overwrites
};

}  // namespace mixtrain::core
