// Executor: forward, loss and backward over the planned memory; see executor.h for the contract.
#include "mixtrain/core/graph/executor.h"

#include <algorithm>
#include <bit>
#include <set>

#include "graph/allocation_error.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"
#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/sdk/backend_residual.h"
#include "profiling/profile_scope.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {

// Bytes of an op's own parameters, at most: each has an fp32 master and, when the model trains, an
// fp32 gradient (4 bytes each) and, under a narrower weight dtype (when counted), a working copy;
// a frozen one only the copy it is stored in (4 bytes at most).
std::size_t owned_parameter_bytes(const Layer& op, bool count_working, bool trains) {
  const DType weight = op.precision().weight;
  const std::size_t working =
      count_working && weight != DType::fp32 ? sdk::dtype_size(ops::storage_of(weight)) : 0;
  // Saturating: a config with absurd sizes must be refused with a true (huge) figure, not one
  // that wrapped around to something plausible.
  std::size_t total = 0;
  for (const auto& p : op.traits().parameters) {
    std::size_t numel = 1;
    for (std::int64_t d : p.shape) numel = saturating_mul(numel, static_cast<std::size_t>(d));
    const std::size_t each = op.frozen(p.suffix) ? 4 : (trains ? 8 : 4) + working;
    total = saturating_add(total, saturating_mul(numel, each));
  }
  return total;
}

// What the plans predict for batches of max_rows rows, arenas given (parameter gradients only for
// a model that trains).
MemoryForecast forecast_memory(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                               std::size_t activations, bool trains) {
  const InputSpec& in = plan.input();
  MemoryForecast forecast;
  forecast.max_rows = max_rows;
  const auto bytes = [](std::int64_t rows, std::int64_t per_row, std::size_t size) {
    return saturating_mul(
        saturating_mul(static_cast<std::size_t>(rows), static_cast<std::size_t>(per_row)), size);
  };
  forecast.input = saturating_add(bytes(max_rows, plan.input_features(), sdk::dtype_size(in.dtype)),
                                  bytes(max_rows, in.labels_per_sample, 4));
  forecast.activations = activations;
  forecast.parameter_gradients = trains;
  for (const auto& op : ops)
    forecast.parameters =
        saturating_add(forecast.parameters, owned_parameter_bytes(*op, true, trains));
  return forecast;
}

// An op's step workspace, bound for one call and unbound however the call ends: a pass that
// binds none must not see another pass's.
class WorkspaceBinding {
 public:
  WorkspaceBinding(Layer& op, TensorView workspace) : op_(op) { op_.set_step_workspace(workspace); }
  ~WorkspaceBinding() { op_.set_step_workspace({}); }
  WorkspaceBinding(const WorkspaceBinding&) = delete;
  WorkspaceBinding& operator=(const WorkspaceBinding&) = delete;

 private:
  Layer& op_;
};

// A workspace planned at `at`: its aligned bytes as fp32 words (its dtype does not count).
TensorView workspace_view(std::byte* at, std::size_t bytes) {
  const std::size_t aligned = aligned_buffer_bytes(bytes, kDefaultBufferAlignment);
  return {at, DType::fp32, sdk::Shape{static_cast<std::int64_t>(aligned / 4)}};
}

// The op types whose outputs model.recompute would drop from the step and does not yet, for the
// hint of a refused allocation: the plan asked as if every recomputable op recomputed, its
// flags put back.
std::vector<std::string> recompute_types(const GraphPlan& plan, Ops& ops) {
  std::vector<bool> was(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    was[i] = ops[i]->recomputes_output();
    const OpDefinition* op = find_op(ops[i]->type());
    if (op != nullptr && op->recomputable) ops[i]->set_recomputes_output(true);
  }
  const std::vector<RecomputedOutput> planned = plan_recomputation(plan, ops);
  for (std::size_t i = 0; i < ops.size(); ++i) ops[i]->set_recomputes_output(was[i]);
  // A sum of linears is recomputed with its linears, under theirs: no type of its own to name.
  std::vector<std::string> types;
  for (const RecomputedOutput& r : planned) {
    const std::string& t = ops[r.node]->type();
    const OpDefinition* op = find_op(t);
    if (!was[r.node] && op != nullptr && op->recomputable &&
        std::find(types.begin(), types.end(), t) == types.end())
      types.push_back(t);
  }
  return types;
}

// An arena of at least `bytes`, fp32-typed (any dtype is viewed into it).
Tensor arena(const std::shared_ptr<sdk::DeviceBackend>& backend, std::size_t bytes) {
  return Tensor(backend, DType::fp32, sdk::Shape{static_cast<std::int64_t>(bytes / 4 + 1)});
}

}  // namespace

Executor::Executor(std::shared_ptr<sdk::DeviceBackend> backend, const GraphPlan& plan,
                   std::vector<std::unique_ptr<Layer>>& ops)
    : backend_(std::move(backend)), facets_(*backend_), plan_(plan), ops_(ops) {}

