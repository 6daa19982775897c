// The activation and gradient plans of a model graph; see memory_plan.h for the contract.
#include "mixtrain/core/graph/memory_plan.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "graph/ops/op_support.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;

DType contribution_dtype(const Ops& ops, std::size_t reader) {
  return storage_of(ops[reader]->precision().activation_grad);
}

DType logits_grad_dtype(const GraphPlan& plan, const Ops& ops) {
  const TensorId root = plan.root(plan.logits());
  return root.is_batch() ? DType::fp32 : storage_of(ops[root.position()]->precision().activation);
}

DType activation_dtype(const GraphPlan& plan, const Ops& ops, TensorId t) {
  const TensorId root = plan.root(t);
  return root.is_batch() ? plan.input().dtype
                         : storage_of(ops[root.position()]->precision().activation);
}

std::vector<RecomputedOutput> plan_recomputation(const GraphPlan& plan, const Ops& ops) {
  const std::size_t n = ops.size();
  // Per root: the ops that read it (through views too), and those whose backward reads it.
  std::vector<std::vector<std::size_t>> readers(n), backward_readers(n);
  for (std::size_t q = 0; q < n; ++q) {
    const Layer& reader = *ops[q];
    if (reader.is_view()) continue;
    // The chunked logits node's backward runs inside the loss, where its input is a forward read.
    const bool backward =
        reader.backward_reads_inputs() && plan.node(q).needs_grad && reader.loss_chunk_rows() == 0;
    // A forward its reader runs (a sum of linears' linear) reads its inputs at that reader's
    // recomputation too.
    const std::vector<std::size_t>& by = plan.readers(q);
    const bool in_reader = reader.traits().forward_in_reader && by.size() == 1;
    for (TensorId t : plan.node(q).inputs) {
      const TensorId root = plan.root(t);
      if (!root.is_node()) continue;
      for (auto* list :
           {&readers[root.position()], backward ? &backward_readers[root.position()] : nullptr})
        if (list != nullptr && (list->empty() || list->back() != q)) list->push_back(q);
      if (in_reader) readers[root.position()].push_back(by.front());
    }
  }
  // From the last node back, so that a recomputed reader's step is known when its inputs are
  // planned: node i is recomputed at the backward of `at[i]`, the latest of its backward readers,
  // of itself when its backward reads its output, and of the steps its recomputed readers are
  // recomputed at; its buffer lives until the earliest of those.
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> at(n, kNone), until(n, kNone);
  const auto candidate = [&](std::size_t i) {
    const Layer& op = *ops[i];
    return (op.recomputes_output() || op.recomputed_with_its_inputs()) && !op.is_view() &&
           !op.traits().output_deferred && !op.traits().forward_in_reader &&
           op.forward_writes_only_its_output() && op.planned_output_bytes(1) > 0;
  };
  for (std::size_t i = n; i-- > 0;) {
    if (!candidate(i)) continue;
    std::vector<std::size_t> needs = backward_readers[i];
    if (ops[i]->backward_reads_output() && plan.node(i).needs_grad) needs.push_back(i);
    for (std::size_t j : readers[i])
      if (at[j] != kNone) needs.push_back(at[j]);
    if (needs.empty()) continue;  // read by no backward: it dies at its last forward read anyway
    at[i] = *std::max_element(needs.begin(), needs.end());
    until[i] = *std::min_element(needs.begin(), needs.end());
  }
  std::vector<RecomputedOutput> out;
  for (std::size_t i = 0; i < n; ++i) {
    if (at[i] == kNone) continue;
    RecomputedOutput r{i, at[i], until[i], {}};
    for (TensorId t : plan.node(i).inputs)
      if (t.is_node() && ops[t.position()]->traits().forward_in_reader &&
          std::find(r.inputs_run.begin(), r.inputs_run.end(), t.position()) == r.inputs_run.end())
        r.inputs_run.push_back(t.position());
    std::sort(r.inputs_run.begin(), r.inputs_run.end());
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// Per node: the last step that reads its output (a forward read, the backward of a reader that
// keeps its inputs, its own backward when that reads it, the loss for the logits; a backward only
// where the node needs a gradient, since the executor runs no other). A pass
// without a backward (`forward_only`: an evaluation) reads no output past the loss. A recomputed
// output (plan_recomputation) is read by no backward: its recomputation, at its first backward
// reader's step, reads the node's inputs instead.
std::vector<int> last_reads(const GraphPlan& plan, const Ops& ops, bool forward_only) {
  const int n = static_cast<int>(ops.size());
  std::vector<int> last(ops.size());
  // A node that needs no gradient runs no backward (a frozen prefix of the model): it reads
  // nothing then.
  const auto runs_backward = [&](int p) {
    return !forward_only && plan.node(static_cast<std::size_t>(p)).needs_grad;
  };
  std::vector<bool> recomputed(ops.size(), false);
  const std::vector<RecomputedOutput> again =
      forward_only ? std::vector<RecomputedOutput>{} : plan_recomputation(plan, ops);
  for (const RecomputedOutput& r : again) recomputed[r.node] = true;
  for (int p = 0; p < n; ++p) {
    const auto i = static_cast<std::size_t>(p);
    last[i] = runs_backward(p) && ops[i]->backward_reads_output() && !recomputed[i] ? 2 * n - p : p;
  }
  const TensorId logits_root = plan.root(plan.logits());
  if (logits_root.is_node())
    last[logits_root.position()] = std::max(last[logits_root.position()], n);
  // A recomputation reads the node's inputs at its step: a kept one lives until then (a
  // recomputed one is in its recomputation buffer, which lives until then).
  // An input whose forward it runs again is written again there (plan_deferred_outputs), and
  // its inputs are read then.
  for (const RecomputedOutput& r : again) {
    const auto read = [&](std::size_t node) {
      for (TensorId t : plan.node(node).inputs) {
        const TensorId root = plan.root(t);
        if (root.is_node() && !recomputed[root.position()] &&
            std::find(r.inputs_run.begin(), r.inputs_run.end(), root.position()) ==
                r.inputs_run.end())
          last[root.position()] =
              std::max(last[root.position()], 2 * n - static_cast<int>(r.first_reader));
      }
    };
    read(r.node);
    for (const std::size_t q : r.inputs_run) read(q);
  }
  for (int q = 0; q < n; ++q) {
    const auto& reader = *ops[static_cast<std::size_t>(q)];
    // The step at which q's forward reads its inputs: its own, its reader's when that runs it
    // (forward_in_reader), the loss's when the logits are computed there in blocks.
    int read_at = q;
    if (reader.traits().forward_in_reader && !plan.readers(static_cast<std::size_t>(q)).empty())
      read_at =
          std::max(read_at, static_cast<int>(plan.readers(static_cast<std::size_t>(q)).back()));
    if (reader.loss_chunk_rows() > 0) read_at = n;
    for (TensorId t : plan.node(static_cast<std::size_t>(q)).inputs) {
      const TensorId root = plan.root(t);
      if (root.is_batch()) continue;
      auto& l = last[root.position()];
      l = std::max(l, read_at);
      if (runs_backward(q) && !reader.is_view() && reader.backward_reads_inputs() &&
          !recomputed[root.position()])
        l = std::max(l, 2 * n - q);
    }
  }
  return last;
}

// Node i's output written unfused at max_rows rows, in its activation dtype: what
// Layer::materialise_output allocates for a deferred output.
std::size_t unfused_bytes(const GraphPlan& plan, const Ops& ops, std::size_t i,
                          std::int64_t max_rows) {
  const Layer& op = *ops[i];
  const std::int64_t rows = max_rows * plan.node(i).rows_per_sample;
  return static_cast<std::size_t>(rows * op.out_features()) *
         sdk::dtype_size(storage_of(op.precision().activation));
}

}  // namespace

std::optional<std::size_t> output_home(const GraphPlan& plan, const Ops& ops, std::size_t i,
                                       std::int64_t max_rows) {
  const Layer& op = *ops[i];
  if (op.is_view() || !op.traits().output_deferred || !op.traits().output_in_reader) return {};
  // One reader (maybe reading it twice); read by two: no single home.
  if (plan.readers(i).size() != 1) return {};
  const std::size_t reader = plan.readers(i).front();
  const Layer& r = *ops[reader];
  if (r.planned_output_bytes(max_rows * plan.node(reader).rows_per_sample) !=
          unfused_bytes(plan, ops, i, max_rows) ||
      storage_of(r.precision().activation) != storage_of(op.precision().activation))
    return {};
  return reader;
}

namespace {

// Whether node i's output, written unfused, needs a buffer of its own: deferred, and without a
// home in its reader's output.
bool unfused_apart(const GraphPlan& plan, const Ops& ops, std::size_t i, std::int64_t max_rows) {
  const Layer& op = *ops[i];
  return !op.is_view() && op.traits().output_deferred && !output_home(plan, ops, i, max_rows);
}

// The activation buffers plan_activations places, in its order.
std::vector<BufferLife> activation_lives(const GraphPlan& plan, const Ops& ops,
                                         std::int64_t max_rows, std::optional<DType> as_dtype,
                                         bool forward_only = false) {
  const std::vector<int> last = last_reads(plan, ops, forward_only);
  // An output that is also home to an earlier op's unfused output lives from that op's forward.
  std::vector<int> first(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) first[i] = static_cast<int>(i);
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (const auto home = output_home(plan, ops, i, max_rows))
      first[*home] = std::min(first[*home], static_cast<int>(i));
  // An output its input's producer writes (add + layer norm) lives from that producer's forward.
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i]->traits().output_written_by_input && !plan.node(i).inputs.empty()) {
      const TensorId root = plan.root(plan.node(i).inputs[0]);
      if (root.is_node()) first[i] = std::min(first[i], static_cast<int>(root.position()));
    }
  std::vector<BufferLife> lives;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::size_t bytes =
        ops[i]->planned_output_bytes(max_rows * plan.node(i).rows_per_sample, as_dtype);
    if (bytes > 0) lives.push_back({ops[i]->name(), bytes, first[i], last[i]});
  }
  // The chunked loss's two blocks (the logits and their gradient) live at the loss step only.
  if (const ChunkedLogits c = chunked_logits(plan, ops, max_rows); c.rows > 0) {
    const Layer& head = *ops[c.node];
    const int loss_step = static_cast<int>(ops.size());
    const auto elements = static_cast<std::size_t>(c.rows * head.loss_block_columns());
    const DType act = storage_of(as_dtype.value_or(head.precision().activation));
    const DType grad = as_dtype ? storage_of(*as_dtype) : logits_grad_dtype(plan, ops);
    lives.push_back(
        {head.name() + " (loss block)", elements * sdk::dtype_size(act), loss_step, loss_step});
    lives.push_back({head.name() + " (loss block gradient)", elements * sdk::dtype_size(grad),
                     loss_step, loss_step});
  }
  return lives;
}

}  // namespace

