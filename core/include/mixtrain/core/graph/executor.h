// Executor: runs a planned graph on its backend — forward, the loss, backward — over memory it
// allocates once from the memory plans, and lets clients watch each node as it runs.
//
// Contract
// - Built over a GraphPlan and its ops (both owned by the Model, which outlives it).
//   allocate(rows) places every activation and gradient buffer of a training step of up to
//   rows.train rows: the ops' outputs and the
//   gradients in their planned dtypes share one arena (plan_step_memory, graph/memory_plan.h), a
//   gradient reusing the bytes of activations the backward has read for the last time; with
//   `reserve_fp32_gradients` the all-FP32 pass's gradients are a buffer of it too, live between
//   the forward and the step's loss (else allocated when that pass runs). So a backward into the
//   planned gradients overwrites activations: a second backward needs a new forward, and the
//   all-FP32 pass must come between the forward and the step's own loss. A buffer
//   the backend refuses (out of memory) raises sdk::BackendError naming the buffer and its bytes,
//   the plans' predicted total for the batch (arenas, parameters, batch), what the backend held and
//   the device's memory, and how to need less (graph/allocation_error.h); nothing has run then. The
//   outputs an op writes only when it runs unfused (the non-finite replay) have their own arena
//   from their own plan (plan_deferred_outputs), allocated here too: running unfused allocates
//   nothing. memory() says what allocate() placed, in the bytes the backend counted (the memory
//   report's items). An op's step workspace (Layer::step_workspace_bytes, a convolution's) is a
//   buffer of the arena live at its pass's step; the executor binds it around that one call in
//   the placement's forward and in a backward into the planned gradients; the all-FP32 pass
//   (which runs before the loss, while the step arena's bytes hold activations) binds those its
//   own plan placed in its arena.
// - Evaluation (set_evaluating(true), which Model::set_mode calls): a forward and its loss
//   without a gradient, of up to rows.evaluation rows. When that is more than rows.train, the
//   evaluation has a placement of its own in the same arena, from a forward-only plan
//   (plan_forward_memory): the arena is the larger of the two plans, not a step's at the
//   evaluation's rows. Evaluation mode moves the ops' outputs and the chunked loss's blocks
//   there, and training mode moves them back to the same addresses, so a recorded step graph
//   stays valid; an output read after the mode changed is another placement's, so read it in the
//   mode that wrote it. rows.train = 0 plans no training step at all (a session that only
//   evaluates, predicts or samples). A pass of more rows than the placement in use holds, a
//   training pass with no step planned, and a gradient or backward in an evaluation's
//   placement are std::logic_error.
// - Tensors are addressed by TensorId for one pass's Extent (a batch of samples, or a decode step
//   of tokens): activation(t, e) and gradient(t, e, buffers) are [rows, cols] device views.
// - forward(e, visit) runs every computing node in forward order; `visit` (optional) sees each
//   node after its forward and returns false to stop the pass.
// - decode(start, tokens, states) runs one decode step of a sequence (Extent::decode_of(tokens),
//   the new tokens at positions [start, start + tokens)): every computing node's decode_forward
//   with its state states[i] (one per node, owned by the Decoder; null where a node keeps none).
//   It shares the activation memory with forward: a decode step may come between two training
//   steps, but not between a forward and its backward.
// - compute_loss enqueues softmax-cross-entropy of the logits against labels(rows), smoothed by
//   label_smoothing (sdk/backend_loss.h); with gradients it also writes the logits' gradient,
//   scaled by grad_scale. read_loss() waits.
// - The chunked loss (graph/chunked_loss.h): allocate(…, loss_chunk_rows > 0) makes the logits
//   node compute its output inside compute_loss, a block of rows at a time, when that node can
//   (loss_chunking() says whether, or why not) and the batch has more rows than one block. Then
//   forward() skips that node, compute_loss also runs its backward (its input gradients and its
//   parameters'), and backward() only reports it to the visitor and the gradient-ready hook. The
//   whole logits exist only when asked for: logits(e) runs the node (after a forward that skipped
//   it), and its output is allocated then, as a decode step does.
// - backward(e, buffers, last_micro_batch, visit) runs every node that needs a gradient in reverse
//   order, writing input gradients into `buffers` (the planned dtypes, or all FP32 for the
//   underflow measurement) and parameter gradients by their take_grad_beta() rule. A tensor
//   read once gets its reader's contribution directly; one read several times sums its
//   contributions in FP32 (the first overwrites; a later one is added by its op itself where the
//   op can, layer.h's can_accumulate_input_gradient, and the backward has no visitor, else
//   written apart, in the step arena's buffer planned for it, and added). `visit` sees each node
//   after its backward with
//   its input gradients as written. The gradient-ready hook runs for each trainable parameter
//   whose gradient is final after that node — only when last_micro_batch (a frozen one has none).
//   A recomputed output (model.recompute, memory_plan.h's plan_recomputation) is computed again,
//   by its op's forward into its recomputation buffer (the step arena's, or the all-FP32 pass's
//   in that pass's arena), just before the first backward that needs it (RecomputedOutput::
//   first_reader's), chains in forward order; its op's output is bound there until the backward
//   ends, however it ends, and then back where the forward writes it.
// - start_gradients() makes every parameter's next contribution overwrite (a new optimizer step).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/core/graph/chunked_loss.h"
#include "mixtrain/core/graph/graph_plan.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/liveness_plan.h"
#include "mixtrain/core/graph/memory_plan.h"
#include "mixtrain/core/graph/tensor.h"

