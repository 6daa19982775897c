// What a run promises its resume (README, "The command line": --resume): the rows of each
// optimizer step, the learning-rate schedule's horizon and which parameters train. Internal to the
// core.
//
// Contract
// - A checkpoint's "resume" metadata entry is {"batch_size", "accumulate", "schedule_steps"},
//   JSON integers >= 1, and "frozen", the sorted names of the frozen parameters, written only when
//   there are any (resume_terms_to_json writes it; without it, nothing was frozen), and "lora",
//   graph/lora.h's lora_terms() of the run, written only with [model.lora] (without it: none), and
//   "frozen_format", graph/freezing.h's frozen_format_terms(), written only when it is not
//   "compute" (without it: compute). A
//   checkpoint from before the entry gives the same from its "config" entry (the run's resolved
//   TOML: data.batch_size, run.accumulate, run.steps; nothing frozen); with neither, or an
//   unreadable one, every term is unknown (0, nullopt): nothing checked. A malformed "resume" entry
//   is sdk::CheckpointError naming the file and the field.
// - keep_resume_terms: a data.batch_size or run.accumulate that differs from the checkpoint's is
//   sdk::CheckpointError naming both values (the sampler's order and the step's rows would
//   change); so is another set of frozen parameters, naming both sets (the optimizer's state is
//   kept per trainable parameter). A run.steps that differs from the schedule's horizon keeps the
//   horizon, or with run.stretch_schedule re-plans the schedule over the new run.steps; a warning
//   says which, with the learning rate the next step gets and the one the other choice would give
//   (none for a schedule without a horizon, lr_schedule_has_horizon, or with no step left).
// - changed_policy_options: the [precision] values (the policy's own table, the overrides,
//   [precision.escalate]) that this run gives otherwise than the checkpoint's resolved config
//   ("config" entry) recorded, each "precision.nvfp4.base = \"bf16-mixed\" -> \"fp32\""; an
//   override or escalation key only one side has is "(none)" on the other, another key only
//   one side has is passed over (written before it existed). However it was asked for (an edited
//   config, a --set, a --merge, a default that changed since) the steps from here compute
//   otherwise. Empty when they agree, the entry is absent or unreadable, or it names another
//   policy (a switch: restore_policy's).
// - changed_update_options: the options of the run's optimizer (its lr is changed_schedule's) and
//   loss scaler (but its starting scale, init_scale or scale, which the restored state or the
//   scaler itself decides), when the checkpoint's run used the same ones, and [optimizer]
//   clip_grad_norm, that
//   this run gives other values than the checkpoint's resolved config recorded, each
//   "optimizer.adamw.beta2 = 0.999 -> 0.9"; a --set counts too (the steps from here update
//   otherwise, however it was asked for); empty when they agree, the entry is absent or
//   unreadable.
// - changed_schedule: the learning-rate schedule keys ([optimizer] schedule, warmup_steps, min_lr,
//   step_size, gamma, milestones, pct_start, div_factor, final_div_factor, and the optimizer's own
//   lr when it is the same optimizer) that this run gives other values than the checkpoint's
//   resolved config recorded, each "optimizer.key = old -> new" (the optimizer's lr
//   "optimizer.adamw.lr = …"), with the schedule they made (`now` with the
//   recorded values, over the checkpoint's horizon `schedule_steps` when known) so a warning can
//   name both next rates; nullopt when they agree, the entry is absent or unreadable. A --set
//   counts too: the rate jumps however it was asked for.
// - saved_ema_decay: the [ema] decay the checkpoint's resolved config recorded; nullopt when it
//   records none (no [ema]), or the entry is absent or unreadable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/train/lr_schedule.h"
#include "mixtrain/sdk/logging.h"

namespace mixtrain::core {

struct ResumeTerms {
  std::int64_t batch_size = 0, accumulate = 0, schedule_steps = 0;  // 0: unknown
  std::optional<std::vector<std::string>> frozen;                   // sorted; nullopt: unknown
  std::optional<std::string> lora;  // lora_terms(); "none" without LoRA; nullopt: unknown
  // frozen_format_terms(); "compute" when the entry has none; nullopt: unknown
  std::optional<std::string> frozen_format;
};

nlohmann::json resume_terms_to_json(const ResumeTerms& terms);

std::vector<std::string> changed_policy_options(const std::map<std::string, std::string>& metadata,
                                                const Experiment& e);
std::vector<std::string> changed_update_options(const std::map<std::string, std::string>& metadata,
                                                const Experiment& e);
struct ScheduleChange {
  std::vector<std::string> changed;  // "key = old -> new"
  LrSchedule was;                    // the schedule the checkpoint's run followed
};
std::optional<ScheduleChange> changed_schedule(const std::map<std::string, std::string>& metadata,
                                               const Experiment& e, const LrSchedule& now,
                                               std::int64_t schedule_steps);

std::optional<double> saved_ema_decay(const std::map<std::string, std::string>& metadata);

ResumeTerms read_resume_terms(const std::map<std::string, std::string>& metadata,
                              const std::filesystem::path& file);

// How a new run under `e` starts from `checkpoint`'s weights, with its LoRA adapters folded in
// first when `merge_lora`: through checkpoint.init_from, or, for a config that starts from
// [model] from_pretrained (which init_from may not join; a run's config.toml records it as
// init_from in the gpt2 layout), through a Hugging Face folder that export writes; the text of a
// hint ("fold the adapters in first (mixtrain export …), then …").
std::string start_from_weights_route(const Experiment& e, const std::filesystem::path& checkpoint,
                                     bool merge_lora);

// `schedule` is the run's (total_steps = run.steps); `applied` the checkpoint's applied steps;
// `frozen` this run's frozen parameters, sorted.
// - keep_lora_terms: other LoRA settings than the checkpoint's are sdk::CheckpointError naming
//   both; checked before any tensor is read, since they change the adapters' shapes and places
//   (and so also what is frozen).
void keep_lora_terms(const ResumeTerms& terms, const Experiment& e,
                     const std::filesystem::path& file);

// - keep_frozen_format: another train.frozen_format or frozen_block_size than the checkpoint's is
//   sdk::CheckpointError naming both (the base the adapters trained against would change: NF4's
//   rounding of it is part of the model).
void keep_frozen_format(const ResumeTerms& terms, const Experiment& e,
                        const std::filesystem::path& file);

void keep_resume_terms(const ResumeTerms& terms, const Experiment& e,
                       const std::vector<std::string>& frozen, LrSchedule& schedule,
                       std::int64_t applied, sdk::Logger& log, const std::filesystem::path& file);

}  // namespace mixtrain::core