LivenessPlan plan_activations(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                              std::optional<DType> as_dtype) {
  return plan_liveness(activation_lives(plan, ops, max_rows, as_dtype));
}

namespace {

// The bytes of node i's recomputed output: its planned output's.
std::size_t recomputed_bytes(const GraphPlan& plan, const Ops& ops, std::size_t i,
                             std::int64_t max_rows) {
  return ops[i]->planned_output_bytes(max_rows * plan.node(i).rows_per_sample);
}

// Node i's backward workspace (0: none): for the planned pass, where each input's gradient comes
// in `slots`; for the all-FP32 pass, every input gradient in FP32 and none summed by the op.
std::size_t backward_workspace_bytes(const GraphPlan& plan, const Ops& ops, std::size_t i,
                                     std::int64_t max_rows, const std::vector<GradientSlot>& slots,
                                     bool fp32_pass) {
  const Layer& op = *ops[i];
  if (op.is_view() || op.loss_chunk_rows() > 0 || !plan.node(i).needs_grad) return 0;
  Layer::WorkspaceAsk ask;
  ask.pass = Layer::Pass::backward;
  ask.rows = max_rows * plan.node(i).rows_per_sample;
  ask.fp32_gradients = fp32_pass;
  for (const TensorId t : plan.node(i).inputs) {
    const TensorId root = plan.root(t);
    const bool needs = plan.needs_grad(root);
    ask.input_needs_gradient.push_back(needs);
    const GradientSlot* slot = needs && !fp32_pass ? &slots[root.position()] : nullptr;
    ask.input_gradient_sum.push_back(
        slot != nullptr && slot->reads > 1 ? std::optional<DType>(slot->dtype) : std::nullopt);
  }
  return op.step_workspace_bytes(ask);
}

// The ops' step workspaces (memory_plan.h), appended to `lives`: a forward's at step p, and, with
// `backward` (and the gradient slots, which say what each input's gradient is handed as), a
// backward's at step 2n - p. Only where the op runs that pass at its own step: not a view, not a
// forward its reader runs, not the chunked logits node (its passes run at the loss), not a
// backward the node does not run.
void append_workspaces(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                       std::vector<BufferLife>& lives, std::vector<std::size_t>& forward,
                       std::vector<std::size_t>* backward, const std::vector<GradientSlot>* slots) {
  const int n = static_cast<int>(ops.size());
  forward.assign(ops.size(), kNoBuffer);
  if (backward != nullptr) backward->assign(ops.size(), kNoBuffer);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Layer& op = *ops[i];
    if (op.is_view() || op.loss_chunk_rows() > 0) continue;
    const int at = static_cast<int>(i);
    Layer::WorkspaceAsk ask;
    ask.rows = max_rows * plan.node(i).rows_per_sample;
    if (!op.traits().forward_in_reader)
      if (const std::size_t bytes = op.step_workspace_bytes(ask); bytes > 0) {
        forward[i] = lives.size();
        lives.push_back({op.name() + " workspace (forward)", bytes, at, at});
      }
    if (backward == nullptr || slots == nullptr) continue;
    if (const std::size_t bytes = backward_workspace_bytes(plan, ops, i, max_rows, *slots, false);
        bytes > 0) {
      (*backward)[i] = lives.size();
      lives.push_back({op.name() + " workspace (backward)", bytes, 2 * n - at, 2 * n - at});
    }
  }
}

}  // namespace