Executor::LossChunking Executor::decide_loss_chunking(std::int64_t max_rows,
                                                      std::int64_t asked) const {
  LossChunking c;
  const TensorId root = plan_.root(plan_.logits());
  if (asked <= 0 || !root.is_node()) return c;
  const std::size_t node = root.position();
  const Layer& head = *ops_[node];
  // Blocks pay only where the batch has more rows than one block.
  if (max_rows * plan_.node(node).rows_per_sample <= asked) return c;
  c.refusal = head.row_block_refusal();
  if (c.refusal.empty() && plan_.logits() != root)
    c.refusal = "the logits are a view of node '" + head.name() + "'";
  if (c.refusal.empty() && plan_.node(node).inputs.size() != 1)
    c.refusal = "node '" + head.name() + "' reads several inputs";
  // Each block writes its rows of the input gradient straight into the buffer. No other node
  // adds to it: every node but the logits is read, so a second reader of the logits node's one
  // input would have to lead back into that input.
  if (c.refusal.empty()) c.rows = asked;
  return c;
}

void Executor::allocate(PassRows rows, bool reserve_fp32_gradients, std::int64_t loss_chunk_rows,
                        std::int64_t loss_pad_classes) {
  if (rows.train < 0 || rows.evaluation < 0 || std::max(rows.train, rows.evaluation) < 1)
    throw std::logic_error("Executor::allocate: " + std::to_string(rows.train) + " training and " +
                           std::to_string(rows.evaluation) +
                           " evaluation rows; one pass needs a row at least");
  const std::int64_t max_rows = std::max(rows.train, rows.evaluation);
  max_rows_ = max_rows;
  const bool trains = rows.train > 0;  // a training step is planned
  const InputSpec& in = plan_.input();
  for (auto& op : ops_) {  // what the plans below depend on
    op->choose_kernels(*backend_);
    op->set_loss_chunk_rows(0);
    op->set_loss_block_padding(0);
  }
  chunking_ = decide_loss_chunking(max_rows, loss_chunk_rows);
  const TensorId logits_root = plan_.root(plan_.logits());
  if (chunking_.rows > 0) {
    chunked_node_ = logits_root.position();
    ops_[chunked_node_]->set_loss_chunk_rows(chunking_.rows);
    ops_[chunked_node_]->set_loss_block_padding(loss_pad_classes);
    chunking_.classes = ops_[chunked_node_]->out_features();
    chunking_.columns = ops_[chunked_node_]->loss_block_columns();
  }
  last_loss_blocks_ = 0;
  logits_stale_ = false;
  // The plans first (pure), so a refused allocation can be reported against the whole of them.
  // An evaluation of more rows than the step gets a forward-only plan of its own in the same
  // arena: the arena is the larger of the two, not a step at the evaluation's rows.
  step_plan_ =
      trains ? plan_step_memory(plan_, ops_, rows.train, reserve_fp32_gradients) : StepMemoryPlan{};
  eval_plan_ = rows.evaluation > rows.train ? plan_forward_memory(plan_, ops_, rows.evaluation)
                                            : ForwardMemoryPlan{};
  recompute_at_.assign(ops_.size(), {});
  for (std::size_t k = 0; k < step_plan_.recomputed.size(); ++k)
    recompute_at_[step_plan_.recomputed[k].first_reader].push_back(k);
  // The outputs written only unfused: the non-finite replay's, a training step's.
  deferred_plan_ = trains ? plan_deferred_outputs(plan_, ops_, rows.train) : DeferredOutputPlan{};
  fp32_reserved_ = reserve_fp32_gradients && trains;
  const std::size_t arena_bytes =
      std::max(step_plan_.arena.arena_bytes, eval_plan_.arena.arena_bytes);
  const MemoryForecast forecast =
      forecast_memory(plan_, ops_, max_rows, arena_bytes + deferred_plan_.plan.arena_bytes, trains);
  // Allocates through `make`; a BackendError (out of memory, most often) is reported with the
  // buffer, its bytes and the forecast.
  auto allocating = [&](const std::string& what, std::size_t bytes, auto&& make) {
    try {
      make();
    } catch (const sdk::BackendError& e) {
      MemoryForecast f = forecast;
      if (trains) f.recompute_types = recompute_types(plan_, ops_);
      f.activations_narrow =
          step_plan_.activations.arena_bytes <
          core::plan_activations(plan_, ops_, std::max<std::int64_t>(rows.train, 1), DType::fp32)
              .arena_bytes;
      throw allocation_error(e, what, bytes, f, *backend_);
    }
  };
  allocating("the input batch", forecast.input, [&] {
    input_ = Tensor(backend_, in.dtype, sdk::Shape{max_rows, plan_.input_features()});
    labels_ = Tensor(backend_, DType::int32, sdk::Shape{max_rows * in.labels_per_sample});
    loss_ = Tensor(backend_, DType::fp32, sdk::Shape{1});
    correct_ = Tensor(backend_, DType::int32, sdk::Shape{1});
  });
  // Activations and their gradients: one arena from their liveness plans, then each op's own
  // buffers.
  allocating("the arena of the activations and their gradients", arena_bytes,
             [&] { act_arena_ = arena(backend_, arena_bytes); });
  deferred_arena_ = Tensor();
  if (deferred_plan_.plan.arena_bytes > 0)
    allocating("the outputs written only unfused (the non-finite replay)",
               deferred_plan_.plan.arena_bytes,
               [&] { deferred_arena_ = arena(backend_, deferred_plan_.plan.arena_bytes); });
  // The deferred outputs of each pass: the step's in their own arena, the evaluation's in its.
  auto* base = static_cast<std::byte*>(act_arena_.view().data);
  std::vector<std::pair<std::size_t, std::byte*>> unfused_step, unfused_evaluation;
  for (std::size_t d = 0; d < deferred_plan_.nodes.size(); ++d)
    unfused_step.emplace_back(
        deferred_plan_.nodes[d],
        static_cast<std::byte*>(deferred_arena_.view().data) + deferred_plan_.plan.offset[d]);
  for (std::size_t d = 0; d < eval_plan_.deferred.size(); ++d)
    unfused_evaluation.emplace_back(
        eval_plan_.deferred[d], base + eval_plan_.arena.offset[eval_plan_.activation_buffers + d]);
  step_ = trains ? place(rows.train, step_plan_.arena, step_plan_.activation_buffers, unfused_step,
                         {step_plan_.lives, step_plan_.forward_workspace,
                          &step_plan_.backward_workspace, &step_plan_.recompute_buffer})
                 : Placement{};
  step_.recompute_unfused.assign(ops_.size(), nullptr);
  for (std::size_t k = 0; k < deferred_plan_.rerun.size(); ++k)
    step_.recompute_unfused[deferred_plan_.rerun[k]] =
        static_cast<std::byte*>(deferred_arena_.view().data) +
        deferred_plan_.plan.offset[deferred_plan_.nodes.size() + k];
  evaluation_ =
      rows.evaluation > rows.train
          ? place(rows.evaluation, eval_plan_.arena, eval_plan_.activation_buffers,
                  unfused_evaluation, {eval_plan_.lives, eval_plan_.forward_workspace, nullptr})
          : Placement{};
  // The chunked loss's per-block values, which every placement's blocks share.
  blocks_ = LossBlockMemory{};
  loss_parts_ = Tensor();
  correct_parts_ = Tensor();
  if (chunking_.rows > 0) {
    const std::int64_t block_rows = chunked_logits(plan_, ops_, max_rows).rows;
    const std::int64_t count =
        (max_rows * plan_.node(chunked_node_).rows_per_sample + block_rows - 1) / block_rows;
    allocating("the loss's per-block values", static_cast<std::size_t>(count) * 8, [&] {
      loss_parts_ = Tensor(backend_, DType::fp32, sdk::Shape{count});
      correct_parts_ = Tensor(backend_, DType::int32, sdk::Shape{count});
    });
  }
  evaluating_ = false;
  bind_placement();  // before the ops allocate: an op with no planned output allocates its own
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    // Without a training pass no backward runs: no parameter needs a gradient (an evaluation-only
    // session of GPT-2 small holds 0.5 GB less).
    ops_[i]->set_parameter_gradients(trains);
    const std::size_t own = owned_parameter_bytes(*ops_[i], false, trains);
    allocating("the parameters, gradients and buffers of node '" + ops_[i]->name() + "' (" +
                   ops_[i]->type() + ")",
               own, [&] { ops_[i]->allocate(backend_, max_rows * plan_.node(i).rows_per_sample); });
  }
  bind_ties();
  // A tied parameter that its user reads narrower than it is stored, owned by an op that reads
  // only masters, gets a working copy in that dtype (layer.h): the optimizer refreshes it with
  // the update, in the pass that already reads the master, where the user would otherwise round
  // the whole master at every pass (GPT-2 small's tied LM head on an AMX Xeon: an 11 ms cast of
  // the [50257, 768] table a step; RESULTS.md, session 69). Made once; init, resume and the
  // replicas' broadcast refresh it with the other working copies. A quantized parameter is
  // frozen, so none is given one.
  for (const WeightTie& t : plan_.ties()) {
    const std::optional<DType> dtype = ops_[t.user]->shared_working_dtype(t.suffix);
    if (!dtype) continue;
    for (auto& owner : ops_) {
      if (!owner->reads_parameter_masters()) continue;
      for (ModelParameter& p : owner->parameters()) {
        // Not a frozen one: it is stored once (layer.h's ModelParameter), and no update moves it.
        if (p.name != t.source || !p.working.empty() || p.master.empty() || p.frozen) continue;
        const sdk::Shape shape = p.master.shape();
        allocating("a " + std::string(sdk::dtype_name(*dtype)) + " working copy of '" + p.name +
                       "' for node '" + ops_[t.user]->name() + "'",
                   static_cast<std::size_t>(shape.numel()) * sdk::dtype_size(*dtype),
                   [&] { p.working = Tensor(backend_, *dtype, shape); });
        backend_->cast(p.master.view(), p.working.view());
      }
    }
  }
}

