// The Trainer's checkpoints out: the whole training state on the host (capture_state, behind
// training_state; its weights part for `export --initial`), written by save_checkpoint with the
// run's retention (checkpoint.keep). Reading them back is checkpoint_load.cpp; the best
// checkpoint (checkpoint.keep_best) is best_checkpoint.cpp.
//
// Tensor names: "param/<node>.<param>" (FP32: the masters, and a frozen parameter's one copy
// widened), "buffer/<node>.<buffer>" (non-trainable state), "optimizer/<slot>" and
// "ema/<node>.<param>" (with [ema]), both of trainable parameters only.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoint/state.h"
#include "config/resolved_values.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/core/data/data_shape.h"
#include "mixtrain/core/graph/lora.h"
#include "mixtrain/core/plugins/plugin_fault.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "mixtrain/sdk/version.h"
#include "runs/component_history_json.h"
#include "train/host_tensor.h"
#include "train/planned_model.h"
#include "train/resume_terms.h"
#include "train/trainer_state.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

nlohmann::json normalization_json(const ChannelStats& stats) {
  return {{"mean", stats.mean}, {"std", stats.std}};
}

// A component's state with the run's counters when it began (run_position.h), when a resume
// switched to it: its counters count from there.
json with_origin(json state, const StateOrigin& since) {
  if (since.step > 0) state["since_step"] = since.step;
  if (since.applied > 0) state["since_applied"] = since.applied;
  if (since.skipped > 0) state["since_skipped"] = since.skipped;
  return state;
}

}  // namespace

// trainer_state.h
std::vector<std::string> frozen_names(Model& model) {
  std::vector<std::string> out;
  for (const ModelParameter* p : model.parameters())
    if (p->frozen) out.push_back(p->name);
  std::sort(out.begin(), out.end());
  return out;
}

// trainer_state.h
// trainer_state.h
ComponentHistory current_history(const Trainer::State& s) {
  ComponentHistory h = s.history;
  extend_history(h, {s.history_first_step, s.e.policy_name, s.c.policy->resolved_name(),
                     s.e.scaler_type, s.e.optimizer_type});
  return h;
}

StagedState stage_state(Trainer::State& s, bool weights_only, bool for_save) {
  const auto& b = s.c.backend;
  StagedState st;
  // Frozen parameters leave as FP32 too (their one copy widened, a quantized weight decoded): a
  // checkpoint's weights read the same whatever trained, and a quantized weight quantizes back to
  // the same decoded values on resume (graph/quantized_weight.h, "Round trip").
  for (auto* p : s.model->parameters())
    st.tensors.push_back(staged_parameter(b, "param/" + p->name, *p));
  for (auto* buf : s.model->buffers())
    st.tensors.push_back(staged_view(b, "buffer/" + buf->name, buf->value.view()));
  if (!weights_only) {
    // Whole slots (gathered from every rank's shard when sharded, which is collective: here, or
    // for a save as the format reads them): the file is a one-rank run's, so it resumes on any
    // number of ranks (docs/architecture.md, "Data parallel").
    for (auto& t : for_save ? s.reducer->optimizer_state_for_save(*s.c.optimizer)
                            : s.reducer->optimizer_state(*s.c.optimizer)) {
      t.info.name = "optimizer/" + t.info.name;
      st.tensors.push_back(std::move(t));
    }
    const auto trainable = s.model->trainable_parameters();
    for (std::size_t i = 0; i < s.ema.size(); ++i)
      st.tensors.push_back(staged_view(b, "ema/" + trainable[i]->name, s.ema[i].view()));
  }
  // A session without the training split (TrainOptions::splits) has drawn no batch.
  const auto cursor = s.data.sampler ? s.data.sampler->cursor() : BatchSampler::Cursor{};
  st.metadata["mixtrain.state_version"] = kTrainingStateVersion;
  st.metadata["mixtrain.version"] = sdk::kSdkVersion;
  st.metadata["progress"] = progress_to_json({s.position.step, s.position.applied,
                                              s.position.skipped, s.metrics.last_loss})
                                .dump();
  st.metadata["sampler"] = json{{"epoch", cursor.epoch},
                                {"position", cursor.position},
                                {"seed", s.e.run.seed},
                                {"rows", s.train.rows},
                                {"train_data", s.train_fingerprint},
                                {"eval_data", s.eval_fingerprint}}
                               .dump();
  st.metadata["scaler"] =
      with_origin(component_state_to_json(s.e.scaler_type, s.c.scaler->save_state()),
                  s.position.scaler_since)
          .dump();
  {
    json policy = with_origin(component_state_to_json(s.e.policy_name, s.c.policy->save_state()),
                              s.position.policy_since);
    // What a choosing policy (auto) chose for this backend: a resume elsewhere may choose
    // otherwise (restore_policy, checkpoint_load.cpp).
    if (const std::string resolved = s.c.policy->resolved_name(); !resolved.empty())
      policy["resolved"] = resolved;
    st.metadata["policy"] = policy.dump();
  }
  st.metadata["optimizer"] =
      with_origin(component_state_to_json(s.e.optimizer_type, s.c.optimizer->save_state()),
                  s.position.optimizer_since)
          .dump();
  st.metadata["config"] = resolved_toml(s.e);
  st.metadata["history"] = component_history_to_json(current_history(s)).dump();
  // The preprocessing the weights expect, for whoever runs them elsewhere (export carries it).
  if (!s.normalization.mean.empty())
    st.metadata["normalization"] = normalization_json(s.normalization).dump();
  // A table or image model's input shape and classes: `predict` builds the model from them
  // without the data files (data/data_shape.h).
  if (!s.train.is_tokens()) st.metadata["data_shape"] = data_shape_json(data_shape_of(s.train));
  st.metadata["resume"] =
      resume_terms_to_json({s.e.data.batch_size, s.e.run.accumulate, s.schedule.total_steps,
                            frozen_names(*s.model), lora_terms(s.e.model.lora),
                            frozen_format_terms(s.e.model.freeze)})
          .dump();
  json watch = json::object();
  if (s.metrics.early_stopping)
    watch["early_stopping"] = watched_metric_to_json(s.metrics.early_stopping->state);
  if (s.metrics.keep_best) watch["keep_best"] = watched_metric_to_json(s.metrics.keep_best->state);
  if (!watch.empty()) st.metadata["watch"] = watch.dump();
  // The promotions are part of the plan the weights were trained under; the blames count on.
  if (s.e.escalate.enabled || s.precision.escalation.any_promoted() ||
      !s.precision.escalation.events().empty())
    st.metadata["escalation"] = s.precision.escalation.to_json().dump();
  return st;
}