ForwardMemoryPlan plan_forward_memory(const GraphPlan& plan, const Ops& ops,
                                      std::int64_t max_rows) {
  ForwardMemoryPlan out;
  out.lives = activation_lives(plan, ops, max_rows, std::nullopt, /*forward_only=*/true);
  out.activation_buffers = out.lives.size();
  const std::vector<int> last = last_reads(plan, ops, /*forward_only=*/true);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!unfused_apart(plan, ops, i, max_rows)) continue;
    out.deferred.push_back(i);
    out.lives.push_back({ops[i]->name() + " (unfused)", unfused_bytes(plan, ops, i, max_rows),
                         static_cast<int>(i), last[i]});
  }
  append_workspaces(plan, ops, max_rows, out.lives, out.forward_workspace, nullptr, nullptr);
  out.arena = plan_liveness(out.lives);
  return out;
}

ChunkedLogits chunked_logits(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows) {
  const TensorId root = plan.root(plan.logits());
  if (!root.is_node()) return {};
  const std::size_t node = root.position();
  const std::int64_t block = ops[node]->loss_chunk_rows();
  if (block <= 0) return {};
  return {node, std::min(block, max_rows * plan.node(node).rows_per_sample)};
}

DeferredOutputPlan plan_deferred_outputs(const GraphPlan& plan, const Ops& ops,
                                         std::int64_t max_rows) {
  const std::vector<int> last = last_reads(plan, ops, /*forward_only=*/false);
  DeferredOutputPlan out;
  std::vector<BufferLife> lives;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!unfused_apart(plan, ops, i, max_rows)) continue;
    out.nodes.push_back(i);
    lives.push_back(
        {ops[i]->name(), unfused_bytes(plan, ops, i, max_rows), static_cast<int>(i), last[i]});
  }
  const int n = static_cast<int>(ops.size());
  for (const RecomputedOutput& r : plan_recomputation(plan, ops))
    for (const std::size_t q : r.inputs_run) {
      if (!unfused_apart(plan, ops, q, max_rows)) continue;
      const int step = 2 * n - static_cast<int>(r.first_reader);
      out.rerun.push_back(q);
      lives.push_back(
          {ops[q]->name() + " (recomputed)", unfused_bytes(plan, ops, q, max_rows), step, step});
    }
  out.plan = plan_liveness(lives);
  return out;
}

