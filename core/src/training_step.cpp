#include "training_step.h"

#include <cmath>

#include "step_statistics.h"

namespace mixtrain::core {

StepOutcome run_training_step(Trainer::State& s, const StepRequest& request) {
  const auto& e = s.e;
  auto& b = *s.c.backend;
  auto& model = *s.model;
  auto& policy = *s.c.policy;
  const std::int64_t bs = e.data.batch_size;
  StepOutcome out;

  // batch (host) -> device
  const auto idx = s.sampler->next();
  gather_batch(s.train, idx, s.x_host.data(), s.y_host.data());
  b.copy_from_host(model.input(bs), s.x_host.data());
  b.copy_from_host(model.labels(bs), s.y_host.data());

  // forward, loss, backward
  const float scale = s.c.scaler->scale();
  const bool fp8_statistics = request.statistics && policy.uses_scaled_operands();
  if (policy.uses_scaled_operands() && e.run.underflow_every > 0)
    for (auto& l : model.layers()) l->collect_operand_stats(fp8_statistics);
  model.forward(bs);
  if (request.statistics && s.underflow_watch)
    s.metrics.write(gradient_underflow_record(model, s.step, bs, scale, s.log));
  // The loss stays on the device: the step's one wait is the found_inf read below.
  model.compute_loss(bs, scale, true);
  model.backward(bs);

  // unscale + non-finite check (and Σg² in the same wait)
  bool found_inf = false;
  double grad_sum_squares = std::nan("");
  if (request.wants_norm) {
    const auto check = elementwise_of(b).unscale_check_and_sum_squares(s.grads, 1.0f / scale);
    found_inf = check.found_inf;
    grad_sum_squares = check.sum_of_squares;
  } else {
    found_inf = elementwise_of(b).unscale_and_check_finite(s.grads, 1.0f / scale);
  }
  // The device is idle now, so what the host reads next costs no pipeline stall: the delayed
  // FP8 amaxes of this step's casts, and the loss where this step reports or keeps it.
  if (policy.uses_scaled_operands()) model.flush_operand_amaxes();
  out.decision = s.c.scaler->update(found_inf);
  out.loss.loss = s.last_loss;
  if (request.read_loss || !out.decision.apply_step) {
    out.loss = model.read_loss();  // before an eval overwrites the loss buffer
    s.last_loss = out.loss.loss;
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
    s.c.optimizer->step(b, s.params, {static_cast<float>(out.lr), coef});
    ++s.applied;
    policy.on_step_end(true);
  } else {
    ++s.skipped;
    // Name the first non-finite tensor by replaying the step with a check after every write;
    // the policy hears of the skip afterwards, so it discards the replay's amaxes too.
    out.first_nonfinite = model.locate_first_nonfinite(bs, out.decision.scale_before);
    policy.on_step_end(false);
    s.log.warn(nonfinite_skip_message(
        s.step, out.first_nonfinite.empty() ? "none on replay" : out.first_nonfinite,
        out.decision));
  }
  if (fp8_statistics) s.metrics.write(fp8_operand_record(model, s.step));
  return out;
}

}  // namespace mixtrain::core