namespace mixtrain::core {

struct LossValues {
  float loss = 0.0f;         // mean over rows, FP32
  std::int32_t correct = 0;  // labels the argmax matched (rows × labels_per_sample in all)
};

// What allocate() placed, in bytes as the backend counted them.
struct ExecutorMemory {
  std::size_t input = 0;             // the batch, its labels, the loss and the correct count
  std::size_t activations = 0;       // the step's arena: activations and their gradients
  std::size_t deferred_outputs = 0;  // the arena of outputs written only unfused
};

// Where one backward writes its input gradients: the step's arena in the planned dtypes, or an
// arena laid out for every gradient in FP32.
struct GradientBuffers {
  std::byte* base = nullptr;
  bool all_fp32 = false;
};

class Executor {
 public:
  using ForwardVisitor = std::function<bool(std::size_t node)>;
  using BackwardVisitor =
      std::function<bool(std::size_t node, std::span<const sdk::TensorView> input_grads)>;
  using GradientReadyHook = std::function<void(ModelParameter&)>;

  // The backend's facets, bound when the executor is made (bound_facets.h).
  const BoundFacets& facets() const { return facets_; }

  Executor(std::shared_ptr<sdk::DeviceBackend> backend, const GraphPlan& plan,
           std::vector<std::unique_ptr<Layer>>& ops);

  // The rows each pass is planned for (the contract): train 0, no training step.
  struct PassRows {
    std::int64_t train = 0;
    std::int64_t evaluation = 0;
  };
  // loss_pad_classes: the chunked loss's logits blocks padded to a multiple of it, where the
  // logits node can (Layer::set_loss_block_padding; ModelSpec::loss_pad_classes).
  void allocate(PassRows rows, bool reserve_fp32_gradients, std::int64_t loss_chunk_rows = 0,
                std::int64_t loss_pad_classes = 0);
  // Both passes of up to max_rows rows in the training step's placement.
  void allocate(std::int64_t max_rows, bool reserve_fp32_gradients,
                std::int64_t loss_chunk_rows = 0) {
    allocate(PassRows{max_rows, max_rows}, reserve_fp32_gradients, loss_chunk_rows);
  }
  // Evaluation mode's placement (the contract); off after allocate().
  void set_evaluating(bool on);
  // The rows of the placement in use: what one pass may hold now.
  std::int64_t placed_rows() const;
  // The chunked loss as allocate() decided it: rows per block (0: the logits are computed whole),
  // and why not when blocks were asked for and the logits node cannot compute them ("" else).
  struct LossChunking {
    std::int64_t rows = 0;
    std::string refusal;
    // A block's logits columns: the classes, or more where they are padded (loss_pad_classes).
    std::int64_t columns = 0;
    std::int64_t classes = 0;
  };
  const LossChunking& loss_chunking() const { return chunking_; }
  // The most rows of any pass: what the input batch holds.
  std::int64_t max_rows() const { return max_rows_; }
  ExecutorMemory memory() const;