namespace {

// The gradient buffers: each node's slot (its offsets not placed yet) and the buffers' lives in
// the backward schedule (the loss is step 0, the node at forward position p is step n - p), in
// the planned dtypes and all in FP32; node r's gradient is buffer life_of[r] of both lists.
struct GradientLives {
  std::vector<GradientSlot> slots;
  std::vector<BufferLife> planned, fp32;
  std::vector<std::size_t> life_of;
};

// model.fp32_gradient_sums = false: a slot read several times takes the one dtype all its
// contributions come in, FP32 where they differ. A pass-through reader (an add) contributes its
// own output gradient's dtype (what the executor hands on), so the slots are settled from the
// last node back: every reader of node p comes after p.
void sums_in_readers_dtype(const GraphPlan& plan, const Ops& ops, const ChunkedLogits& chunked,
                           std::vector<GradientSlot>& slots) {
  const std::size_t n = ops.size();
  std::vector<int> seen(n, 0);
  std::vector<bool> mixed(n, false);
  std::vector<DType> common(n, DType::fp32);
  auto see = [&](TensorId tensor, DType dtype) {
    const TensorId root = plan.root(tensor);
    if (!plan.needs_grad(root)) return;
    const std::size_t r = root.position();
    if (seen[r]++ == 0)
      common[r] = dtype;
    else if (common[r] != dtype)
      mixed[r] = true;
  };
  auto settle = [&](std::size_t r) {
    if (slots[r].reads > 1) slots[r].dtype = mixed[r] ? DType::fp32 : common[r];
  };
  if (chunked.rows == 0) see(plan.logits(), logits_grad_dtype(plan, ops));
  for (std::size_t p = n; p-- > 0;) {
    settle(p);
    if (ops[p]->is_view()) continue;
    const DType contribution =
        ops[p]->passes_gradient_through() ? slots[p].dtype : contribution_dtype(ops, p);
    for (TensorId t : plan.node(p).inputs) see(t, contribution);
  }
}

GradientLives gradient_lives(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows) {
  const std::size_t n = ops.size();
  GradientLives out;
  std::vector<GradientSlot>& slots = out.slots;
  slots.assign(n, GradientSlot{});
  std::vector<int> first(n, std::numeric_limits<int>::max());
  auto contribute = [&](TensorId tensor, DType dtype, int step) {
    const TensorId root = plan.root(tensor);
    if (!plan.needs_grad(root)) return;
    auto& g = slots[root.position()];
    ++g.reads;
    g.dtype = dtype;  // the reader's dtype; FP32 below when there are several readers
    first[root.position()] = std::min(first[root.position()], step);
  };
  // The chunked loss writes no logits gradient, and the logits node's input gradients at the
  // loss step, block by block.
  const ChunkedLogits chunked = chunked_logits(plan, ops, max_rows);
  if (chunked.rows == 0) contribute(plan.logits(), logits_grad_dtype(plan, ops), 0);
  for (std::size_t p = 0; p < n; ++p) {
    if (ops[p]->is_view()) continue;
    const bool in_loss = chunked.rows > 0 && p == chunked.node;
    for (TensorId t : plan.node(p).inputs)
      contribute(t, contribution_dtype(ops, p), in_loss ? 0 : static_cast<int>(n - p));
  }
  if (plan.fp32_gradient_sums()) {
    for (auto& g : slots)
      if (g.reads > 1) g.dtype = DType::fp32;
  } else {
    sums_in_readers_dtype(plan, ops, chunked, slots);
  }
  // An op whose inputs' gradients are its output's (add) lends that buffer to one input read by
  // it alone, in the same dtype: the input's gradient is then written by the op's readers, and
  // the op copies nothing. The input's life starts when the output's ends (at the op's backward),
  // so the two lives become one buffer living from the first to the last. Visited from the last
  // op back, so a chain of adds shares one buffer. It lends it to more inputs where each one's
  // backward, and the first's, leave it as it is (backward_keeps_output_gradient: LoRA's base
  // linear and its B adapter), so neither sees the other's writes.
  std::vector<std::size_t> shares(n);
  for (std::size_t r = 0; r < n; ++r) shares[r] = r;
  auto elements = [&](std::size_t r) {
    return plan.node(r).rows_per_sample * plan.node(r).shape.back();
  };
  auto keeps = [&](std::size_t r) { return ops[r]->traits().backward_keeps_output_gradient; };
  for (std::size_t p = n; p-- > 0;) {
    if (ops[p]->is_view() || !ops[p]->passes_gradient_through() || slots[p].reads == 0) continue;
    std::optional<std::size_t> first_lent;
    for (TensorId t : plan.node(p).inputs) {
      const TensorId root = plan.root(t);
      if (!plan.needs_grad(root)) continue;
      const std::size_t r = root.position();
      if (slots[r].reads != 1 || slots[r].dtype != slots[p].dtype || shares[r] != r ||
          elements(r) != elements(p))
        continue;
      if (first_lent && !(keeps(*first_lent) && keeps(r))) continue;
      shares[r] = shares[p];
      if (!first_lent) first_lent = r;
    }
  }
  // The same lives twice: in each gradient's dtype, and all in FP32 (the underflow pass).
  std::vector<BufferLife> lives, lives_fp32;
  std::vector<std::size_t> life_of(n, 0);
  for (std::size_t r = n; r-- > 0;) {
    const auto& g = slots[r];
    if (g.reads == 0) continue;
    const auto elems = static_cast<std::size_t>(max_rows * elements(r));
    const int last = static_cast<int>(n - r);
    if (shares[r] != r) {
      // Later in the forward order than r: its life is already listed.
      const std::size_t k = life_of[shares[r]];
      life_of[r] = k;
      lives[k].name += "+" + ops[r]->name() + ".grad";
      lives[k].first_step = std::min(lives[k].first_step, first[r]);
      lives[k].last_step = std::max(lives[k].last_step, last);
      lives_fp32[k].first_step = lives[k].first_step;
      lives_fp32[k].last_step = lives[k].last_step;
      continue;
    }
    life_of[r] = lives.size();
    lives.push_back({ops[r]->name() + ".grad", elems * sdk::dtype_size(g.dtype), first[r], last});
    lives_fp32.push_back({ops[r]->name() + ".grad", elems * 4, first[r], last});
  }
  out.planned = std::move(lives);
  out.fp32 = std::move(lives_fp32);
  out.life_of = std::move(life_of);
  return out;
}

// The contributions a backward writes apart, found by walking the backward as
// Executor::backward does (the same order, the same count of contributions written): apart(i, k,
// bytes) for node i's input k. all_fp32: the underflow pass's backward, where every contribution
// and every gradient buffer is FP32.
template <class Apart>
void walk_contributions(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                        const std::vector<GradientSlot>& slots, bool all_fp32, Apart&& apart) {
  const std::size_t n = ops.size();
  const ChunkedLogits chunked = chunked_logits(plan, ops, max_rows);
  std::vector<int> written(n, 0);
  const TensorId sink = plan.root(plan.logits());
  if (sink.is_node() && chunked.rows == 0) written[sink.position()] = 1;  // the loss wrote it
  std::vector<std::size_t> later;
  for (std::size_t i = n; i-- > 0;) {
    const PlannedNode& node = plan.node(i);
    if (ops[i]->is_view() || !node.needs_grad) continue;
    if (chunked.rows > 0 && i == chunked.node) {
      const TensorId root = plan.root(node.inputs[0]);
      if (plan.needs_grad(root)) ++written[root.position()];
      continue;
    }
    const DType dtype = all_fp32                            ? DType::fp32
                        : ops[i]->passes_gradient_through() ? slots[i].dtype
                                                            : contribution_dtype(ops, i);
    later.clear();
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const TensorId root = plan.root(node.inputs[k]);
      if (!plan.needs_grad(root)) continue;
      const std::size_t r = root.position();
      const DType buffer = all_fp32 ? DType::fp32 : slots[r].dtype;
      if (contribution_goes_straight(slots[r].reads, written[r], dtype, buffer)) {
        ++written[r];
        continue;
      }
      const auto elements = static_cast<std::size_t>(max_rows * plan.node(r).rows_per_sample *
                                                     plan.node(r).shape.back());
      apart(i, k, elements * sdk::dtype_size(dtype));
      later.push_back(r);
    }
    // Counted after the op, as the executor adds them in; whether the op added one itself instead
    // changes no later decision (written_before only matters while it is 0).
    for (std::size_t r : later) ++written[r];
  }
}