sdk::TrainingState capture_state(Trainer::State& s, bool weights_only) {
  return materialise(stage_state(s, weights_only));
}

sdk::TrainingState Trainer::training_state(bool weights_only) const {
  return capture_state(*s_, weights_only);
}

std::size_t Trainer::optimizer_state_bytes() const {
  std::size_t bytes = 0;
  for (const auto& t : stage_state(*s_, /*weights_only=*/false).tensors)
    if (t.info.name.starts_with("optimizer/")) bytes += staged_bytes(t.info);
  return bytes;
}

// trainer_state.h
SaveReadsEnd::~SaveReadsEnd() {
  try {
    reducer.end_save_reads();
  } catch (const std::exception&) {
    // The save's own error, if any, is the one to report; a replica that cannot hear the end
    // fails on its next collective.
  }
}

// trainer_state.h
std::optional<fs::path> newest_checkpoint_before(const Trainer::State& s, std::int64_t step) {
  const auto extension = s.c.checkpoint_format->file_extension();
  std::optional<fs::path> last;
  for (const auto& file : step_checkpoints(s.run_dir / "checkpoints", extension))
    if (checkpoint_step(file, extension).value_or(0) < step) last = file;
  return last;
}

fs::path Trainer::save_checkpoint() {
  auto& s = *s_;
  if (!s.writes) {  // a data-parallel rank other than 0: its part of the gathers only
    s.reducer->serve_save_reads(*s.c.optimizer);
    return {};
  }
  // Before the staging: however the save ends, the other ranks are let out of their gathers.
  const SaveReadsEnd reads_end{*s.reducer};
  StagedState st = stage_state(s, /*weights_only=*/false, /*for_save=*/true);

  char name[64];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(s.position.step));
  fs::path dir = s.run_dir / "checkpoints";
  fs::path path = dir / (name + s.c.checkpoint_format->file_extension());
  // A save killed midway (kill -9, power loss) leaves its temporary file; each save removes those
  // that no live writer holds.
  for (const auto& stale : sdk::remove_stale_temp_files(dir))
    s.log.info("removed " + stale.string() + ", left by an interrupted checkpoint write");
  // Weights that are not finite are never written: with checkpoint.keep, the file would push out
  // the last good one. A skipped step stops the run first where they feed the loss (trainer.cpp);
  // this holds for any other (a weight the loss does not read). Each weight is checked the first
  // time the format reads it: the native format reads every tensor for its checksums before it
  // writes, and a format that stops partway leaves no file (sdk/format_streamed_write.h).
  // What a read throws, that refusal or the backend's error, is the host's, not the format's: it
  // comes out of the save as it was thrown.
  bool host_threw = false;
  std::vector<bool> checked(st.tensors.size(), false);
  for (std::size_t i = 0; i < st.tensors.size(); ++i) {
    auto& t = st.tensors[i];
    const bool weight = t.info.name.starts_with("param/");
    t.read = [&, i, weight, read = std::move(t.read),
              tensor = t.info.name](std::span<std::byte> buffer) {
      std::span<const std::byte> bytes;
      try {
        bytes = read(buffer);
      } catch (...) {
        host_threw = true;
        throw;
      }
      if (!weight || checked[i]) return bytes;
      checked[i] = true;
      if (const auto bad = first_nonfinite_fp32(sdk::DType::fp32, bytes)) {
        const auto last = newest_checkpoint_before(s, s.position.step);
        host_threw = true;
        throw sdk::CheckpointError(
            "not writing " + path.string() + ": tensor '" + tensor + "' holds " + *bad +
                "; a checkpoint of weights that are not finite would replace the run's good ones",
            last ? "the newest checkpoint this run has is " + last->string() + ": go on from it (" +
                       continue_route(s, *last, s.run_dir) +
                       ") with a lower optimizer.lr, or check the optimizer plugin that made them"
                 : "this run has no checkpoint yet: check optimizer.lr and the weights it started "
                   "from");
      }
      return bytes;
    };
  }
  // Whatever the format throws ends the run here: say which save failed, what the run leaves to
  // continue from (a full disk is the usual cause) and, for a plugin's format, whose code it was.
  std::error_code ec;
  const bool existed = fs::exists(fs::symlink_status(path, ec));
  const auto failed = [&](const std::string& what) {
    const NamedFormat* named = named_format_of(s.c, *s.c.checkpoint_format);
    const std::string format =
        named != nullptr ? named->label() : "checkpoint format '" + s.e.checkpoint.format + "'";
    const std::optional<fs::path> last = newest_checkpoint_before(s, s.position.step);
    // A format that writes in place (not through sdk::AtomicFileWriter) may leave a torn file,
    // which --resume would take for the newest checkpoint. One the save created is removed; one
    // that was there before is not the host's to delete.
    std::string left;
    std::error_code gone;
    if (!existed && fs::exists(fs::symlink_status(path, gone))) {
      if (fs::remove(path, gone) && !gone)
        left = "; removed what the format left at " + path.string();
      else
        left = "; it left " + path.string() + ", which could not be removed (" + gone.message() +
               "): delete it before resuming";
    } else if (existed && (named == nullptr || !named->builtin)) {
      // mixtrain's own formats write through sdk::AtomicFileWriter: the old file stays whole.
      left = "; " + path.string() + " was there before this save, and " + format +
             " may have damaged it: do not resume from it";
    }
    return std::pair{
        "the step-" + std::to_string(s.position.step) + " checkpoint was not written: " + format +
            " failed writing " + path.string() + ": " + what + left +
            (last ? "; the newest checkpoint this run has is " + last->string()
                  : "; this run has no checkpoint yet"),
        // Not the run folder when the damaged file is there: --resume RUN would
        // take it for the newest.
        last ? "continue it with " + continue_route(s, *last,
                                                    existed && (named == nullptr || !named->builtin)
                                                        ? *last
                                                        : s.run_dir)
             : std::string()};
  };
  try {
    write_staged(*s.c.checkpoint_format, path, st);
  } catch (const sdk::UserError& e) {
    if (host_threw) throw;  // the host's own refusal or error, through the format unchanged
    const auto [what, resume] = failed(e.what());
    throw sdk::CheckpointError(
        what, e.hint() + (resume.empty() ? "" : (e.hint().empty() ? "" : "; then ") + resume));
  } catch (const std::exception& e) {
    if (host_threw) throw;
    // Not a UserError: the format's internal error (exit 1), not the user's input.
    const auto [what, resume] = failed(e.what());
    throw PluginFault(what,
                      "an error inside the checkpoint format, which threw no "
                      "sdk::UserError: report it to its authors" +
                          (resume.empty() ? "" : "; " + resume));
  }

  // Keep the newest `keep` checkpoints of this run, by step number (names stop sorting by step
  // once a step outgrows the zero padding). One from a later step is not this run's (a file
  // copied in): it is neither counted nor removed, so the one just written always stays.
  const auto extension = s.c.checkpoint_format->file_extension();
  std::vector<fs::path> own;
  for (auto& file : step_checkpoints(dir, extension))
    if (checkpoint_step(file, extension).value_or(0) <= s.position.step) own.push_back(file);
  for (std::size_t i = 0; i + static_cast<std::size_t>(s.e.checkpoint.keep) < own.size(); ++i)
    fs::remove(own[i], ec);
  s.log.info("checkpoint written: " + path.string());
  return path;
}

}  // namespace mixtrain::core