  sdk::TensorView input(std::int64_t rows) const { return input_.rows(rows); }
  sdk::TensorView labels(std::int64_t rows) const;  // [rows · labels_per_sample]
  sdk::TensorView activation(TensorId t, Extent e) const;
  sdk::TensorView gradient(TensorId t, Extent e, const GradientBuffers& buffers) const;
  sdk::TensorView loss_value() const { return loss_.view(); }

  GradientBuffers planned_gradients() const;
  // The all-FP32 gradients: their buffer in the step's arena when allocate() reserved it (live
  // from the forward's end to the step's loss: the pass runs between them), else `storage`
  // (allocated here, released by the caller when done). Either way apart from every activation
  // the backward reads, so the pass leaves them as they were.
  GradientBuffers fp32_gradients(Tensor& storage);

  void forward(Extent e, const ForwardVisitor& visit = {});
  void decode(std::int64_t start, std::int64_t tokens,
              std::span<const std::unique_ptr<DecodeState>> states);
  // The logits of the last forward (run now when that forward skipped their node).
  sdk::TensorView logits(Extent e);
  // `visit` sees the chunked loss's blocks (chunked_loss.h); it is not called otherwise.
  void compute_loss(std::int64_t rows, float grad_scale, float label_smoothing,
                    std::optional<GradientBuffers> gradients, const LossBlockVisitor& visit = {});
  LossValues read_loss();
  void backward(Extent e, const GradientBuffers& buffers, bool last_micro_batch,
                const BackwardVisitor& visit = {});
  void start_gradients();
  void set_gradient_ready_hook(GradientReadyHook hook) { grad_ready_ = std::move(hook); }
  bool has_gradient_ready_hook() const noexcept { return static_cast<bool>(grad_ready_); }

  // The step's one arena, and the activations and the gradients each as an arena of their own
  // would have placed them (for reports and tests).
  const StepMemoryPlan& step_plan() const { return step_plan_; }
  const LivenessPlan& activation_plan() const { return step_plan_.activations; }
  const LivenessPlan& gradient_plan() const { return step_plan_.gradients.planned; }
  // The evaluation's own forward-only plan; empty unless it holds more rows than the step.
  const ForwardMemoryPlan& evaluation_plan() const { return eval_plan_; }
  // A check of the plan's lives, for tests: while on, the step's passes (forward, the loss and
  // a backward into the planned gradients), and an evaluation's forward in its own placement,
  // fill each buffer of the placement in use with NaN (all ones) once its last planned read has
  // passed, so a read the plan did not list gives NaN instead of
  // a stale value. Off by default; it costs a fill per buffer.
  void set_poison_dead_buffers(bool on) { poison_ = on; }
  const DeferredOutputPlan& deferred_output_plan() const { return deferred_plan_; }