// A buffer per contribution written apart, live at its node's backward step (step_of(i)), into
// `lives`; its index there in index[i][k], kNoBuffer for the others.
template <class StepOf>
void plan_contributions(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                        const std::vector<GradientSlot>& slots, bool all_fp32, StepOf step_of,
                        std::vector<BufferLife>& lives,
                        std::vector<std::vector<std::size_t>>& index) {
  index.assign(ops.size(), {});
  walk_contributions(
      plan, ops, max_rows, slots, all_fp32, [&](std::size_t i, std::size_t k, std::size_t bytes) {
        if (index[i].empty()) index[i].assign(plan.node(i).inputs.size(), kNoBuffer);
        index[i][k] = lives.size();
        const int step = step_of(i);
        lives.push_back(
            {ops[i]->name() + " input " + std::to_string(k) + " contribution", bytes, step, step});
      });
}

// The gradient plan from its lives (g.fp32 gains the all-FP32 pass's contributions).
GradientPlan place_gradients(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                             GradientLives& g) {
  GradientPlan out;
  out.planned = plan_liveness(g.planned);
  // The all-FP32 pass's contributions written apart live in its arena too.
  const int n = static_cast<int>(ops.size());
  std::vector<std::vector<std::size_t>> apart;
  plan_contributions(
      plan, ops, max_rows, g.slots, true, [n](std::size_t i) { return n - static_cast<int>(i); },
      g.fp32, apart);
  // Its backward workspaces, each at its node's backward step of it.
  std::vector<std::size_t> workspace_life(ops.size(), kNoBuffer);
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (const std::size_t bytes = backward_workspace_bytes(plan, ops, i, max_rows, g.slots, true);
        bytes > 0) {
      workspace_life[i] = g.fp32.size();
      const int at = n - static_cast<int>(i);
      g.fp32.push_back({ops[i]->name() + " workspace (all-fp32 backward)", bytes, at, at});
    }
  // Its recomputed outputs, each from its first reader's backward step of it to its last's.
  const std::vector<RecomputedOutput> recomputed = plan_recomputation(plan, ops);
  std::vector<std::size_t> recompute_life;
  for (const RecomputedOutput& r : recomputed) {
    recompute_life.push_back(g.fp32.size());
    g.fp32.push_back({ops[r.node]->name() + " (recomputed, all-fp32 backward)",
                      recomputed_bytes(plan, ops, r.node, max_rows),
                      n - static_cast<int>(r.first_reader), n - static_cast<int>(r.last_reader)});
  }
  out.fp32 = plan_liveness(g.fp32);
  out.fp32_recompute.assign(ops.size(), {});
  for (std::size_t k = 0; k < recomputed.size(); ++k)
    out.fp32_recompute[recomputed[k].node] = {out.fp32.offset[recompute_life[k]],
                                              g.fp32[recompute_life[k]].bytes};
  out.fp32_workspace.assign(ops.size(), {});
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (workspace_life[i] != kNoBuffer)
      out.fp32_workspace[i] = {out.fp32.offset[workspace_life[i]], g.fp32[workspace_life[i]].bytes};
  out.fp32_contribution = std::move(apart);
  for (auto& node : out.fp32_contribution)
    for (std::size_t& k : node)
      if (k != kNoBuffer) k = out.fp32.offset[k];
  out.slots = g.slots;
  for (std::size_t r = 0; r < out.slots.size(); ++r) {
    if (out.slots[r].reads == 0) continue;
    out.slots[r].offset = out.planned.offset[g.life_of[r]];
    out.slots[r].offset_fp32 = out.fp32.offset[g.life_of[r]];
  }
  return out;
}

}  // namespace

