#include "mixtrain/core/runs/summary.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "graph/parameter_memory_json.h"
#include "mixtrain/core/runs/folder.h"
#include "mixtrain/sdk/error.h"
#include "runs/component_history_json.h"

namespace mixtrain::core {

std::string divergence_reason(const TrainSummary& s, const std::string& stopped_by) {
  if (!stopped_by.empty()) return stopped_by;
  // An interrupted run may simply have stopped inside the scaler's first back-off steps.
  if (s.steps > 0 && s.applied_steps == 0 && !s.interrupted)
    return "every one of the " + std::to_string(s.steps) +
           " steps was skipped (non-finite gradients at every loss scale tried)";
  if (!std::isfinite(s.final_loss) &&
      (s.trailing_nonfinite_steps >= kDivergedTail || s.trailing_nonfinite_steps >= s.steps))
    return "the loss was not finite on each of the last " +
           std::to_string(s.trailing_nonfinite_steps) + " steps";
  return {};
}

std::string top_k_accuracy_key(std::int64_t k) {
  return "eval_top" + std::to_string(k) + "_accuracy";
}

std::int64_t top_k_of_accuracy_key(std::string_view key) {
  constexpr std::string_view head = "eval_top", tail = "_accuracy";
  if (key.size() <= head.size() + tail.size() || !key.starts_with(head) || !key.ends_with(tail))
    return 0;
  const auto digits = key.substr(head.size(), key.size() - head.size() - tail.size());
  if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string_view::npos)
    return 0;
  return std::stoll(std::string(digits));
}

void write_run_summary(const std::filesystem::path& file, const TrainSummary& s) {
  using json = nlohmann::json;
  json j = {{"steps", s.steps},
            {"applied_steps", s.applied_steps},
            {"skipped_steps", s.skipped_steps},
            {"final_loss", s.final_loss},
            {"final_loss_scale", s.final_loss_scale},
            {"peak_memory_bytes", s.peak_memory_bytes},
            {"peak_rss_bytes", s.peak_rss_bytes},
            {"peak_rss_bytes_with_checkpoint", s.peak_rss_bytes_with_checkpoint},
            {"samples_per_s", s.samples_per_s},
            {"wall_seconds", s.wall_seconds},
            {"parameters", s.parameters},
            {"policy", s.policy},
            {"scaler", s.scaler},
            {"optimizer", s.optimizer},
            {"backend", s.backend},
            {"diverged", s.diverged},
            {"interrupted", s.interrupted},
            {"stopped_early", s.stopped_early}};
  if (s.parameter_memory.frozen > 0)
    j["parameter_memory"] = parameter_memory_json(s.parameter_memory);
  json gemms = json::object();
  for (const auto& [dtype, g] : s.gemm_inputs)
    gemms[dtype] = {{"native", g.native}, {"how", g.how}};
  j["precision"] = {{"policy", s.resolved_policy}, {"gemm_inputs", gemms}};
  if (s.evaluated) {
    j["eval_loss"] = s.eval.loss;
    j["eval_accuracy"] = s.eval.accuracy;
    j["eval_step"] = s.eval_step;
    if (s.eval.top_k > 0) j[top_k_accuracy_key(s.eval.top_k)] = s.eval.top_k_accuracy;
  }
  if (s.last_finite_loss) {
    j["last_finite_loss"] = *s.last_finite_loss;
    j["last_finite_loss_step"] = s.last_finite_loss_step;
  }
  if (s.diverged) j["divergence"] = s.divergence;
  if (s.early_stopping) {
    const auto& w = s.early_stopping_watch;
    json e = {{"metric", w.metric},
              {"patience", s.early_stopping_patience},
              {"min_delta", s.early_stopping_min_delta},
              {"evaluations_without_improvement", w.bad_evals}};
    if (w.has_best) {
      e["best"] = w.best;
      e["best_step"] = w.best_step;
    }
    if (s.stopped_early) e["reason"] = s.early_stopping_reason;
    j["early_stopping"] = e;
  }
  if (s.keep_best && s.best.has_best) {
    json b = {{"metric", s.best.metric}, {"value", s.best.best}, {"step", s.best.best_step}};
    if (!s.best_checkpoint.empty()) b["path"] = s.best_checkpoint.string();
    j["best_checkpoint"] = b;
  }
  if (s.distributed.world_size > 0) {
    const auto& d = s.distributed;
    j["distributed"] = {{"world_size", d.world_size},
                        {"communicator", d.communicator},
                        {"shard_optimizer", d.shard_optimizer},
                        {"buckets", d.buckets},
                        {"optimizer_state_bytes_per_rank", d.optimizer_state_bytes},
                        {"peak_memory_bytes_per_rank", d.peak_memory_bytes},
                        {"allreduce_wait_seconds", d.wait_seconds},
                        {"allgather_seconds", d.gather_seconds},
                        {"buckets_started_in_backward", d.buckets_started_in_backward},
                        {"buckets_communicated", d.buckets_communicated},
                        {"ranks_identical", d.ranks_identical}};
  }
  if (!s.resumed_from.empty()) j["resumed_from"] = s.resumed_from.string();
  if (s.segments.size() > 1) j["segments"] = component_history_to_json(s.segments);
  // Atomically: a second Ctrl-C lands most often during these final writes, and compare must
  // then find the previous summary or none, never half a file.
  // A run folder's path may hold bytes that are not UTF-8: written replaced, never refused.
  const std::string text = j.dump(2, ' ', false, json::error_handler_t::replace) + '\n';
  write_run_file(file, text, "run summary");
}

}  // namespace mixtrain::core