Executor::Placement Executor::place(std::int64_t rows, const LivenessPlan& arena_plan,
                                    std::size_t activation_buffers,
                                    const std::vector<std::pair<std::size_t, std::byte*>>& unfused,
                                    const PlannedWorkspaces& workspaces) const {
  Placement p;
  p.rows = rows;
  auto* base = static_cast<std::byte*>(act_arena_.view().data);
  // Each planned output's place in the arena, in the plan's order (an op's unfused output may
  // live in its reader's).
  p.output.assign(ops_.size(), nullptr);
  p.unfused.assign(ops_.size(), nullptr);
  for (std::size_t i = 0, k = 0; i < ops_.size(); ++i)
    if (ops_[i]->planned_output_bytes(rows * plan_.node(i).rows_per_sample) > 0)
      p.output[i] = base + arena_plan.offset[k++];
  for (const auto& [node, at] : unfused) p.unfused[node] = at;
  for (std::size_t i = 0; i < ops_.size(); ++i)
    if (const auto home = output_home(plan_, ops_, i, rows)) p.unfused[i] = p.output[*home];
  const auto workspace = [&](std::size_t k) -> TensorView {
    return k == kNoBuffer ? TensorView{}
                          : workspace_view(base + arena_plan.offset[k], workspaces.lives[k].bytes);
  };
  p.forward_workspace.resize(ops_.size());
  p.backward_workspace.resize(ops_.size());
  for (std::size_t i = 0; i < ops_.size() && i < workspaces.forward.size(); ++i)
    p.forward_workspace[i] = workspace(workspaces.forward[i]);
  if (workspaces.backward != nullptr)
    for (std::size_t i = 0; i < ops_.size() && i < workspaces.backward->size(); ++i)
      p.backward_workspace[i] = workspace((*workspaces.backward)[i]);
  p.recompute.assign(ops_.size(), nullptr);
  if (workspaces.recompute != nullptr)
    for (std::size_t i = 0; i < ops_.size() && i < workspaces.recompute->size(); ++i)
      if (const std::size_t k = (*workspaces.recompute)[i]; k != kNoBuffer)
        p.recompute[i] = base + arena_plan.offset[k];
  if (chunking_.rows > 0) {
    // The blocks are the activations' last two buffers (memory_plan.h).
    const ChunkedLogits c = chunked_logits(plan_, ops_, rows);
    const Layer& head = *ops_[chunked_node_];
    const sdk::Shape block{c.rows, head.loss_block_columns()};
    p.block_rows = c.rows;
    p.block_logits = {base + arena_plan.offset[activation_buffers - 2],
                      ops::storage_of(head.precision().activation), block};
    p.block_logits_grad = {base + arena_plan.offset[activation_buffers - 1],
                           logits_grad_dtype(plan_, ops_), block};
  }
  return p;
}

