#include "train/planned_model.h"

#include <algorithm>
#include <set>
#include <string>

#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/precision/planning.h"
#include "mixtrain/core/profiling/profiling_backend.h"

namespace mixtrain::core {

namespace {

// Says once per plan what the chunked loss does (graph/chunked_loss.h), or why it does not.
void report_loss_chunking(Trainer::State& s) {
  const auto& c = s.model->loss_chunking();
  if (c.rows > 0)
    s.log.info("loss: the logits node and the loss run " + std::to_string(c.rows) +
               " rows at a time (model.loss_chunk_rows); the whole logits are never stored" +
               (c.columns > c.classes
                    ? "; each block padded from " + std::to_string(c.classes) + " to " +
                          std::to_string(c.columns) + " classes (model.loss_pad_classes)"
                    : ""));
  else if (!c.refusal.empty())
    s.log.info("loss: the logits are computed whole, not in blocks of model.loss_chunk_rows: " +
               c.refusal);
}

// Whether the step may queue the optimizer's update before it reads the gradient check (the
// gated update), or why not; logged once per plan.
void plan_gated_update(Trainer::State& s) {
  auto& backend = *s.c.backend;
  const std::string optimizer = "optimizer '" + s.e.optimizer_type + "'";
  auto* facet = dynamic_cast<sdk::GatedStepFacet*>(s.c.optimizer.get());
  std::string off;
  if (!s.e.run.gated_update)
    off = "run.gated_update = false";
  else if (!sdk::facet_serves<sdk::GatedStepFacet>(facet, 0))
    off = optimizer + " offers no gated step (sdk/optimizer_gated_step.h)";
  else if (!facet->can_gate())
    off = "backend '" + backend.capabilities().kind + "' runs no gated update for " + optimizer;
  else if (auto why =
               unmet(backend, {sdk::GradientCheckOp::queue_unscale_check, {sdk::DType::fp32}}))
    off = "backend '" + backend.capabilities().kind + "' cannot queue the gradient check: " + *why;
  else if (s.reducer->world() > 1)
    off = "the replicas agree on found_inf and the gradient norm on the host first";
  else if (s.c.policy->uses_scaled_operands())
    off = "precision policy '" + s.e.policy_name + "' reads its FP8 amaxes on the host every step";
  s.gated_optimizer = off.empty() ? facet : nullptr;
  if (!off.empty()) {
    s.log.debug("step: the update waits for the gradient check on the host: " + off);
    return;
  }
  if (s.gradient_status.empty())
    s.gradient_status =
        Tensor(s.c.backend, sdk::DType::int32, sdk::Shape{sdk::GradientStatus::kWords});
  s.log.debug(
      "step: the optimizer's update is queued behind the gradient check, gated on the "
      "device; the host reads the check while the update runs");
}

}  // namespace

void build_model(Trainer::State& s) {
  const auto& e = s.e;
  auto& backend = *s.c.backend;
  InputSpec input;
  if (s.train.is_tokens()) {
    input.dtype = sdk::DType::int32;
    input.labels_per_sample = s.train.labels_per_row();
  }
  input.sample_shape = s.train.sample_shape;
  input.class_names = s.train.class_names;
  s.model = std::make_unique<Model>(s.c.backend, e.model, s.train.features, s.train.classes, input);
  if (e.eval.top_k > s.model->classes())
    throw sdk::ConfigError(e.eval.top_k_where, "eval.top_k",
                           "is " + std::to_string(e.eval.top_k) + " but the model has only " +
                               std::to_string(s.model->classes()) + " classes",
                           // No usual value here: it may be the refused one (5 of a 4-class model).
                           "choose a top_k of at most the number of classes, " +
                               std::to_string(s.model->classes()) + ", or 0 for none");
  auto caps = backend.capabilities();
  std::vector<PrecisionOverride> overrides = e.overrides;
  for (auto& o : s.precision.escalation.overrides()) overrides.push_back(std::move(o));
  plan_precision(*s.model, *s.c.policy, caps, overrides, s.log);
  // Every node's ops are asked in Model::allocate; the step's own gradient checks here.
  for (sdk::GradientCheckOp op : {sdk::GradientCheckOp::unscale_and_check_finite,
                                  sdk::GradientCheckOp::unscale_check_and_sum_squares})
    if (auto why = unmet(backend, {op, {sdk::DType::fp32}}))
      throw sdk::BackendError(
          "the training step needs gradient_check." + std::string(sdk::op_name(op)) +
              " on fp32 gradients, which backend '" + caps.kind + "' does not provide: " + *why,
          "use a backend that offers it (`mixtrain plugins` lists them)");
  // The EMA of the weights is two foreach ops a step.
  if (e.ema.enabled())
    for (const BackendNeed& need :
         {BackendNeed{sdk::ForeachOp::foreach_mul_scalar, {sdk::DType::fp32}},
          BackendNeed{sdk::ForeachOp::foreach_add, {sdk::DType::fp32, sdk::DType::fp32}}})
      if (auto why = unmet(backend, need))
        throw sdk::BackendError("ema needs " + need_op_name(need) + " on fp32, which backend '" +
                                    caps.kind + "' does not provide: " + *why,
                                "turn ema off, or use a backend that offers it");
  // Only a gradient format of a narrower range than fp32's flushes what fp32 keeps: fp16 and
  // FP8. bf16 has fp32's exponent bits and stores as zero only magnitudes below 2^-134, which
  // fp32 itself holds as subnormals (and kernels that flush denormals zero already): its share
  // is 0 in practice, and the pass would hold the step's activation gradients again in fp32
  // (ResNet-50 bf16 on a GPU: 7.18 GiB at its peak instead of 5.65).
  s.precision.underflow_watch = false;
  for (const auto& l : s.model->layers()) {
    const sdk::DType g = l->precision().activation_grad;
    if (sdk::dtype_size(g) < 4 && g != sdk::DType::bf16) s.precision.underflow_watch = true;
  }
  const Dataset& evaluated = s.eval.rows > 0 ? s.eval : s.train;
  s.eval_batch_rows =
      s.opt.trains ? std::min(e.data.eval_batch_size, std::max<std::int64_t>(evaluated.rows, 1))
                   : e.data.eval_batch_size;
  // Top-k reads every evaluation batch's whole logits, and a step observer (calibration) every
  // node's output after its forward: the logits are computed whole for them.
  if (e.eval.top_k > 0 || s.opt.observer != nullptr) s.model->set_loss_chunk_rows(0);
  // A session that never trains plans no training step; an evaluation batch larger than the
  // step's gets a forward-only plan of its own, not a step's memory at its rows.
  s.model->allocate(
      Executor::PassRows{s.opt.trains ? s.rank_batch : 0, s.eval_batch_rows},
      /*reserve_fp32_gradients=*/e.run.underflow_every > 0 && s.precision.underflow_watch);
  report_loss_chunking(s);
  s.params.clear();
  s.grads.clear();
  // Frozen parameters are no business of the optimizer's, nor of the gradient checks'.
  for (auto* p : s.model->trainable_parameters()) {
    sdk::Parameter sp;
    sp.name = p->name;
    sp.tensors.master = p->master.view();
    sp.tensors.grad = p->grad.view();
    if (!p->working.empty()) sp.tensors.working = p->working.view();
    sp.weight_decay = p->weight_decay;
    s.params.push_back(sp);
    s.grads.push_back(p->grad.view());
  }
  // Data parallel: the optimizer sees the gradients in their buckets, or only this rank's shard.
  // A session that never trains has no gradients (Layer::set_parameter_gradients) to place.
  if (s.opt.trains) s.reducer->attach(*s.model, s.params, s.grads);
  // A session that never trains binds nothing: no optimizer state (TrainOptions::trains).
  s.c.optimizer->bind(backend, s.opt.trains ? std::span<const sdk::Parameter>(s.params)
                                            : std::span<const sdk::Parameter>());
  // Its slots are saved by name: two of one name would fail at the first checkpoint, steps later.
  std::set<std::string> slots;
  for (const auto& t : s.c.optimizer->state_tensors())
    if (t.name.empty() || !slots.insert(t.name).second)
      throw sdk::PluginError(
          "optimizer '" + e.optimizer_type + "' names " +
              (t.name.empty() ? std::string("a state tensor ''")
                              : "two of its state tensors '" + t.name + "'") +
              " (state_tensors()), so a checkpoint could not hold them",
          "give each slot a name of its own, \"<param>.<slot>\" (sdk/optimizer.h); this is a bug "
          "in the optimizer: report it to its authors");
  {
    std::string static_step;  // why the step is not static ("": it is)
    for (const auto& l : s.model->layers())
      if (static_step.empty() && l->traits().varies_per_step)
        static_step =
            "node '" + l->name() + "' changes its arguments every step (" + l->type() + ")";
    if (s.c.policy->uses_scaled_operands())
      static_step = "precision policy '" + e.policy_name + "' moves FP8 scales every step";
    if (e.run.accumulate > 1) static_step = "run.accumulate > 1 (micro-batches differ)";
    // The profiler offers no step_graph facet (profiling_backend.h): say why, not "no graphs".
    if (dynamic_cast<const ProfilingBackend*>(&backend) != nullptr)
      static_step = "--profile times each op, which a replayed graph would hide";
    const StepGraphRequest request = !e.run.step_graphs.has_value() ? StepGraphRequest::automatic
                                     : *e.run.step_graphs           ? StepGraphRequest::on
                                                                    : StepGraphRequest::off;
    s.step_graph = std::make_unique<StepGraph>(
        request == StepGraphRequest::off ? nullptr : sdk::facet<sdk::StepGraphFacet>(backend),
        request, static_step, core_logger("step_graph"));
  }
  plan_gated_update(s);
}

void replan_model(Trainer::State& s) {
  auto& b = *s.c.backend;
  // The training state through the host: the old model's memory is freed before the new one is
  // allocated, so a replan never needs room for two models.
  std::vector<sdk::HostTensor> masters, buffers, slots;
  for (auto* p : s.model->parameters())
    masters.push_back(parameter_to_host(s.c.backend, p->name, *p));
  for (auto* buf : s.model->buffers()) buffers.push_back(to_host(b, buf->name, buf->value.view()));
  for (const auto& t : s.c.optimizer->state_tensors()) slots.push_back(to_host(b, t.name, t.view));
  const auto optimizer_scalars = s.c.optimizer->save_state();
  s.params.clear();
  s.grads.clear();
  s.step_graph.reset();  // its recordings hold the old model's addresses
  s.model.reset();
  build_model(s);
  // The run's seed keys more than initial values: dropout masks and stochastic rounding read it
  // from the layers, which a rebuild starts at seed 0. Initialising again sets it; every value
  // initialised is overwritten below.
  s.model->init_parameters(s.e.run.seed);
  const auto params = s.model->parameters();
  const auto bufs = s.model->buffers();
  const auto state = s.c.optimizer->state_tensors();
  if (params.size() != masters.size() || bufs.size() != buffers.size() ||
      state.size() != slots.size())
    throw std::logic_error("replan_model: the rebuilt model holds other parameters");
  for (std::size_t i = 0; i < params.size(); ++i)
    set_parameter_from_fp32(s.c.backend, *params[i],
                            reinterpret_cast<const float*>(masters[i].bytes.data()));
  for (std::size_t i = 0; i < bufs.size(); ++i)
    b.copy_from_host(bufs[i]->value.view(), buffers[i].bytes.data());
  for (std::size_t i = 0; i < state.size(); ++i)
    b.copy_from_host(state[i].view, slots[i].bytes.data());
  s.c.optimizer->load_state(optimizer_scalars);
  s.model->refresh_working_copies();
}

std::optional<Escalation::Event> escalate_after_step(Trainer::State& s, std::int64_t step,
                                                     const StepOutcome& outcome) {
  if (!s.precision.escalation.settings().enabled) return std::nullopt;
  const bool skipped = !outcome.decision.apply_step;
  // An overflow the loss scale made blames no op (SkipBlame::scale_made).
  const std::string blamed = outcome.blame.scale_made ? std::string() : outcome.blame.node;
  if (skipped && !blamed.empty())
    for (const auto& l : s.model->layers())
      if (l->name() == blamed) s.precision.escalation.start_from(l->name(), l->precision());
  auto event = s.precision.escalation.observe(step, skipped, blamed);
  if (!event) return event;
  const auto& settings = s.precision.escalation.settings();
  std::string steps;
  for (std::size_t i = 0; i < event->blames.size(); ++i)
    steps += (i ? ", " : "") + std::to_string(event->blames[i]);
  std::string message;
  switch (event->kind) {
    case Escalation::Event::Kind::promote:
      message = "precision escalation at step " + std::to_string(step) + ": node '" + event->node +
                "' held the first non-finite value of " + std::to_string(event->blames.size()) +
                " skipped steps within " + std::to_string(settings.window) + " (steps " + steps +
                "); promoted " + precision_text(event->from) + " -> " + precision_text(event->to) +
                " from step " + std::to_string(step + 1) +
                (event->pinned ? "; it overflowed again after a de-escalation, so it stays "
                                 "promoted for the rest of the run (de-escalation passes over it)"
                               : "");
      break;
    case Escalation::Event::Kind::demote:
      message = "precision de-escalation at step " + std::to_string(step) + ": " +
                std::to_string(settings.deescalate_after) +
                " applied steps in a row without a skip; node '" + event->node + "' back from " +
                precision_text(event->from) + " to " + precision_text(event->to);
      break;
    case Escalation::Event::Kind::stuck:
      message = "precision escalation at step " + std::to_string(step) + ": node '" + event->node +
                "' held the first non-finite value of " + std::to_string(event->blames.size()) +
                " skipped steps (" + steps + ") but already runs in " +
                precision_text(event->from) +
                ", the widest format; the cause is elsewhere (the data, the learning rate, the "
                "loss scale)";
      break;
  }
  s.log.warn(message);
  nlohmann::json record = {{"step", step},
                           {"escalation", escalation_event_json(*event)},
                           {"escalations_standing", s.precision.escalation.promotions_standing()}};
  s.metrics.records.write(record);
  s.metrics.records.write_text(step, "precision/escalation", message);
  if (event->kind != Escalation::Event::Kind::stuck) replan_model(s);
  return event;
}

}  // namespace mixtrain::core
