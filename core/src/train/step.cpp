#include "train/step.h"

#include <cmath>

#include "distributed/rank_agreement.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "profiling/profile_scope.h"
#include "train/step_statistics.h"

namespace mixtrain::core {

void update_ema(Trainer::State& s) {
  const float decay = static_cast<float>(s.e.ema.decay);
  std::vector<sdk::TensorView> ema, masters;
  for (std::size_t i = 0; i < s.ema.size(); ++i) ema.push_back(s.ema[i].view());
  for (auto* p : s.model->parameters()) masters.push_back(p->master.view());
  s.model->facets().call(sdk::ForeachOp::foreach_mul_scalar)->foreach_mul_scalar(ema, decay);
  s.model->facets().call(sdk::ForeachOp::foreach_add)->foreach_add(ema, masters, 1.0f - decay);
}

void reset_ema(Trainer::State& s) {
  const auto params = s.model->parameters();
  for (std::size_t i = 0; i < s.ema.size(); ++i)
    s.c.backend->copy(s.ema[i].view(), params[i]->master.view());
}

void feed_batch(Trainer::State& s, const Dataset& d, std::span<const std::int64_t> rows,
                std::optional<std::uint64_t> training_batch) {
  auto& b = *s.c.backend;
  const auto n = static_cast<std::int64_t>(rows.size());
  if (d.is_tokens()) {
    gather_tokens(d, rows, s.ids_host.data(), s.y_host.data());
    b.copy_from_host(s.model->input(n), s.ids_host.data());
  } else {
    gather_batch(d, rows, s.x_host.data(), s.y_host.data());
    if (training_batch && s.e.data.augment.spec.enabled())
      augment_batch(s.e.data.augment.spec, d.sample_shape, s.black, s.x_host.data(), n,
                    s.e.run.seed, *training_batch);
    b.copy_from_host(s.model->input(n), s.x_host.data());
  }
  b.copy_from_host(s.model->labels(n), s.y_host.data());
}

StepOutcome run_training_step(Trainer::State& s, const StepRequest& request) {
  const auto& e = s.e;
  auto& b = *s.c.backend;
  auto& model = *s.model;
  auto& policy = *s.c.policy;
  // Data parallel: each rank computes its rank_batch rows of the global batch.
  const std::int64_t bs = s.rank_batch;
  const std::int64_t micro = e.run.accumulate;
  DataParallel* dp = s.dp.get();
  if (dp != nullptr) dp->begin_step();
  StepOutcome out;
  const float scale = s.c.scaler->scale();
  // Each micro-batch's loss is a mean over its rows; seeding with scale / K makes the K
  // contributions sum to the gradient of their mean (exactly `scale` when K = 1).
  const float seed = micro == 1 ? scale : scale / static_cast<float>(micro);
  const bool fp8_statistics = request.statistics && policy.uses_scaled_operands();
  if (policy.uses_scaled_operands() && e.run.underflow_every > 0)
    for (auto& l : model.layers()) l->collect_operand_stats(fp8_statistics);
  s.micro_batches.resize(static_cast<std::size_t>(micro));
  s.micro_batch_numbers.resize(static_cast<std::size_t>(micro));
  for (std::int64_t k = 0; k < micro; ++k) {
    // batch (host) -> device
    auto& idx = s.micro_batches[static_cast<std::size_t>(k)];
    const auto cursor = s.sampler->cursor();
    const auto number = static_cast<std::uint64_t>(cursor.epoch) *
                            static_cast<std::uint64_t>(s.sampler->batches_per_epoch()) +
                        static_cast<std::uint64_t>(cursor.position);
    s.micro_batch_numbers[static_cast<std::size_t>(k)] = number;
    const auto drawn = s.sampler->next();
    // The sampler draws the global batch whatever the world size; rank r takes its r-th share,
    // so the data each step sees does not depend on how many ranks share it.
    const std::size_t first = dp != nullptr ? static_cast<std::size_t>(dp->rank() * bs) : 0;
    idx.assign(drawn.begin() + static_cast<std::ptrdiff_t>(first),
               drawn.begin() + static_cast<std::ptrdiff_t>(first + static_cast<std::size_t>(bs)));
    {
      ProfileScope scope("data");
      feed_batch(s, s.train, idx, number);
    }

    // forward, loss, backward (into the step's FP32 gradients); recorded once and replayed when
    // the backend offers step graphs and the step is static (train/step_graph.h)
    model.begin_micro_batch(k, micro, s.step);
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
    s.step_graph->run({bs, seed}, eager, [&] {
      model.forward(bs, forward_visit);
      if (k == 0 && request.statistics && s.underflow_watch)
        s.metrics.write(gradient_underflow_record(model, s.step, bs, seed, s.log));
      // The loss stays on the device: the step's one wait is the found_inf read below.
      model.compute_loss(bs, seed, true);
      if (micro > 1) {
        if (k == 0) b.fill(s.loss_sum.view(), 0.0f);
        model.facets()
            .call(sdk::ActivationOp::axpy)
            ->axpy(1.0f / static_cast<float>(micro), model.loss_value(), s.loss_sum.view());
      }
      model.backward(bs, backward_visit);
    });
  }

  // Data parallel: every bucket reduced (started during backward where it could be).
  if (dp != nullptr) {
    ProfileScope scope("gradient all-reduce");
    dp->finish_gradients();
  }

  // unscale + non-finite check (and Σg² in the same wait). Data parallel: the buckets hold the
  // ranks' sum, so the unscale also divides by the world size.
  bool found_inf = false;
  double grad_sum_squares = std::nan("");
  ProfileScope checks_scope("gradient checks");
  const float unscale =
      dp == nullptr ? 1.0f / scale : 1.0f / (scale * static_cast<float>(dp->world()));
  if (request.wants_norm) {
    const auto check = model.facets()
                           .call(sdk::GradientCheckOp::unscale_check_and_sum_squares)
                           ->unscale_check_and_sum_squares(s.grads, unscale);
    found_inf = check.found_inf;
    grad_sum_squares = check.sum_of_squares;
  } else {
    found_inf = model.facets()
                    .call(sdk::GradientCheckOp::unscale_and_check_finite)
                    ->unscale_and_check_finite(s.grads, unscale);
  }
  // The device is idle now, so what the host reads next costs no pipeline stall: the delayed
  // FP8 amaxes of this step's casts, and the loss where this step reports or keeps it.
  if (policy.uses_scaled_operands()) {
    if (dp != nullptr)
      model.flush_operand_amaxes([&](std::span<float> amaxes) { dp->max_reduce(amaxes); });
    else
      model.flush_operand_amaxes();
  }
  if (dp != nullptr) {
    // One host all-reduce a step: every rank skips, clips and reports the same.
    LossValues local = model.read_loss();
    if (micro > 1) b.copy_to_host(&local.loss, s.loss_sum.view());
    const auto totals = dp->reduce_totals(found_inf, grad_sum_squares, local.loss);
    found_inf = totals.found_inf;
    grad_sum_squares = totals.sum_squares;
    out.loss = local;
    out.loss.loss = static_cast<float>(totals.loss);
  }
  out.decision = s.c.scaler->update(found_inf);
  if (dp != nullptr) {
    s.last_loss = out.loss.loss;
  } else {
    out.loss.loss = s.last_loss;
    if (request.read_loss || !out.decision.apply_step) {
      out.loss = model.read_loss();  // before an eval overwrites the loss buffer
      if (micro > 1) b.copy_to_host(&out.loss.loss, s.loss_sum.view());
      s.last_loss = out.loss.loss;
    }
  }

  // clip, then step or skip
  out.lr = s.schedule.lr_at(s.applied);
  if (out.decision.apply_step) {
    float coef = 1.0f;
    if (request.wants_norm) {
      out.grad_norm = std::sqrt(grad_sum_squares);
      if (e.schedule.clip_grad_norm > 0.0 && out.grad_norm > e.schedule.clip_grad_norm)
        coef = static_cast<float>(e.schedule.clip_grad_norm / (out.grad_norm + 1e-6));
    }
    {
      ProfileScope scope("optimizer");
      s.c.optimizer->step(b, s.params, {static_cast<float>(out.lr), coef});
      // Sharded: each rank updated its shard; every rank needs every master.
      if (dp != nullptr && dp->sharded()) dp->gather_masters(model);
      if (!s.ema.empty()) update_ema(s);
    }
    ++s.applied;
    policy.on_step_end(true);
  } else {
    ++s.skipped;
    // Name the first non-finite tensor by replaying the step with a check after every write,
    // micro-batch by micro-batch; the policy hears of the skip afterwards, so it discards the
    // replay's amaxes too.
    const float replay_seed = micro == 1 ? out.decision.scale_before
                                         : out.decision.scale_before / static_cast<float>(micro);
    // Each rank replays its own rows, without communicating; the lowest rank that found a
    // non-finite value names it for all, so every rank logs and escalates the same.
    if (dp != nullptr) dp->set_hook_enabled(false);
    for (std::int64_t k = 0; k < micro && out.first_nonfinite.empty(); ++k) {
      if (micro > 1) {
        feed_batch(s, s.train, s.micro_batches[static_cast<std::size_t>(k)],
                   s.micro_batch_numbers[static_cast<std::size_t>(k)]);
      }
      const NonfiniteSite site = locate_first_nonfinite(model, bs, replay_seed);
      out.first_nonfinite = site.where;
      out.blamed_node = site.node;
      if (micro > 1 && !out.first_nonfinite.empty())
        out.first_nonfinite = "micro-batch " + std::to_string(k + 1) + " of " +
                              std::to_string(micro) + ": " + out.first_nonfinite;
    }
    if (dp != nullptr) {
      dp->set_hook_enabled(true);
      const std::string found =
          lowest_rank_text(dp->communicator(), out.first_nonfinite.empty()
                                                   ? std::string()
                                                   : out.first_nonfinite + '\n' + out.blamed_node)
              .text;
      const auto cut = found.find('\n');
      out.first_nonfinite = found.substr(0, cut);
      out.blamed_node = cut == std::string::npos ? std::string() : found.substr(cut + 1);
    }
    policy.on_step_end(false);
    if (dp == nullptr || dp->rank() == 0)  // the same message on every rank: once is enough
      s.log.warn(nonfinite_skip_message(
          s.step, out.first_nonfinite.empty() ? "none on replay" : out.first_nonfinite,
          out.decision));
  }
  if (fp8_statistics) s.metrics.write(fp8_operand_record(model, s.step));
  if (s.opt.observer != nullptr) s.opt.observer->after_step(s.step);
  return out;
}

}  // namespace mixtrain::core