TensorView Executor::backward_workspace(std::size_t node, const GradientBuffers& buffers) const {
  if (!buffers.all_fp32)
    return node < step_.backward_workspace.size() ? step_.backward_workspace[node] : TensorView{};
  // The all-FP32 pass's own, in its arena.
  const auto& planned = step_plan_.gradients.fp32_workspace;
  if (node >= planned.size() || planned[node].offset == kNoBuffer) return {};
  return workspace_view(buffers.base + planned[node].offset, planned[node].bytes);
}

const Executor::Placement& Executor::placed() const {
  return evaluation_placed() ? evaluation_ : step_;
}

bool Executor::evaluation_placed() const {
  return evaluation_.rows > 0 && (evaluating_ || step_.rows == 0);
}

void Executor::set_evaluating(bool on) {
  const bool was = evaluation_placed();
  evaluating_ = on;
  if (evaluation_placed() != was) bind_placement();
}

void Executor::bind_placement() {
  const Placement& p = evaluation_placed() ? evaluation_ : step_;
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    ops_[i]->use_output_storage(i < p.output.size() ? p.output[i] : nullptr);
    ops_[i]->use_deferred_output_storage(i < p.unfused.size() ? p.unfused[i] : nullptr);
  }
  blocks_.rows = p.block_rows;
  blocks_.logits = p.block_logits;
  blocks_.logits_grad = p.block_logits_grad;
  blocks_.loss_parts = loss_parts_.view();
  blocks_.correct_parts = correct_parts_.view();
  plan_poisoning();
}

std::int64_t Executor::placed_rows() const {
  return evaluation_placed() ? evaluation_.rows : step_.rows;
}

