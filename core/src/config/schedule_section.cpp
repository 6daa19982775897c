// The schedule keys of [optimizer]; see config/schedule_section.h for the contract.
#include "config/schedule_section.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "config/reading.h"
#include "mixtrain/core/config/choices.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/train/lr_schedule.h"

namespace mixtrain::core {

namespace {

// The schedule keys each schedule reads (warm-up, decay); the others given are reported unused.
std::vector<std::string> schedule_keys(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::warmup_cosine:
    case LrScheduleKind::linear:
      return {"warmup_steps", "min_lr"};
    case LrScheduleKind::step:
      return {"warmup_steps", "step_size", "gamma"};
    case LrScheduleKind::multistep:
      return {"warmup_steps", "milestones", "gamma"};
    case LrScheduleKind::onecycle:
      return {"pct_start", "div_factor", "final_div_factor"};
    case LrScheduleKind::inverse_sqrt:
      return {"warmup_steps"};
    case LrScheduleKind::constant:
      break;
  }
  return {};
}

std::string with_schedule(const ScheduleSettings& s) {
  return " with schedule = \"" + std::string(choice_name(s.schedule, kLrScheduleKinds)) + "\"";
}

// multistep: at least one milestone, each >= 1, strictly increasing.
void check_milestones(const sdk::Options& o, const ScheduleSettings& s) {
  if (s.milestones.empty())
    o.fail("milestones", "is empty" + with_schedule(s),
           "give the steps (counted after warm-up) at which lr is multiplied by gamma, e.g. "
           "milestones = [100, 200]");
  for (std::size_t i = 0; i < s.milestones.size(); ++i) {
    if (s.milestones[i] < 1)
      o.fail("milestones",
             "entry " + std::to_string(i) + " is " + std::to_string(s.milestones[i]) +
                 ", expected a step >= 1",
             "a milestone is a step count after warm-up; the schedule starts at base lr");
    if (i > 0 && s.milestones[i] <= s.milestones[i - 1])
      o.fail("milestones",
             "is not strictly increasing: entry " + std::to_string(i) + " (" +
                 std::to_string(s.milestones[i]) + ") follows " +
                 std::to_string(s.milestones[i - 1]),
             "sort the steps and list each once (for gamma^2 at one step, lower gamma)");
  }
}

// multistep: a milestone the run never reaches (they count after warm-up) is valid, and a resumed
// run may raise run.steps to reach it, but it is more likely a typo: warn, naming it.
void warn_of_unreached_milestones(const sdk::Options& o, Experiment& e) {
  const auto& s = e.schedule;
  for (std::size_t i = 0; i < s.milestones.size(); ++i) {
    // Compared without the sum, which a milestone near INT64_MAX would overflow.
    if (s.milestones[i] <= e.run.steps - s.warmup_steps) continue;
    const std::int64_t at =
        s.milestones[i] > std::numeric_limits<std::int64_t>::max() - s.warmup_steps
            ? std::numeric_limits<std::int64_t>::max()
            : s.warmup_steps + s.milestones[i];
    e.config_warnings.push_back(
        "optimizer.milestones (" + o.where("milestones").to_string() + "): entry " +
        std::to_string(i) + " (" + std::to_string(s.milestones[i]) +
        (s.warmup_steps > 0 ? ", after " + std::to_string(s.warmup_steps) +
                                  " warm-up steps: step " + std::to_string(at)
                            : std::string()) +
        ") is beyond run.steps = " + std::to_string(e.run.steps) +
        ": that decay never happens; lower it or raise run.steps");
  }
}

// Valid values that are more likely slips than plans, each a warning naming its key: a warm-up
// that never ends (the rate never reaches lr, and nothing decays; a resumed run may raise
// run.steps), and rates that rise above the peak (gamma > 1, onecycle's divisors below 1), which
// the optimizer's own lr cap does not see.
void warn_of_unlikely_schedule(const sdk::Options& o, Experiment& e) {
  const auto& s = e.schedule;
  const auto warn = [&](const char* key, const std::string& text) {
    e.config_warnings.push_back(std::string("optimizer.") + key + " (" + o.where(key).to_string() +
                                "): " + text);
  };
  const auto keys = schedule_keys(s.schedule);
  const auto reads = [&](const char* key) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  if (reads("warmup_steps") && s.warmup_steps > 0 && s.warmup_steps >= e.run.steps)
    warn("warmup_steps",
         std::to_string(s.warmup_steps) +
             " is not below run.steps = " + std::to_string(e.run.steps) +
             (s.warmup_steps > e.run.steps ? ": the lr never reaches optimizer.lr"
                                           : ": the lr reaches optimizer.lr at the last step") +
             " and nothing decays; lower warmup_steps or raise run.steps");
  if (reads("gamma") && s.gamma > 1.0)
    warn("gamma", sdk::option_value_to_string(s.gamma) +
                      " multiplies the lr up at every decay, past optimizer.lr; a decay uses "
                      "gamma < 1 (0.1 is the usual)");
  if (reads("div_factor") && s.div_factor < 1.0)
    warn("div_factor", sdk::option_value_to_string(s.div_factor) +
                           " starts onecycle at lr / div_factor, above optimizer.lr; "
                           "div_factor > 1 starts below it (25 is torch's)");
  if (reads("final_div_factor") && s.div_factor >= 1.0 && s.div_factor * s.final_div_factor < 1.0)
    warn("final_div_factor",
         sdk::option_value_to_string(s.final_div_factor) +
             " ends onecycle at lr / (div_factor x final_div_factor), above optimizer.lr; "
             "final_div_factor > 1 ends below it (1e4 is torch's)");
}

// onecycle: a rising phase of more than one step, and none of the keys it has counterparts of.
void check_onecycle(const sdk::Options& o, const ScheduleSettings& s, std::int64_t steps) {
  if (s.pct_start >= 1.0)
    o.fail("pct_start", "is " + sdk::option_value_to_string(s.pct_start) + ", expected < 1",
           "pct_start is the share of run.steps spent rising to lr; the rest anneals down, "
           "e.g. 0.3");
  const double rising = s.pct_start * static_cast<double>(steps);
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", rising);
  if (rising <= 1.0)
    o.fail("pct_start",
           "times run.steps (" + std::to_string(steps) + ") is " + text +
               ": onecycle's rising phase must span more than one step",
           "raise pct_start or run.steps");
  // onecycle has its own counterparts of these two; a value here was meant for another
  // schedule or misread as one of them.
  if (s.warmup_steps > 0)
    o.fail("warmup_steps", "does not apply" + with_schedule(s),
           "onecycle warms up over pct_start x run.steps steps; set warmup_steps = 0 and "
           "choose pct_start");
  if (s.min_lr > 0.0)
    o.fail("min_lr", "does not apply" + with_schedule(s),
           "onecycle ends at lr / (div_factor x final_div_factor); set min_lr = 0 and choose "
           "final_div_factor");
}

// warmup_cosine, linear: a decay that ends above its peak is a typo of one or the other; the
// optimizer's lr is known only to optimizers that declare one.
void check_min_lr_below_lr(const sdk::Options& o, const ScheduleSettings& s,
                           const sdk::Options& optimizer) {
  for (const auto& [key, value] : optimizer.effective())
    if (const auto* lr = std::get_if<double>(&value); key == "lr" && lr && s.min_lr > *lr)
      o.fail("min_lr",
             "is " + sdk::option_value_to_string(s.min_lr) +
                 ", above optimizer.lr = " + sdk::option_value_to_string(*lr),
             "the schedule decays from lr down to min_lr; lower min_lr");
}

// Schedule keys given away from their defaults that the chosen schedule does not read.
void report_unused_schedule_keys(const sdk::Options& o, Experiment& e) {
  const auto& s = e.schedule;
  const auto used = schedule_keys(s.schedule);
  const auto schema = schedule_schema();
  for (const std::string key : {"warmup_steps", "min_lr", "step_size", "gamma", "milestones",
                                "pct_start", "div_factor", "final_div_factor"})
    if ((key == "milestones" ? !s.milestones.empty() : set_away_from_default(o, schema, key)) &&
        std::find(used.begin(), used.end(), key) == used.end())
      e.unused_keys.push_back(std::string("optimizer.") + key + " (" + o.where(key).to_string() +
                              ") is not read by schedule = \"" +
                              std::string(choice_name(s.schedule, kLrScheduleKinds)) + "\"");
}

}  // namespace

