// The memory plans of a model graph: where every activation and every gradient buffer lives for
// batches of up to max_rows samples, as liveness plans over one forward, loss and backward.
// The executor allocates what these plan; `mixtrain check` reports them.
//
// Contract
// - Schedule: the forward of the node at position p is step p, the loss step n, its backward
//   step 2n - p. An output lives from its forward to its last read (a forward read, the backward
//   of a reader that keeps its inputs, its own backward when that reads it, the loss for the
//   logits). A node that needs no gradient runs no backward, so it reads nothing there: a frozen
//   prefix's activations live through their forward reads only. Views and deferred outputs take
//   no activation bytes.
// - Gradients: one buffer per root tensor that needs one, written first at the backward of its
//   last reader and read last at its producer's backward. A tensor read once gets its reader's
//   activation_grad dtype; one read several times keeps an FP32 gradient, or, with
//   GraphPlan::fp32_gradient_sums() false (model.fp32_gradient_sums), the one dtype all its
//   contributions come in (a pass-through op contributes its output gradient's dtype), FP32 where
//   they differ: PyTorch AMP's bf16 sums, half the bytes, rounded at each add. A pass-through op
//   (add) lends its output gradient's buffer to one input read by it alone in the same dtype, so a
//   chain of adds shares one buffer. The same lives are also planned all in FP32 (the underflow
//   measurement's pass).
// - Deferred outputs: an op that writes no output while it runs fused (a linear whose relu is its
//   epilogue, a batch norm an add runs) writes one when it runs unfused, as the non-finite replay
//   does. Those outputs have a
//   liveness plan of their own, over the same schedule, beside the activation plan: reserved up
//   front, so the replay allocates nothing, and left out of the activation plan, which is what a
//   fused step uses (and `mixtrain check` reports). A deferred output whose op says
//   output_in_reader goes, instead, into its one reader's output when that is the same bytes:
//   the reader's output then lives from the op's forward on, and the replay needs no buffer of
//   its own for it (output_home).
// - An output written by its input's producer (output_written_by_input: the layer norm an add
//   runs in its pass, the activation a linear runs as its epilogue) lives from that producer's
//   forward, so nothing the producer still reads shares its bytes. An op whose forward its reader
//   runs (forward_in_reader: the batch norm of BN + add) reads its inputs at that reader's step,
//   and the chunked logits node its input at the loss's.
// - The chunked loss (graph/chunked_loss.h): when the logits node computes its output in blocks
//   of rows inside the loss (Layer::loss_chunk_rows() > 0), its output takes no bytes, the logits
//   need no gradient buffer, its input gradients are written at the loss step, and the activation
//   plan ends with two buffers live at the loss step only: one block of logits and one of their
//   gradient, in that order.
// - The step (plan_step_memory) places both in one arena, with the recomputed outputs' buffers.
//   Its lives must be the reads the ops make: a backward that read an activation past its
//   declared last read would read a gradient written over it. Executor::set_poison_dead_buffers
//   fills every buffer whose life ended with NaN, so such a read shows
//   (tests/unit/core/graph/test_step_arena.cpp).
// - Step workspaces (Layer::step_workspace_bytes: a convolution's scratch): each op's
//   forward workspace lives at its forward's step only, its backward workspace at its backward's
//   step only, so it takes bytes that nothing else holds then (ResNet-50's stem wants 103 MB at
//   step 0, where the arena holds little). An op whose pass runs at another step (a forward run
//   by its reader or by the chunked loss) gets none for that pass. The all-FP32 pass's backward
//   workspaces are planned in that pass's own arena (GradientPlan::fp32_workspace), each at its
//   backward step there: that pass runs while the step's activations are live.
// - Recomputation (model.recompute, Layer::recomputes_output): an output that a backward reads
//   (a reader's that runs a backward of its own, not the chunked logits node's; its own, when it
//   reads its output) is not kept for it. Its life ends at its last forward read; the executor
//   runs the op's forward again just before the first backward that needs it, into a buffer of
//   its own that lives until the last. A recomputed reader needs it too, at its own
//   recomputation: so a chain (a block's layer norm, QKV projection and attention) is recomputed
//   at one step, in forward order, from the inputs that are kept, which live until then. The
//   all-FP32 pass recomputes too, into its own arena (GradientPlan::fp32_recompute), since it runs
//   while every activation is live. A sum of linears whose linears recompute is recomputed with
//   them (Layer::recomputed_with_its_inputs): while it runs their GEMMs, their forwards run again
//   first and their inputs are read at its recomputation. Not recomputed (kept): a view, a
//   deferred output, an op whose forward its reader runs, and one that runs another op in its
//   pass (Layer::forward_writes_only_its_output).
// - Pure functions of the plan and the ops' precision; they allocate nothing. The ops' workspace
//   answers may ask the backend (which may build a plan for a shape, not allocate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "mixtrain/core/graph/graph_plan.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/liveness_plan.h"