void Executor::check_pass(const char* pass, std::int64_t samples, bool backward) const {
  if (!evaluating_ && step_.rows == 0)
    throw std::logic_error(std::string("Executor::") + pass +
                           ": a training pass, but allocate() planned no training step (its "
                           "PassRows::train was 0); set evaluation mode for a forward alone");
  if (backward && evaluation_placed())
    throw std::logic_error(std::string("Executor::") + pass +
                           ": a gradient in evaluation mode, whose memory plan keeps nothing "
                           "for a backward; set training mode before the forward");
  if (samples > placed_rows())
    throw std::logic_error(std::string("Executor::") + pass + ": " + std::to_string(samples) +
                           " rows, more than the " + std::to_string(placed_rows()) + " the " +
                           (evaluation_placed() ? "evaluation's" : "training step's") +
                           " memory plan holds");
}

ExecutorMemory Executor::memory() const {
  ExecutorMemory m;
  m.input = input_.bytes() + labels_.bytes() + loss_.bytes() + correct_.bytes();
  if (!loss_parts_.empty()) m.input += loss_parts_.bytes() + correct_parts_.bytes();
  m.activations = act_arena_.bytes();
  m.deferred_outputs = deferred_arena_.bytes();
  return m;
}

void Executor::bind_ties() {
  for (const WeightTie& t : plan_.ties())
    for (auto& l : ops_)
      for (auto& p : l->parameters())
        if (p.name == t.source) ops_[t.user]->bind_shared_parameter(t.suffix, p);
  // A parameter's gradient is final after its first user's backward (backward runs in reverse).
  ready_after_.assign(ops_.size(), {});
  std::set<const ModelParameter*> seen;
  for (std::size_t i = 0; i < ops_.size(); ++i)
    for (ModelParameter* p : ops_[i]->used_parameters())
      if (!p->frozen && seen.insert(p).second) ready_after_[i].push_back(p);
}

TensorView Executor::labels(std::int64_t rows) const {
  return {labels_.view().data, DType::int32, sdk::Shape{rows * plan_.input().labels_per_sample}};
}

TensorView Executor::activation(TensorId t, Extent e) const {
  const TensorId root = plan_.root(t);
  const TensorView base =
      root.is_batch() ? TensorView{input_.view().data, input_.dtype(), plan_.shape_of(root, e)}
                      : ops_[root.position()]->output(plan_.rows(root, e));
  return {base.data, base.dtype, plan_.shape_of(t, e)};
}

GradientBuffers Executor::planned_gradients() const {
  return {static_cast<std::byte*>(act_arena_.view().data), false};
}

GradientBuffers Executor::fp32_gradients(Tensor& storage) {
  if (fp32_reserved_)
    return {static_cast<std::byte*>(act_arena_.view().data) +
                step_plan_.arena.offset[step_plan_.fp32_gradients],
            true};
  storage =
      Tensor(backend_, DType::fp32,
             sdk::Shape{static_cast<std::int64_t>(step_plan_.gradients.fp32.arena_bytes / 4 + 1)});
  return {static_cast<std::byte*>(storage.view().data), true};
}

TensorView Executor::gradient(TensorId t, Extent e, const GradientBuffers& buffers) const {
  const GradientSlot& g = step_plan_.gradients.slots[plan_.root(t).position()];
  if (buffers.all_fp32) return {buffers.base + g.offset_fp32, DType::fp32, plan_.shape_of(t, e)};
  return {buffers.base + g.offset, g.dtype, plan_.shape_of(t, e)};
}

TensorView Executor::contribution_buffer(std::size_t node, std::size_t input, DType dtype,
                                         const TensorView& gradient,
                                         const GradientBuffers& buffers) {
  const std::int64_t rows = gradient.shape.rows(), cols = gradient.shape.cols();
  const sdk::Shape shape{rows, cols};
  const auto planned_at = [&](const std::vector<std::vector<std::size_t>>& plan) {
    return input < plan[node].size() ? plan[node][input] : kNoBuffer;
  };
  if (buffers.all_fp32) {
    // In the all-FP32 pass's arena, at the offset its plan gave.
    const std::size_t at = planned_at(step_plan_.gradients.fp32_contribution);
    if (at != kNoBuffer) return {buffers.base + at, dtype, shape};
  } else if (const std::size_t k = planned_at(step_plan_.contribution); k != kNoBuffer) {
    return {static_cast<std::byte*>(act_arena_.view().data) + step_plan_.arena.offset[k], dtype,
            shape};
  }
  // Unplanned (a contribution the walk of the plan did not foresee): a buffer of its own.
  return scratch(input, dtype, rows, cols);
}

TensorView Executor::scratch(std::size_t slot, DType dtype, std::int64_t rows, std::int64_t cols) {
  if (scratch_.size() <= slot) scratch_.resize(slot + 1);
  Tensor& t = scratch_[slot];
  const std::size_t need = static_cast<std::size_t>(rows * cols) * sdk::dtype_size(dtype);
  if (t.empty() || t.bytes() < need)
    t = Tensor(backend_, DType::fp32, sdk::Shape{static_cast<std::int64_t>((need + 3) / 4)});
  return {t.view().data, dtype, sdk::Shape{rows, cols}};
}