GradientPlan plan_gradients(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows) {
  GradientLives g = gradient_lives(plan, ops, max_rows);
  return place_gradients(plan, ops, max_rows, g);
}

StepMemoryPlan plan_step_memory(const GraphPlan& plan, const Ops& ops, std::int64_t max_rows,
                                bool with_fp32_gradients) {
  StepMemoryPlan out;
  out.lives = activation_lives(plan, ops, max_rows, std::nullopt);
  out.activation_buffers = out.lives.size();
  out.activations = plan_liveness(out.lives);
  GradientLives g = gradient_lives(plan, ops, max_rows);
  out.gradients = place_gradients(plan, ops, max_rows, g);
  // A gradient's backward step s is the step schedule's n + s.
  const int n = static_cast<int>(ops.size());
  for (BufferLife life : g.planned) {
    life.first_step += n;
    life.last_step += n;
    out.lives.push_back(std::move(life));
  }
  plan_contributions(
      plan, ops, max_rows, out.gradients.slots, false,
      [n](std::size_t i) { return 2 * n - static_cast<int>(i); }, out.lives, out.contribution);
  append_workspaces(plan, ops, max_rows, out.lives, out.forward_workspace, &out.backward_workspace,
                    &out.gradients.slots);
  out.recomputed = plan_recomputation(plan, ops);
  out.recompute_buffer.assign(ops.size(), kNoBuffer);
  for (const RecomputedOutput& r : out.recomputed) {
    out.recompute_buffer[r.node] = out.lives.size();
    out.lives.push_back(
        {ops[r.node]->name() + " (recomputed)", recomputed_bytes(plan, ops, r.node, max_rows),
         2 * n - static_cast<int>(r.first_reader), 2 * n - static_cast<int>(r.last_reader)});
  }
  if (with_fp32_gradients) {
    // The all-FP32 pass runs after the forward's last op and before the step's own loss: live
    // at that op's step, beside every activation the backward or the loss reads, and free for
    // the planned gradients from the loss on. The chunked loss's blocks, which that pass writes
    // too, then live from that step as well (the activations' last two buffers).
    out.fp32_gradients = out.lives.size();
    out.lives.push_back(
        {"all-fp32 gradients (run.underflow_every)", out.gradients.fp32.arena_bytes, n - 1, n - 1});
    if (chunked_logits(plan, ops, max_rows).rows > 0)
      for (std::size_t b = out.activation_buffers - 2; b < out.activation_buffers; ++b)
        out.lives[b].first_step = n - 1;
  }
  out.arena = plan_liveness(out.lives);
  for (std::size_t r = 0; r < out.gradients.slots.size(); ++r)
    if (out.gradients.slots[r].reads > 0)
      out.gradients.slots[r].offset = out.arena.offset[out.activation_buffers + g.life_of[r]];
  return out;
}

}  // namespace mixtrain::core