// [optimizer]'s schedule keys, checked together (each key's own range is in the schema).
void read_schedule(const Config& config, const sdk::Options& o, Experiment& e) {
  auto& s = e.schedule;
  s.schedule = parse_choice(o, "schedule", kLrScheduleKinds);
  s.warmup_steps = o.get_int("warmup_steps");
  s.min_lr = o.get_double("min_lr");
  s.step_size = o.get_int("step_size");
  s.gamma = o.get_double("gamma");
  s.milestones = config.integer_array("optimizer.milestones");
  s.pct_start = o.get_double("pct_start");
  s.div_factor = o.get_double("div_factor");
  s.final_div_factor = o.get_double("final_div_factor");
  s.clip_grad_norm = o.get_double("clip_grad_norm");
  if (s.schedule == LrScheduleKind::multistep) {
    check_milestones(o, s);
    warn_of_unreached_milestones(o, e);
  }
  if (s.schedule == LrScheduleKind::onecycle) check_onecycle(o, s, e.run.steps);
  if (s.schedule == LrScheduleKind::inverse_sqrt && s.warmup_steps < 1)
    o.fail("warmup_steps", "is 0" + with_schedule(s),
           "inverse_sqrt decays as lr x sqrt(warmup_steps / step) after warming up; set "
           "warmup_steps >= 1 (e.g. 4000 for a Transformer)");
  if (s.schedule == LrScheduleKind::warmup_cosine || s.schedule == LrScheduleKind::linear)
    check_min_lr_below_lr(o, s, e.optimizer_options);
  warn_of_unlikely_schedule(o, e);
  report_unused_schedule_keys(o, e);
}

}  // namespace mixtrain::core