const char* Executor::profile_scope(std::size_t node) const {
  // The logits' node (a language model's LM head) counts with the loss as the classifier.
  return node + 1 == ops_.size() ? "classifier" : ops_[node]->type().c_str();
}

void Executor::gather_inputs(std::size_t i, Extent e, std::vector<TensorView>& xs) const {
  xs.clear();
  for (TensorId t : plan_.node(i).inputs) xs.push_back(activation(t, e));
}

const std::vector<BufferLife>& Executor::placed_lives() const {
  return evaluation_placed() ? eval_plan_.lives : step_plan_.lives;
}

const LivenessPlan& Executor::placed_arena() const {
  return evaluation_placed() ? eval_plan_.arena : step_plan_.arena;
}

void Executor::plan_poisoning() {
  const std::vector<BufferLife>& lives = placed_lives();
  deaths_.resize(lives.size());
  for (std::size_t k = 0; k < lives.size(); ++k) deaths_[k] = k;
  std::stable_sort(deaths_.begin(), deaths_.end(), [&](std::size_t a, std::size_t b) {
    return lives[a].last_step < lives[b].last_step;
  });
  next_death_ = 0;
}

void Executor::poison_through(int step) {
  if (!poison_) return;
  const std::vector<BufferLife>& lives = placed_lives();
  auto* base = static_cast<std::byte*>(act_arena_.view().data);
  for (; next_death_ < deaths_.size() && lives[deaths_[next_death_]].last_step <= step;
       ++next_death_) {
    const std::size_t k = deaths_[next_death_];
    const std::size_t bytes = aligned_buffer_bytes(lives[k].bytes, kDefaultBufferAlignment);
    if (bytes == 0) continue;
    // All ones: a NaN in every float storage dtype (fp32, bf16, fp16, both fp8s).
    backend_->fill({base + placed_arena().offset[k], DType::fp32,
                    sdk::Shape{static_cast<std::int64_t>(bytes / 4)}},
                   std::bit_cast<float>(0xFFFFFFFFu));
  }
}

void Executor::forward(Extent e, const ForwardVisitor& visit) {
  check_pass("forward", e.samples, false);
  std::vector<TensorView> xs;
  next_death_ = 0;  // a new pass: every buffer is written again before it is read
  const Placement& p = placed();
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    poison_through(static_cast<int>(i) - 1);
    if (ops_[i]->is_view()) continue;  // a view computes nothing
    if (chunking_.rows > 0 && i == chunked_node_) {
      logits_stale_ = true;  // computed in blocks by compute_loss
      continue;
    }
    gather_inputs(i, e, xs);
    ProfileScope scope(profile_scope(i), ops_[i]->name().c_str());
    {
      const WorkspaceBinding bound(
          *ops_[i], i < p.forward_workspace.size() ? p.forward_workspace[i] : TensorView{});
      ops_[i]->forward_inputs(xs, plan_.rows(TensorId::node(i), e));
    }
    if (visit && !visit(i)) return;
  }
}

void Executor::decode(std::int64_t start, std::int64_t tokens,
                      std::span<const std::unique_ptr<DecodeState>> states) {
  check_pass("decode", 1, false);
  const Extent e = Extent::decode_of(tokens);
  std::vector<TensorView> xs;
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i]->is_view()) continue;
    gather_inputs(i, e, xs);
    ProfileScope scope(profile_scope(i), ops_[i]->name().c_str());
    ops_[i]->decode_forward(xs, start, plan_.rows(TensorId::node(i), e), states[i].get());
  }
}

TensorView Executor::logits(Extent e) {
  if (logits_stale_) {
    std::vector<TensorView> xs;
    gather_inputs(chunked_node_, e, xs);
    ProfileScope scope(profile_scope(chunked_node_), ops_[chunked_node_]->name().c_str());
    ops_[chunked_node_]->forward_inputs(xs, plan_.rows(TensorId::node(chunked_node_), e));
    logits_stale_ = false;
  }
  return activation(plan_.logits(), e);
}