 private:
  const char* profile_scope(std::size_t node) const;
  LossChunking decide_loss_chunking(std::int64_t max_rows, std::int64_t asked) const;
  // Node i's inputs for a pass of extent e, into xs.
  void gather_inputs(std::size_t i, Extent e, std::vector<sdk::TensorView>& xs) const;
  sdk::TensorView scratch(std::size_t slot, sdk::DType dtype, std::int64_t rows, std::int64_t cols);
  // Where node's backward writes input's contribution apart: the buffer its plan gave it, in the
  // step arena (StepMemoryPlan::contribution) or in the all-FP32 pass's
  // (GradientPlan::fp32_contribution).
  sdk::TensorView contribution_buffer(std::size_t node, std::size_t input, sdk::DType dtype,
                                      const sdk::TensorView& gradient,
                                      const GradientBuffers& buffers);
  // Where a pass's tensors live for batches of up to `rows` rows: each node's planned output
  // (nullptr where none), where its deferred output goes when it runs unfused, and the chunked
  // loss's blocks.
  struct Placement {
    std::int64_t rows = 0;
    std::vector<std::byte*> output, unfused;
    // Each recomputed output's buffer for the backward (null: none; the evaluation's has none),
    // and where a recomputed sum of linears' linear writes its output running again unfused
    // (null: none, or its home, the sum's recomputation buffer; DeferredOutputPlan::rerun).
    std::vector<std::byte*> recompute, recompute_unfused;
    // Each node's step workspaces (empty: none); the evaluation's placement has no backward.
    std::vector<sdk::TensorView> forward_workspace, backward_workspace;
    std::int64_t block_rows = 0;
    sdk::TensorView block_logits, block_logits_grad;
  };
  // `unfused`: each deferred output's (node, address) where it is written unfused. The step
  // workspaces: indices into the plan's `lives` (kNoBuffer: none); `backward` may be null.
  struct PlannedWorkspaces {
    const std::vector<BufferLife>& lives;
    const std::vector<std::size_t>& forward;
    const std::vector<std::size_t>* backward;
    const std::vector<std::size_t>* recompute = nullptr;  // the recomputed outputs' buffers
  };
  // Before node `reader`'s backward into `buffers`: the outputs first read there recomputed
  // (StepMemoryPlan::recomputed), each op's output bound to its buffer.
  void recompute_for(std::size_t reader, Extent e, const GradientBuffers& buffers);
  // Every recomputed op's output bound back to the placement's (where the forward writes it).
  void unbind_recomputed();
  Placement place(std::int64_t rows, const LivenessPlan& arena_plan, std::size_t activation_buffers,
                  const std::vector<std::pair<std::size_t, std::byte*>>& unfused,
                  const PlannedWorkspaces& workspaces) const;
  const Placement& placed() const;  // the placement in use
  // Node `node`'s backward workspace for a backward into `buffers`: the step's, or the all-FP32
  // pass's in its own arena; empty where it has none.
  sdk::TensorView backward_workspace(std::size_t node, const GradientBuffers& buffers) const;
  bool evaluation_placed() const;  // the evaluation's placement is the one in use
  void bind_placement();           // hands the ops the placement in use
  const std::vector<BufferLife>& placed_lives() const;
  const LivenessPlan& placed_arena() const;
  // Throws std::logic_error when `pass` of `samples` rows (with a gradient or a backward when
  // `backward`) does not fit the placement in use (the contract).
  void check_pass(const char* pass, std::int64_t samples, bool backward) const;
  void bind_ties();
  // set_poison_dead_buffers: the buffers in order of their last step, and the pass's cursor.
  void plan_poisoning();
  void poison_through(int step);

  std::shared_ptr<sdk::DeviceBackend> backend_;
  BoundFacets facets_;  // bound once, by the constructor: the loss and the step's kernels
  const GraphPlan& plan_;
  std::vector<std::unique_ptr<Layer>>& ops_;
  std::int64_t max_rows_ = 0;
  Tensor input_, labels_, loss_, correct_;
  LossChunking chunking_;
  std::size_t chunked_node_ = 0;  // the logits node, when chunking_.rows > 0
  LossBlockMemory blocks_;        // in the activation arena and loss_parts_ / correct_parts_
  Tensor loss_parts_, correct_parts_;
  std::int64_t last_loss_blocks_ = 0;  // blocks of the last compute_loss; 0: computed whole
  bool logits_stale_ = false;          // the last forward skipped the chunked logits node
  StepMemoryPlan step_plan_;
  // Per node: the entries of step_plan_.recomputed computed again before its backward, in
  // forward order (recompute_for runs at every backward node: no scan of them all there).
  std::vector<std::vector<std::size_t>> recompute_at_;
  ForwardMemoryPlan eval_plan_;  // empty unless the evaluation has more rows than the step
  Placement step_, evaluation_;  // rows 0: not planned
  bool evaluating_ = false;
  DeferredOutputPlan deferred_plan_;
  // The step's arena: activations, planned gradients and, when reserved, the all-FP32 ones.
  Tensor act_arena_, deferred_arena_;
  bool poison_ = false;
  std::vector<std::size_t> deaths_;
  std::size_t next_death_ = 0;
  bool fp32_reserved_ = false;
  std::vector<Tensor> scratch_;  // contributions no plan foresaw (none, when the walks agree)
  GradientReadyHook grad_ready_;
  // Per node: the trainable parameters whose gradient is final after its backward (their first
  // user in forward order is this node).
  std::vector<std::vector<ModelParameter*>> ready_after_;
};

}  // namespace mixtrain::core