namespace mixtrain::core {

using Ops = std::vector<std::unique_ptr<Layer>>;

inline constexpr std::size_t kNoBuffer = static_cast<std::size_t>(-1);

// The dtype a node's backward writes its input gradients in.
sdk::DType contribution_dtype(const Ops& ops, std::size_t reader);
// What the loss stores the logits' gradient in: the logits' own activation dtype (fp32 when the
// logits are a view of the batch, which needs no gradient).
sdk::DType logits_grad_dtype(const GraphPlan& plan, const Ops& ops);
// The storage dtype of a tensor's activation (the batch's is the input dtype).
sdk::DType activation_dtype(const GraphPlan& plan, const Ops& ops, TensorId t);

// The logits node computing in blocks, and the rows of one block; rows 0 when the logits are
// computed whole.
struct ChunkedLogits {
  std::size_t node = 0;
  std::int64_t rows = 0;
};
ChunkedLogits chunked_logits(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows);

// An output computed again for the backward (the contract's recomputation): node `node`'s, run
// just before the backward of first_reader and kept until the backward of last_reader (positions;
// first_reader >= last_reader; either may be the node itself, or a recomputed reader's
// first_reader). `inputs_run`: its inputs whose forwards it runs (forward_in_reader: a sum of
// linears' two linears), in position order; their forwards run again first, and what they read
// is read at this recomputation.
struct RecomputedOutput {
  std::size_t node = 0;
  std::size_t first_reader = 0;
  std::size_t last_reader = 0;
  std::vector<std::size_t> inputs_run;
};
// Every such output, in forward order.
std::vector<RecomputedOutput> plan_recomputation(const GraphPlan& plan, const Ops& ops);

// `as_dtype` sizes every output in that dtype instead of its planned one.
LivenessPlan plan_activations(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                              std::optional<sdk::DType> as_dtype = std::nullopt);

// An evaluation's arena: the activations of a forward alone and its loss, for batches of up to
// max_rows rows, over the same schedule. Nothing is kept for a backward, so an output lives
// from its forward to its last forward read (the loss, for the logits), and an evaluation of
// more rows than the training step may fit in the bytes that step's gradients take
// (Executor::allocate). The buffers in plan_activations' order, the chunked loss's two blocks
// last of those; then the deferred outputs without a home in their reader's output
// (plan_deferred_outputs' nodes), which an op whose fused pass falls back at run time (a batch
// norm whose add reads another dtype) writes in an evaluation too.
struct ForwardMemoryPlan {
  std::vector<BufferLife> lives;
  std::size_t activation_buffers = 0;  // lives[0, activation_buffers): the activations
  std::vector<std::size_t> deferred;   // lives[activation_buffers + d]: node deferred[d]'s
  // Node i's forward workspace, an index into `lives` after the deferred outputs; kNoBuffer
  // where it has none.
  std::vector<std::size_t> forward_workspace;
  LivenessPlan arena;
};
ForwardMemoryPlan plan_forward_memory(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows);

// The node whose output memory node i's deferred output uses when it materialises: its one
// reader, when i's op says output_in_reader and the reader's output is a planned buffer of the
// same bytes; nullopt otherwise (the deferred-output plan holds it).
std::optional<std::size_t> output_home(const GraphPlan& plan, const Ops& ops, std::size_t i,
                                       std::int64_t max_rows);

// `nodes`: the ops' forward positions, one per buffer of `plan`, in order. Then `rerun`'s: a
// recomputed sum of linears' linear that has no home runs again unfused (the replay) into a
// buffer of its own that lives at that recomputation's step alone, not into its forward's.
struct DeferredOutputPlan {
  std::vector<std::size_t> nodes;
  std::vector<std::size_t> rerun;
  LivenessPlan plan;
};

DeferredOutputPlan plan_deferred_outputs(const GraphPlan& plan, const Ops& ops,
                                         std::int64_t max_rows);

struct GradientSlot {
  int reads = 0;  // contributions per backward; 0: the tensor needs no gradient buffer
  sdk::DType dtype = sdk::DType::fp32;
  std::size_t offset = 0;       // in the planned-dtype arena
  std::size_t offset_fp32 = 0;  // in the all-FP32 arena
};

// A workspace placed in an arena: its byte offset (kNoBuffer: none) and bytes.
struct PlacedWorkspace {
  std::size_t offset = kNoBuffer;
  std::size_t bytes = 0;
};

struct GradientPlan {
  std::vector<GradientSlot> slots;  // per node position (used at roots that need a gradient)
  LivenessPlan planned, fp32;
  // Each node's backward workspace in the all-FP32 pass (Layer::WorkspaceAsk::fp32_gradients),
  // in that pass's arena, live at the node's backward step of it.
  std::vector<PlacedWorkspace> fp32_workspace;
  // Each recomputed output's buffer in the all-FP32 pass (plan_recomputation), in its arena, live
  // from its first reader's backward step of it to its last's; offset kNoBuffer for the others.
  std::vector<PlacedWorkspace> fp32_recompute;
  // The all-FP32 pass's contributions written apart (Executor::backward), in its arena:
  // fp32_contribution[i][k] is the byte offset of node i's input k, kNoBuffer where it goes
  // straight into the gradient (an empty list: none of node i's inputs).
  std::vector<std::vector<std::size_t>> fp32_contribution;
};

GradientPlan plan_gradients(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows);

// The training step's arena: the activations and the planned-dtype gradients in one liveness
// plan over one schedule (a gradient's backward step s is step n + s), so a gradient takes the
// bytes of activations whose last read has passed, as a caching allocator reuses the saved
// tensors it frees during a backward. With `with_fp32_gradients`, the all-FP32 gradients of the
// underflow measurement are one more buffer of it, live at the forward's last step (the chunked
// loss's blocks, which that pass writes too, then live from that step): the pass comes between
// the forward and the step's own loss, so it shares no byte with an activation the loss or the
// backward reads, and the planned gradients reuse its bytes afterwards.
struct StepMemoryPlan {
  // The buffers, in arena.offset's order: plan_activations' (chunked-loss blocks last), then
  // plan_gradients' planned ones, in the step schedule, then the contributions written apart,
  // then the step workspaces, then the recomputed outputs, then the all-FP32 gradients when asked
  // for.
  std::vector<BufferLife> lives;
  LivenessPlan arena;
  std::size_t activation_buffers = 0;  // lives[0, activation_buffers): the activations
  LivenessPlan activations;            // the activations alone: what an arena of their own took
  GradientPlan gradients;              // slots[r].offset: in `arena`; its `planned`: alone
  // contribution[i][k]: the buffer (an index into `lives`) where node i's backward writes input
  // k's gradient contribution apart, live at that backward's step only; kNoBuffer where it goes
  // straight into the gradient (contribution_goes_straight; an empty list: every input of node
  // i). Also where the op adds it into the FP32 sum itself, since a backward with a visitor (the
  // non-finite replay) writes it apart.
  std::vector<std::vector<std::size_t>> contribution;
  std::size_t fp32_gradients = kNoBuffer;  // the all-FP32 pass's buffer in `lives`, when planned
  // Node i's step workspaces, indices into `lives`: forward_workspace[i] live at step i,
  // backward_workspace[i] at step 2n - i; kNoBuffer where it has none.
  std::vector<std::size_t> forward_workspace, backward_workspace;
  // The recomputed outputs (plan_recomputation), and recompute_buffer[i], node i's buffer for its
  // recomputation (an index into `lives`, live from 2n - first_reader to 2n - last_reader);
  // kNoBuffer for a node not recomputed.
  std::vector<RecomputedOutput> recomputed;
  std::vector<std::size_t> recompute_buffer;
};

// Whether a backward writes a gradient contribution straight into the tensor's gradient buffer:
// its only contribution, or the first of several when it comes in the buffer's dtype. Otherwise
// it is written apart, then cast (the first) or added (the rest) into the sum (an FP32 sum by
// axpy, a 16-bit one by the residual facet's add in place); the executor and the plan decide it
// here, alike. The executor may still hand the op the sum itself where the op writes or adds its
// contribution there in its own pass (layer.h: can_accumulate_input_gradient,
// writes_first_input_gradient_in_fp32); the plan keeps the buffer apart for the backward with a
// visitor (the non-finite replay), which writes every such contribution apart.
constexpr bool contribution_goes_straight(int reads, int written_before, sdk::DType contribution,
                                          sdk::DType buffer) {
  return reads == 1 || (written_before == 0 && contribution == buffer);
}

StepMemoryPlan plan_step_memory(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                                bool with_fp32_gradients = false);

}  // namespace mixtrain::core