void Executor::compute_loss(std::int64_t rows, float grad_scale, float label_smoothing,
                            std::optional<GradientBuffers> gradients,
                            const LossBlockVisitor& visit) {
  check_pass("compute_loss", rows, gradients.has_value());
  // Only the step's own pass poisons: the all-FP32 pass reads the same activations again.
  if (gradients && !gradients->all_fp32) poison_through(static_cast<int>(ops_.size()) - 1);
  if (chunking_.rows > 0) {
    const Extent e = Extent::batch_of(rows);
    const TensorId x = plan_.node(chunked_node_).inputs[0];
    LossBlockPass pass;
    pass.x = activation(x, e);
    pass.x = {pass.x.data, pass.x.dtype, sdk::Shape{pass.x.shape.rows(), pass.x.shape.cols()}};
    pass.labels = labels(rows);
    pass.grad_scale = grad_scale;
    pass.label_smoothing = label_smoothing;
    pass.with_grad = gradients.has_value();
    if (gradients && plan_.needs_grad(plan_.root(x))) {
      const TensorView dx = gradient(x, e, *gradients);
      pass.dx = {dx.data, dx.dtype, sdk::Shape{dx.shape.rows(), dx.shape.cols()}};
    }
    // The blocks' GEMMs are the logits node's; their loss rows are filed under it too.
    ProfileScope scope("classifier", ops_[chunked_node_]->name().c_str());
    last_loss_blocks_ = compute_loss_in_blocks(*ops_[chunked_node_], *backend_, facets_, blocks_,
                                               pass, loss_.view(), visit);
    return;
  }
  last_loss_blocks_ = 0;
  TensorView dlogits;
  if (gradients) dlogits = gradient(plan_.logits(), Extent::batch_of(rows), *gradients);
  ProfileScope scope("classifier");
  facets_.call(sdk::LossOp::softmax_cross_entropy)
      ->softmax_cross_entropy(activation(plan_.logits(), Extent::batch_of(rows)), labels(rows),
                              grad_scale, label_smoothing, loss_.view(), correct_.view(), dlogits);
}

LossValues Executor::read_loss() {
  LossValues v;
  backend_->copy_to_host(&v.loss, loss_.view());
  if (last_loss_blocks_ == 0) {
    backend_->copy_to_host(&v.correct, correct_.view());
    return v;
  }
  // The chunked loss counted per block.
  std::vector<std::int32_t> parts(static_cast<std::size_t>(last_loss_blocks_));
  backend_->copy_to_host(parts.data(),
                         {correct_parts_.view().data, DType::int32, sdk::Shape{last_loss_blocks_}});
  for (std::int32_t c : parts) v.correct += c;
  return v;
}

void Executor::recompute_for(std::size_t reader, Extent e, const GradientBuffers& buffers) {
  std::vector<TensorView> xs;
  for (const std::size_t k : recompute_at_[reader]) {
    const RecomputedOutput& r = step_plan_.recomputed[k];
    std::byte* at = nullptr;
    if (buffers.all_fp32) {
      const PlacedWorkspace& w = step_plan_.gradients.fp32_recompute[r.node];
      at = buffers.base + w.offset;
    } else {
      at = step_.recompute[r.node];
    }
    Layer& op = *ops_[r.node];
    op.use_output_storage(at);
    // The linears of a sum of linears keep their inputs for its GEMMs. Unfused (the non-finite
    // replay) they write their outputs: the first into the sum's (output_home), now `at`, the
    // other into its buffer for this step.
    for (const std::size_t q : r.inputs_run) {
      if (step_.unfused[q] != nullptr && step_.unfused[q] == step_.output[r.node])
        ops_[q]->use_deferred_output_storage(at);
      else if (step_.recompute_unfused[q] != nullptr)
        ops_[q]->use_deferred_output_storage(step_.recompute_unfused[q]);
      gather_inputs(q, e, xs);
      ProfileScope scope("recompute", ops_[q]->name().c_str());
      ops_[q]->forward_inputs(xs, plan_.rows(TensorId::node(q), e));
    }
    gather_inputs(r.node, e, xs);
    ProfileScope scope("recompute", op.name().c_str());
    op.forward_inputs(xs, plan_.rows(TensorId::node(r.node), e));
  }
}

void Executor::unbind_recomputed() {
  for (const RecomputedOutput& r : step_plan_.recomputed) {
    ops_[r.node]->use_output_storage(step_.output[r.node]);
    for (const std::size_t q : r.inputs_run) ops_[q]->use_deferred_output_storage(step_.unfused[q]);
  }
}

void Executor::start_gradients() {
  for (auto& l : ops_)
    for (auto& p : l->parameters()) p.grad_started = false;
}

