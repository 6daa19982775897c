#include "train/step.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "data/image_folder/image_batch.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/sdk/support/gradient_clipping.h"
#include "profiling/profile_scope.h"
#include "train/step_statistics.h"

namespace mixtrain::core {

void update_ema(Trainer::State& s) {
  const float decay = static_cast<float>(s.e.ema.decay);
  std::vector<sdk::TensorView> ema, masters;
  for (std::size_t i = 0; i < s.ema.size(); ++i) ema.push_back(s.ema[i].view());
  for (auto* p : s.model->trainable_parameters()) masters.push_back(p->master.view());
  s.model->facets().call(sdk::ForeachOp::foreach_mul_scalar)->foreach_mul_scalar(ema, decay);
  s.model->facets().call(sdk::ForeachOp::foreach_add)->foreach_add(ema, masters, 1.0f - decay);
}

void reset_ema(Trainer::State& s) {
  const auto params = s.model->trainable_parameters();
  for (std::size_t i = 0; i < s.ema.size(); ++i)
    s.c.backend->copy(s.ema[i].view(), params[i]->master.view());
}

namespace {

// What a batch's host side reads besides its rows: fixed for a run, so a loader thread can hold
// a copy (train/batch_prefetcher.h).
struct BatchRecipe {
  const Dataset* data;
  AugmentSpec augment;
  std::vector<float> black;
  std::uint64_t seed;
  bool bytes;  // byte images gathered as bytes, for the device to decode
  // This rank's first row in the batch the sampler drew (rank_share): augmentation keys each
  // sample on its place in the drawn batch, so N ranks augment as one process does.
  std::uint64_t first_row;
};

// The device's decode table of `d` (a split, or rows copied from one: the same table), or nullptr
// when its batches travel as floats.
const Tensor* pixel_table(const Trainer::State& s, const Dataset& d) {
  if (!d.is_bytes()) return nullptr;
  for (const auto& [split, table] :
       {std::pair<const Dataset*, const Tensor*>{&s.train, &s.train_pixel_table},
        {&s.eval, &s.eval_pixel_table}})
    if (!table->empty() && d.pixel_values == split->pixel_values) return table;
  return nullptr;
}

BatchRecipe recipe_of(const Trainer::State& s, const Dataset& d) {
  return {&d,
          s.e.data.augment.spec,
          s.black,
          s.e.run.seed,
          pixel_table(s, d) != nullptr,
          static_cast<std::uint64_t>(s.reducer->rank() * s.rank_batch)};
}

// The host side of a batch: `rows` of the data gathered into `out` (grown as needed), and a
// training batch (its batch number given) augmented.
void prepare_host_batch(const BatchRecipe& r, std::span<const std::int64_t> rows,
                        std::optional<std::uint64_t> training_batch, HostBatch& out) {
  out.prepare_to_write();  // the batch sent from these buffers before may still be read
  const Dataset& d = *r.data;
  const auto n = static_cast<std::int64_t>(rows.size());
  const auto grow = [](auto& v, std::int64_t size) {
    if (static_cast<std::int64_t>(v.size()) < size) v.resize(static_cast<std::size_t>(size));
  };
  grow(out.y, n * d.labels_per_row());
  if (d.is_tokens()) {
    grow(out.ids, n * d.features);
    gather_tokens(d, rows, out.ids.data(), out.y.data());
    return;
  }
  if (d.is_image_files()) {
    // Cropped (and flipped) as each file is decoded; no augmentation after.
    const bool flip = r.augment.horizontal_flip;
    if (r.bytes) {
      grow(out.pixels, n * d.features);
      decode_image_rows(d, rows, training_batch, r.seed, r.first_row, flip, out.pixels.data(),
                        out.y.data());
    } else {
      grow(out.x, n * d.features);
      decode_image_rows_as_floats(d, rows, training_batch, r.seed, r.first_row, flip, out.x.data(),
                                  out.y.data());
    }
    return;
  }
  if (r.bytes) {
    // Augmented as bytes, filled with byte 0: decoded, the float batch below exactly.
    grow(out.pixels, n * d.features);
    gather_pixels(d, rows, out.pixels.data(), out.y.data());
    if (training_batch && r.augment.enabled())
      augment_batch(r.augment, d.sample_shape, out.pixels.data(), n, r.seed, *training_batch,
                    r.first_row);
    return;
  }
  grow(out.x, n * d.features);
  gather_batch(d, rows, out.x.data(), out.y.data());
  if (training_batch && r.augment.enabled())
    augment_batch(r.augment, d.sample_shape, r.black, out.x.data(), n, r.seed, *training_batch,
                  r.first_row);
}

void upload_batch(Trainer::State& s, const Dataset& d, std::int64_t n, const HostBatch& h) {
  auto& b = *s.c.backend;
  if (const Tensor* table = pixel_table(s, d)) {
    const std::int64_t channels = d.channels();
    const sdk::ByteImages images{h.pixels.data(), n, channels, d.features / channels};
    s.model->facets()
        .call(sdk::ImageInputOp::decode_images)
        ->decode_images(images, table->view(), s.model->input(n));
  } else {
    b.copy_from_host(s.model->input(n), d.is_tokens() ? static_cast<const void*>(h.ids.data())
                                                      : static_cast<const void*>(h.x.data()));
  }
  b.copy_from_host(s.model->labels(n), h.y.data());
}

// This rank's share of a global batch the sampler drew, and its batch number.
PrefetchJob rank_share(const Trainer::State& s, std::span<const std::int64_t> drawn,
                       BatchSampler::Cursor at) {
  const std::int64_t bs = s.rank_batch;
  // The sampler draws the global batch whatever the world size; rank r takes its r-th share,
  // so the data each step sees does not depend on how many ranks share it.
  const auto first = static_cast<std::ptrdiff_t>(s.reducer->rank() * bs);
  PrefetchJob job;
  job.rows.assign(drawn.begin() + first, drawn.begin() + first + bs);
  job.number = static_cast<std::uint64_t>(at.epoch) *
                   static_cast<std::uint64_t>(s.data.sampler->batches_per_epoch()) +
               static_cast<std::uint64_t>(at.position);
  return job;
}

}  // namespace

void feed_batch(Trainer::State& s, const Dataset& d, std::span<const std::int64_t> rows,
                std::optional<std::uint64_t> training_batch) {
  prepare_host_batch(recipe_of(s, d), rows, training_batch, s.data.host);
  upload_batch(s, d, static_cast<std::int64_t>(rows.size()), s.data.host);
}

namespace {

// Each micro-batch's loss is a mean over this replica's rows; seeding with scale / (K * N) makes
// the K micro-batches of the N replicas sum to the gradient of the global batch's mean (exactly
// `scale` when K = N = 1). Every row's gradient is then scale / global batch whatever N is, so
// an fp16 overflow, and the dynamic scaler's answer to it, do not depend on the rank count
// (docs/architecture.md, "Data parallel").
float loss_seed(const Trainer::State& s, float scale) {
  const std::int64_t shares = s.e.run.accumulate * s.reducer->world();
  return shares == 1 ? scale : scale / static_cast<float>(shares);
}

// Draws micro-batch k's global batch, keeps this rank's share of it (and its batch number, for
// a replay) and feeds it to the model.
//
// With a loader thread (data.prefetch), the batch is usually ready: the previous feed started
// preparing the sampler's next batch. A guess that no longer holds (a resume moved the cursor) is
// dropped and the batch prepared here, so the data are the same either way.
void feed_micro_batch(Trainer::State& s, std::int64_t k) {
  const auto at = static_cast<std::size_t>(k);
  const BatchSampler::Cursor cursor = s.data.sampler->cursor();
  PrefetchJob job = rank_share(s, s.data.sampler->next(), cursor);
  s.data.micro_batch_numbers[at] = job.number;
  s.data.micro_batches[at] = job.rows;
  ProfileScope scope("data");
  BatchPrefetcher* loader = s.data.prefetcher.get();
  if (loader == nullptr || !loader->take(job, s.data.host))
    prepare_host_batch(recipe_of(s, s.train), job.rows, job.number, s.data.host);
  upload_batch(s, s.train, s.rank_batch, s.data.host);
  if (loader == nullptr) return;
  // The next batch the sampler will draw, prepared while this one computes.
  const BatchSampler::Cursor next_at = s.data.sampler->cursor();
  PrefetchJob next = rank_share(s, s.data.sampler->peek(), next_at);
  std::vector<std::int64_t> rows = next.rows;
  const std::uint64_t number = next.number;
  loader->start(std::move(next),
                [recipe = recipe_of(s, s.train), rows = std::move(rows), number](HostBatch& out) {
                  prepare_host_batch(recipe, rows, number, out);
                });
}

// This process's replica: each rank's stochastic rounding draws its own bits, and its dropout the
// masks of the global batch's samples it computes (rank_share: from replica · rank_batch).
std::int64_t replica_of(const Trainer::State& s) {
  return s.c.communicator ? s.c.communicator->rank() : 0;
}

// Opens micro-batch k of the step for this replica's rows (Model::begin_micro_batch).
void open_micro_batch(Trainer::State& s, std::int64_t k) {
  const std::int64_t replica = replica_of(s);
  s.model->begin_micro_batch(k, s.e.run.accumulate, s.position.step, replica,
                             {replica * s.rank_batch, s.rank_batch});
}

// Forward, loss and backward of micro-batch k (into the step's FP32 gradients); recorded once and
// replayed when the backend offers step graphs and the step is static (train/step_graph.h).
void forward_backward(Trainer::State& s, const StepRequest& request, std::int64_t k, float seed) {
  auto& b = *s.c.backend;
  auto& model = *s.model;
  const std::int64_t bs = s.rank_batch;
  const std::int64_t micro = s.e.run.accumulate;
  const auto open_this_micro_batch = [&] { open_micro_batch(s, k); };
  open_this_micro_batch();
  StepObserver* observer = s.opt.observer;
  const bool eager = request.statistics || model.has_gradient_ready_hook() || observer != nullptr;
  const Extent extent = Extent::batch_of(bs);
  Executor::ForwardVisitor forward_visit;
  Executor::BackwardVisitor backward_visit;
  if (observer != nullptr) {
    forward_visit = [&](std::size_t node) {
      observer->after_forward(model, node, extent);
      return true;
    };
    backward_visit = [&](std::size_t node, std::span<const sdk::TensorView> input_grads) {
      observer->after_backward(model, node, extent, input_grads);
      return true;
    };
  }
  s.step_graph->run(
      {bs, seed}, eager,
      [&] {
        model.forward(bs, forward_visit);
        if (k == 0 && request.statistics && s.precision.underflow_watch)
          s.metrics.pending_underflow = gradient_underflow_record(model, s.position.step, bs, seed,
                                                                  s.c.scaler->scale(), s.log);
        // The loss stays on the device: the step's one wait is the found_inf read below.
        model.compute_loss(bs, seed, true);
        if (micro > 1) {
          if (k == 0) b.fill(s.loss_sum.view(), 0.0f);
          model.facets()
              .call(sdk::ActivationOp::axpy)
              ->axpy(1.0f / static_cast<float>(micro), model.loss_value(), s.loss_sum.view());
        }
        model.backward(bs, backward_visit);
      },
      open_this_micro_batch);
}

// What the check multiplies the gradients by: the seed already divided by the replicas' number,
// so their sum is the global batch's gradient times the scale.
float unscale_of(float scale) { return 1.0f / scale; }

// The fused unscale + non-finite check (and Σg² in the same wait).
StepTotals check_gradients(Trainer::State& s, const StepRequest& request, float scale) {
  const BoundFacets& facets = s.model->facets();
  StepTotals totals;
  const float unscale = unscale_of(scale);
  if (request.wants_norm) {
    const auto check = facets.call(sdk::GradientCheckOp::unscale_check_and_sum_squares)
                           ->unscale_check_and_sum_squares(s.grads, unscale);
    totals.found_inf = check.found_inf;
    totals.sum_squares = check.sum_of_squares;
  } else {
    totals.found_inf = facets.call(sdk::GradientCheckOp::unscale_and_check_finite)
                           ->unscale_and_check_finite(s.grads, unscale);
  }
  return totals;
}

// The step's loss on the host: the last micro-batch's values with the micro-batches' mean loss.
LossValues read_step_loss(Trainer::State& s) {
  LossValues loss = s.model->read_loss();
  if (s.e.run.accumulate > 1) s.c.backend->copy_to_host(&loss.loss, s.loss_sum.view());
  return loss;
}

// The loss this step reports: the reduction's, else read now when asked or skipped (before an
// eval overwrites the loss buffer), else the last one read.
LossValues step_loss(Trainer::State& s, const StepRequest& request, bool applied,
                     std::optional<LossValues> reduced) {
  if (!reduced && (request.read_loss || !applied)) reduced = read_step_loss(s);
  if (!reduced) {
    LossValues last;
    last.loss = s.metrics.last_loss;
    return last;
  }
  s.metrics.note_loss(reduced->loss, s.position.step);
  return *reduced;
}

// What follows an applied optimizer step, whoever made it: the replicas' gather, the EMA, the
// count and the policy's word. Returns the gradient norm (NaN unless the request wants it).
double finish_applied_step(Trainer::State& s, const StepRequest& request, double sum_squares) {
  {
    ProfileScope scope("optimizer");
    s.reducer->after_update(*s.model);
    if (!s.ema.empty()) update_ema(s);
  }
  ++s.position.applied;
  s.c.policy->on_step_end(true);
  return request.wants_norm ? std::sqrt(sum_squares) : std::numeric_limits<double>::quiet_NaN();
}

double max_norm_of(const Trainer::State& s, const StepRequest& request) {
  return request.wants_norm ? s.e.schedule.clip_grad_norm : 0.0;
}

// Clips after the unscale, then the optimizer step on the FP32 masters and the EMA update.
// Returns the gradient norm (NaN unless the request wants it).
double apply_update(Trainer::State& s, const StepRequest& request, double sum_squares, double lr) {
  // Without the norm there is no clipping: max_norm_of is 0, and the coefficient 1.
  const float coef = sdk::clip_coefficient(sum_squares, max_norm_of(s, request));
  {
    ProfileScope scope("optimizer");
    s.c.optimizer->step(*s.c.backend, s.params, {static_cast<float>(lr), coef});
  }
  return finish_applied_step(s, request, sum_squares);
}

// The step's decision with the update queued before the host reads the check (the gated update):
// the check writes found_inf and Σg² to s.gradient_status, the optimizer's update behind it reads
// them on the device (it skips on found_inf and clips from Σg²), and the host then waits for the
// status alone while the update runs. The scaler is asked first what it decides for finite
// gradients (its state saved): only if it would apply is the update queued; if the gradients
// were not finite after all, its state is restored and it decides again (a step it applies
// anyway is skipped all the same: refuse_nonfinite_update). Returns nullopt, having queued nothing
// but the check, when the scaler would skip even finite gradients: the caller then decides as
// without a gate, from `totals`, which this fills in either case.
std::optional<sdk::ScalerDecision> decide_with_gated_update(Trainer::State& s,
                                                            const StepRequest& request, float scale,
                                                            double lr, StepTotals& totals) {
  const BoundFacets& facets = s.model->facets();
  auto& scaler = *s.c.scaler;
  facets.call(sdk::GradientCheckOp::queue_unscale_check)
      ->queue_unscale_check(s.grads, unscale_of(scale), request.wants_norm,
                            s.gradient_status.view());
  const sdk::ComponentState before = scaler.save_state();
  const sdk::ScalerDecision if_finite = scaler.update(false);
  const auto read_status = [&] {
    const auto check =
        facets.get<sdk::GradientCheckFacet>("queued_check_result")->queued_check_result();
    totals.found_inf = check.found_inf;
    if (request.wants_norm) totals.sum_squares = check.sum_of_squares;
  };
  if (!if_finite.apply_step) {
    scaler.load_state(before);
    read_status();
    return std::nullopt;
  }
  {
    ProfileScope scope("optimizer");
    s.gated_optimizer->step_gated(
        *s.c.backend, s.params,
        {static_cast<float>(lr), max_norm_of(s, request), s.gradient_status.view()});
  }
  read_status();
  s.gated_optimizer->settle(!totals.found_inf);
  if (!totals.found_inf) return if_finite;
  scaler.load_state(before);
  return scaler.update(true);
}

// The first non-finite tensor of this rank's rows when the step is replayed with a check after
// every write at loss-gradient seed `seed`, micro-batch by micro-batch.
SkipBlame replay_first_nonfinite(Trainer::State& s, float seed) {
  const std::int64_t micro = s.e.run.accumulate;
  const auto alone = s.reducer->local_only();
  SkipBlame mine;
  for (std::int64_t k = 0; k < micro && !mine.found(); ++k) {
    const auto at = static_cast<std::size_t>(k);
    if (micro > 1) {
      // Micro-batch k's rows and its own random draws (dropout masks): the layers still hold
      // the last micro-batch's. Opening it again also restarts the gradients and the FP8 amaxes,
      // which a skipped step discards anyway.
      open_micro_batch(s, k);
      feed_batch(s, s.train, s.data.micro_batches[at], s.data.micro_batch_numbers[at]);
    }
    const NonfiniteSite site = locate_first_nonfinite(*s.model, s.rank_batch, seed);
    mine = SkipBlame{site.where, site.node};
    if (micro > 1) mine = mine.in_micro_batch(k, micro);
  }
  return mine;
}

// Whether the scaler answers overflows by moving its scale: it backed off at this one, or, asked
// again, it backs off within kProbes more (a hysteresis budget spent first). A static scaler, or a
// dynamic one at its floor, never does: the overflow will come again at the same scale, and a
// wider format is the fix. The probe leaves the scaler's state and the log as they were.
bool scaler_backs_off(sdk::LossScaler& scaler, const sdk::ScalerDecision& decision) {
  if (decision.scale_after < decision.scale_before) return true;
  constexpr int kProbes = 16;
  const sdk::ComponentState now = scaler.save_state();
  bool backs_off = false;
  {
    QuietLogs quiet;  // the scaler's own lines about skipped steps that never happen
    try {
      for (int i = 0; i < kProbes && !backs_off; ++i) {
        const sdk::ScalerDecision next = scaler.update(true);
        backs_off = next.scale_after < next.scale_before;
      }
    } catch (...) {
      scaler.load_state(now);
      throw;
    }
  }
  scaler.load_state(now);
  return backs_off;
}

// The scaler's scale for this step: a finite number above 0 (sdk/loss_scaler.h), or the step
// would seed the backward with it and fail far from the cause.
float checked_loss_scale(Trainer::State& s) {
  const float scale = s.c.scaler->scale();
  if (!std::isfinite(scale) || scale <= 0.0f)
    throw sdk::PluginError("scaler '" + s.e.scaler_type + "' gave a loss scale of " +
                               std::to_string(scale) + " at step " +
                               std::to_string(s.position.step),
                           "a loss scale is a finite number above 0: fix the scaler plugin, or "
                           "choose another (scaler.type)");
  return scale;
}

// A scaler that applies a step whose gradients are not finite (sdk/loss_scaler.h: update(true)
// skips): the optimizer would write them into the weights, and every later step would skip. The
// host skips it all the same, and says so once.
void refuse_nonfinite_update(Trainer::State& s, sdk::ScalerDecision& decision) {
  decision.apply_step = false;
  if (s.warned_of_scaler_contract || !s.reducer->leads()) return;
  s.warned_of_scaler_contract = true;
  s.log.warn("scaler '" + s.e.scaler_type + "' applied step " + std::to_string(s.position.step) +
             ", whose gradients are not finite; mixtrain skips such steps whatever the scaler "
             "answers (said once). A scaler's update(found_inf = true) must skip the step");
}

// Names the first non-finite tensor by replaying the step; the policy hears of the skip
// afterwards, so it discards the replays' amaxes too. Each rank replays its own rows without
// communicating; the lowest rank that found something names it for all, so every rank logs and
// escalates the same.
// Weights that are not finite come first: then nonfinite_weights names the first such parameter.
SkipBlame skip_update(Trainer::State& s, const sdk::ScalerDecision& decision,
                      std::string& nonfinite_weights) {
  ++s.position.skipped;
  // Weights that are not finite (an update made them so, or the run started from them) make every
  // later step skip at any scale: named as such, without a replay, whose forward they would fail.
  // Not an op's fault, so escalation blames none (no node).
  SkipBlame blame;
  {
    const auto alone = s.reducer->local_only();
    if (const std::string weights = first_nonfinite_parameter(*s.model); !weights.empty())
      blame = SkipBlame{"weights " + weights, ""};
  }
  blame = s.reducer->agree_on_blame(blame);
  if (blame.found()) {
    nonfinite_weights = blame.tensor.substr(std::string_view("weights ").size());
    s.c.policy->on_step_end(false);
    return blame;
  }
  blame = s.reducer->agree_on_blame(replay_first_nonfinite(s, loss_seed(s, decision.scale_before)));
  // A backward overflow under a scaler that reacts to it: when loss scale 1 does not repeat it,
  // the scale made it (a dynamic scaler's growth, or a start too high) and the back-off is the
  // fix, not a wider format. Only escalation reads the answer, so only it pays the second replay.
  std::string note;
  if (s.precision.escalation.settings().enabled && !blame.node.empty() && blame.in_backward() &&
      decision.scale_before > 1.0f && scaler_backs_off(*s.c.scaler, decision)) {
    blame.scale_made =
        !s.reducer->agree_on_blame(replay_first_nonfinite(s, loss_seed(s, 1.0f))).found();
    if (blame.scale_made)
      note = " (finite at loss scale 1: the scale made it, so escalation blames no op)";
  }
  s.c.policy->on_step_end(false);
  if (s.reducer->leads())  // the same message on every rank: once is enough
    s.log.warn(nonfinite_skip_message(s.position.step, blame.tensor_or_none(), decision) + note);
  return blame;
}

}  // namespace

namespace {

// Whether a statistics step (step % run.underflow_every == 0) lies between this step and
// run.steps: one that never comes takes no memory (a 50-step run under the default 100).
bool statistics_step_ahead(const Trainer::State& s) {
  const std::int64_t every = s.e.run.underflow_every;
  if (every <= 0) return false;
  const std::int64_t from = std::max<std::int64_t>(s.position.step, 1);
  return (from + every - 1) / every * every <= s.e.run.steps;
}

}  // namespace

NonfiniteSite run_each_step_path(Trainer::State& s,
                                 const std::function<void(std::string_view)>& after) {
  auto& model = *s.model;
  const bool statistics = statistics_step_ahead(s);
  const StepRequest request{/*wants_norm=*/true, /*statistics=*/false, /*read_loss=*/true};
  const float seed = loss_seed(s, s.c.scaler->scale());
  s.reducer->begin_step();
  s.data.micro_batches.resize(static_cast<std::size_t>(s.e.run.accumulate));
  s.data.micro_batch_numbers.resize(static_cast<std::size_t>(s.e.run.accumulate));
  // A statistics step's FP8 operand diagnostics cast each operand back through a temporary.
  if (s.c.policy->uses_scaled_operands() && statistics)
    for (auto& l : model.layers()) l->collect_operand_stats(true);
  // The other micro-batches of run.accumulate take the same path over the same buffers.
  feed_micro_batch(s, 0);
  forward_backward(s, request, 0, seed);
  after(rehearsed_path::kForwardBackward);
  if (statistics && s.precision.underflow_watch) {
    // The backward wrote gradients over activations it had read for the last time: the pass
    // reads a forward of its own, as a statistics step's comes before its backward.
    model.forward(s.rank_batch);
    measure_gradient_underflow(model, s.rank_batch, seed);
    after(rehearsed_path::kUnderflow);
  }
  s.reducer->finish_gradients();
  const StepTotals totals = check_gradients(s, request, s.c.scaler->scale());
  if (s.c.policy->uses_scaled_operands()) s.reducer->flush_operand_amaxes(model);
  after(rehearsed_path::kGradientCheck);
  // The replay a skipped step runs instead of the update, on this step's weights: before the
  // update moves them (on weights an update had made non-finite, it blamed the forward).
  NonfiniteSite site;
  {
    const auto alone = s.reducer->local_only();
    site = locate_first_nonfinite(model, s.rank_batch, seed);
  }
  after(rehearsed_path::kReplay);
  // An optimizer steps only on finite gradients (sdk/optimizer.h): gradients that are not (a
  // loss scale too large for the first step) take the update's path as zeros.
  if (totals.found_inf)
    for (const sdk::TensorView& g : s.grads) s.c.backend->fill(g, 0.0f);
  apply_update(s, request, totals.found_inf ? 0.0 : totals.sum_squares,
               s.schedule.lr_at(s.position.applied));
  after(rehearsed_path::kUpdate);
  return site;
}

StepOutcome run_training_step(Trainer::State& s, const StepRequest& request) {
  const std::int64_t micro = s.e.run.accumulate;
  auto& model = *s.model;
  auto& policy = *s.c.policy;
  s.reducer->begin_step();
  const float scale = checked_loss_scale(s);
  const float seed = loss_seed(s, scale);
  const bool fp8_statistics = request.statistics && policy.uses_scaled_operands();
  if (policy.uses_scaled_operands() && s.e.run.underflow_every > 0)
    for (auto& l : model.layers()) l->collect_operand_stats(fp8_statistics);
  s.data.micro_batches.resize(static_cast<std::size_t>(micro));
  s.data.micro_batch_numbers.resize(static_cast<std::size_t>(micro));
  for (std::int64_t k = 0; k < micro; ++k) {
    feed_micro_batch(s, k);
    s.step_in_flight = true;
    forward_backward(s, request, k, seed);
  }
  s.reducer->finish_gradients();

  ProfileScope checks_scope("gradient checks");
  StepOutcome out;
  out.lr = s.schedule.lr_at(s.position.applied);
  StepTotals totals;
  std::optional<sdk::ScalerDecision> gated_decision;
  if (s.gated_optimizer != nullptr)
    gated_decision = decide_with_gated_update(s, request, scale, out.lr, totals);
  else
    totals = check_gradients(s, request, scale);
  // The host has waited for the check, so what it reads next costs no pipeline stall, unless a
  // gated update is running: the delayed FP8 amaxes of this step's casts (never gated), and the
  // loss where this step reports or keeps it.
  if (policy.uses_scaled_operands()) s.reducer->flush_operand_amaxes(model);
  s.reducer->reduce_totals(totals, [&] { return read_step_loss(s); });
  out.decision = gated_decision ? *gated_decision : s.c.scaler->update(totals.found_inf);
  if (totals.found_inf && out.decision.apply_step) refuse_nonfinite_update(s, out.decision);
  out.loss_read = totals.loss.has_value() || request.read_loss || !out.decision.apply_step;
  out.loss = step_loss(s, request, out.decision.apply_step, totals.loss);
  // The device applied the gated update exactly when the scaler was asked and the gradients were
  // finite; any other applied step is made here.
  if (gated_decision && !totals.found_inf)
    out.grad_norm = finish_applied_step(s, request, totals.sum_squares);
  else if (out.decision.apply_step)
    out.grad_norm = apply_update(s, request, totals.sum_squares, out.lr);
  else
    out.blame = skip_update(s, out.decision, out.nonfinite_weights);
  s.step_in_flight = false;
  // The diagnostics of a skipped step measured an overflowed pass: tagged, not mixed in.
  auto write_diagnostic = [&](nlohmann::json record) {
    if (!out.decision.apply_step) record["skipped"] = true;
    s.metrics.records.write(record);
  };
  if (s.metrics.pending_underflow) {
    write_diagnostic(std::move(*s.metrics.pending_underflow));
    s.metrics.pending_underflow.reset();
  }
  if (fp8_statistics) write_diagnostic(fp8_operand_record(model, s.position.step));
  if (s.opt.observer != nullptr) s.opt.observer->after_step(s.position.step);
  return out;
}

void read_loss_after_step(Trainer::State& s, StepOutcome& step) {
  if (step.loss_read) return;
  step.loss = read_step_loss(s);
  s.metrics.note_loss(step.loss.loss, s.position.step);
  step.loss_read = true;
}

}  // namespace mixtrain::core