void Executor::backward(Extent e, const GradientBuffers& buffers, bool last_micro_batch,
                        const BackwardVisitor& visit) {
  check_pass("backward", e.samples, true);
  // The loss wrote the logits' gradient: its root has had its first contribution.
  std::vector<int> written(ops_.size(), 0);
  const TensorId sink_root = plan_.root(plan_.logits());
  if (sink_root.is_node() && chunking_.rows == 0) written[sink_root.position()] = 1;
  std::vector<TensorView> xs, dxs;
  struct Pending {
    std::size_t slot;
    std::size_t root;
    TensorView target;
  };
  std::vector<Pending> pending;
  std::vector<bool> accumulate;  // per input: its op adds into the FP32 sum (layer.h)
  const int n = static_cast<int>(ops_.size());
  // The recomputed outputs' ops write where the forward reads them again, however this ends.
  struct Unbind {
    Executor& executor;
    ~Unbind() { executor.unbind_recomputed(); }
  } const unbind{*this};
  for (std::size_t i = ops_.size(); i-- > 0;) {
    if (!buffers.all_fp32) poison_through(2 * n - static_cast<int>(i) - 1);
    const PlannedNode& node = plan_.node(i);
    Layer& op = *ops_[i];
    if (op.is_view() || !node.needs_grad) continue;
    if (chunking_.rows > 0 && i == chunked_node_) {
      // compute_loss ran this node's backward block by block: its input gradient is written.
      dxs.clear();
      const TensorId t = node.inputs[0];
      if (plan_.needs_grad(plan_.root(t))) {
        dxs.push_back(gradient(t, e, buffers));
        ++written[plan_.root(t).position()];
      } else {
        dxs.emplace_back();
      }
      if (grad_ready_ && last_micro_batch)
        for (ModelParameter* p : ready_after_[i]) grad_ready_(*p);
      if (visit && !visit(i, dxs)) return;
      continue;
    }
    recompute_for(i, e, buffers);
    const TensorView dy = gradient(TensorId::node(i), e, buffers);
    xs.clear();
    dxs.clear();
    pending.clear();
    accumulate.assign(node.inputs.size(), false);
    // A pass-through op's (an add's) contribution is its output's gradient itself: it keeps that
    // dtype rather than being rounded to the op's activation_grad dtype on its way into an FP32
    // sum (ResNet's shortcuts: FP32 straight into the accumulator, no bf16 scratch and cast).
    const DType dtype = buffers.all_fp32               ? DType::fp32
                        : op.passes_gradient_through() ? dy.dtype
                                                       : contribution_dtype(ops_, i);
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const TensorId t = node.inputs[k];
      xs.push_back(activation(t, e));
      const TensorId root = plan_.root(t);
      if (!plan_.needs_grad(root)) {
        dxs.emplace_back();
        continue;
      }
      const std::size_t r = root.position();
      const TensorView g = gradient(t, e, buffers);
      if (contribution_goes_straight(step_plan_.gradients.slots[r].reads, written[r], dtype,
                                     g.dtype)) {
        dxs.push_back(g);  // the only contribution, or the first in FP32: straight into the buffer
        ++written[r];
      } else if (written[r] == 0 && !visit && !buffers.all_fp32 && g.dtype == DType::fp32 &&
                 op.writes_first_input_gradient_in_fp32(k)) {
        // The first of several, which the op writes in FP32 itself (layer.h): no 16-bit copy
        // apart and no cast (a LoRA target's input: 0.5 ms a layer on GPT-2 small's c_proj).
        dxs.push_back(g);
        ++written[r];
      } else if (written[r] > 0 && !visit && !buffers.all_fp32 &&
                 (g.dtype == DType::fp32 ? op.can_accumulate_input_gradient(k)
                                         : op.can_accumulate_input_gradient_in(k, g.dtype))) {
        // A later contribution that the op adds into the sum itself, FP32 or 16-bit (layer.h). A
        // backward with a visitor (the non-finite replay) writes it apart, in the buffer planned
        // for it.
        dxs.push_back(g);
        accumulate[k] = true;
        ++written[r];
      } else {
        dxs.push_back(contribution_buffer(i, k, dtype, g, buffers));
        pending.push_back({k, r, g});
      }
    }
    ProfileScope scope(profile_scope(i), ops_[i]->name().c_str());
    const bool accumulates =
        std::find(accumulate.begin(), accumulate.end(), true) != accumulate.end();
    if (accumulates) op.set_input_gradient_accumulation(accumulate);
    // The step's workspace, or in the all-FP32 pass (before the loss, while the step's
    // workspace bytes hold activations) that pass's own.
    {
      const WorkspaceBinding bound(op, backward_workspace(i, buffers));
      op.backward_inputs(xs, dy, dxs, plan_.rows(TensorId::node(i), e));
    }
    if (accumulates) op.set_input_gradient_accumulation({});
    for (const Pending& p : pending) {
      // Several readers: the first contribution overwrites, later ones add, into an FP32 sum by
      // axpy, into a 16-bit one (model.fp32_gradient_sums = false) by the residual add in place.
      auto& w = written[p.root];
      const TensorView c = dxs[p.slot];
      if (w == 0) {
        backend_->cast(c, p.target);
      } else if (p.target.dtype == DType::fp32) {
        facets_.call(sdk::ActivationOp::axpy)
            ->axpy(1.0f, c, p.target);  // any storage dtype into FP32
      } else {
        const TensorView terms[2] = {p.target, c};
        facets_.call(sdk::ResidualOp::add)->add(terms, false, p.target);
      }
      ++w;
    }
    if (grad_ready_ && last_micro_batch)
      for (ModelParameter* p : ready_after_[i]) grad_ready_(*p);
    if (visit && !visit(i, dxs)) return;
  }
}

}  // namespace mixtrain::core
