#include "commands.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string_view>

#include <nlohmann/json.hpp>

#include "cli_registry.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/console/shell_word.h"
#include "mixtrain/core/distributed/config_agreement.h"
#include "mixtrain/core/graph/model_summary.h"
#include "mixtrain/core/graph/parameter_memory.h"
#include "mixtrain/core/plugins/plugin_fault.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/precision/loss_scaling_advice.h"
#include "mixtrain/core/precision/tensor_core_lint.h"
#include "mixtrain/core/profiling/profiling_backend.h"
#include "mixtrain/core/runs/comparison.h"
#include "mixtrain/core/runs/folder.h"
#include "mixtrain/core/train/interrupt.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/backend_plan_report.h"
#include "mixtrain/sdk/support/backend_features.h"
#include "model_session.h"

namespace mixtrain::cli {

namespace fs = std::filesystem;
using core::shell_word;

namespace {

// The resolved config.toml of the run a --resume path belongs to: the run folder itself, its
// checkpoints/ folder, or a checkpoint file inside that.
fs::path run_config_of(const fs::path& resume) {
  std::error_code ec;
  // A path that is not there is the mistake to name, not the config its parent folder lacks.
  if (!fs::exists(resume, ec))
    throw sdk::UserError("--resume " + resume.string() + ": no such run folder or checkpoint",
                         "pass a run folder (runs/NAME), its checkpoints/ folder or a checkpoint "
                         "file; `ls runs/` lists the runs");
  const fs::path folder = core::run_folder_of(resume);
  const fs::path config = folder / "config.toml";
  if (!fs::is_regular_file(config, ec)) {
    // A checkpoint that continuing a run moved aside (runs/folder.h): the config.toml it trained
    // with is kept beside it when the resumed run's differed.
    std::string named = "CONFIG";
    const std::string aside = folder.filename().string();
    const std::string_view lead = "checkpoints.";
    if (aside.starts_with(std::string(lead) + "discarded-after-step-")) {
      const fs::path kept =
          folder.parent_path() / ("config." + aside.substr(lead.size()) + ".toml");
      if (fs::is_regular_file(kept, ec)) named = kept.string();
    }
    throw sdk::UserError(
        "--resume " + resume.string() + " without a config: no config.toml in " + folder.string() +
            " to continue the run with",
        "name the config: mixtrain train " + named + " --resume " + resume.string());
  }
  return config;
}

// An earlier profile.json moved to profile.steps-A-B.json by the steps it names (written before
// it named them: profile.earlier.json), or -2, -3 ... beside one of that name.
void keep_earlier_profile(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return;
  const auto steps = core::profile_steps(file);
  const std::string stem =
      steps ? "profile.steps-" + std::to_string(steps->first) + "-" + std::to_string(steps->last)
            : std::string("profile.earlier");
  fs::path aside = file.parent_path() / (stem + ".json");
  for (int n = 2; fs::exists(aside, ec); ++n)
    aside = file.parent_path() / (stem + "-" + std::to_string(n) + ".json");
  fs::rename(file, aside, ec);
  if (ec)
    throw sdk::UserError(
        "cannot keep the earlier " + file.string() + " as " + aside.string() + ": " + ec.message(),
        "check the run folder's permissions, or move profile.json away");
}

// Prints the profile of steps first..last, the plans that ran its ops and the device's kernels,
// and writes them as profile.json (the steps, entries, their groups, the plan reports by library,
// the kernel trace). A profile.json there already (an earlier segment of a resumed run) is kept
// beside it as profile.steps-A-B.json, named by its own steps.
void write_profile(core::ProfilingBackend& p, std::int64_t first, std::int64_t last,
                   const fs::path& dir, const core::ModelSummary& model) {
  const std::int64_t steps = last - first + 1;
  if (steps < 1) {
    std::printf("profile: nothing recorded (the run needs at least 2 steps)\n");
    return;
  }
  std::printf("%s", core::format_profile(p, steps).c_str());
  std::map<std::string, core::ProfileNodeInfo> node_info;
  for (const core::NodeSummary& n : model.nodes)
    node_info[n.name] = {
        core::node_shapes_text(n),
        static_cast<double>(n.forward_flops_per_sample) * static_cast<double>(model.batch_rows)};
  std::printf("%s", core::format_node_profile(p, steps, node_info).c_str());
  // The plan reports are asked for once: printed, then kept in profile.json.
  const auto* plan_facet = sdk::facet<sdk::PlanReportFacet>(p);
  const std::vector<sdk::PlanReport> reports =
      plan_facet != nullptr ? plan_facet->plan_reports() : std::vector<sdk::PlanReport>{};
  std::printf("%s", core::format_plan_reports(plan_facet != nullptr ? &reports : nullptr).c_str());
  const core::KernelTraceResult kernels = p.kernel_trace();
  std::printf("%s", core::format_kernel_trace(kernels, steps).c_str());
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& e : p.entries())
    rows.push_back({{"scope", e.scope},
                    {"op", e.op},
                    {"group", core::profile_group(e)},
                    {"calls", e.calls},
                    {"seconds", e.seconds}});
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : p.node_entries())
    nodes.push_back({{"node", n.node},
                     {"type", n.entry.scope},
                     {"op", n.entry.op},
                     {"calls", n.entry.calls},
                     {"seconds", n.entry.seconds}});
  nlohmann::json plans = nlohmann::json::object();
  for (const sdk::PlanReport& r : reports) plans[r.library] = r.plans;
  nlohmann::json doc = {{"steps", steps},    {"first_step", first},
                        {"last_step", last}, {"recorded_seconds", p.recorded_seconds()},
                        {"entries", rows},   {"nodes", nodes},
                        {"plans", plans}};
  if (kernels.offered) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& k : kernels.trace.kernels)
      list.push_back({{"name", k.name}, {"calls", k.calls}, {"seconds", k.device_seconds}});
    doc["kernels"] = {
        {"error", kernels.error}, {"dropped", kernels.trace.dropped}, {"kernels", list}};
  }
  const fs::path file = dir / "profile.json";
  keep_earlier_profile(file);
  core::write_run_file(file, doc.dump(1) + "\n", "profile");
}

}  // namespace

namespace {

// The final line's peak: MiB as before from 1 MiB up (scripts read that), but a small model's
// few KiB would print as "0.0 MiB".
std::string peak_memory_text(std::size_t bytes) {
  char text[64];
  if (bytes >= (std::size_t{1} << 20))
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  else if (bytes >= (std::size_t{1} << 10))
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / (1 << 10));
  else
    std::snprintf(text, sizeof text, "%zu bytes", bytes);
  return text;
}

int train_with(core::Experiment& experiment, core::Components components,
               const std::string& run_dir, const std::optional<std::string>& resume, bool profile);

}  // namespace

namespace {

// The `mixtrain train` command of these arguments: what mpirun is to run for a [distributed]
// config started without it (core::launch_requirement), the user's --merge and --set included.
std::string train_command(const ConfigArgs& cfg, const std::string& run_dir = {},
                          const std::optional<std::string>& resume = {}, bool profile = false) {
  std::string command = "mixtrain train";
  if (!cfg.config.empty()) command += " " + shell_word(cfg.config);
  for (const auto& merge : cfg.merges) command += " --merge " + shell_word(merge.string());
  for (const auto& set : cfg.sets) command += " --set " + shell_word(set);
  if (!run_dir.empty()) command += " --run-dir " + shell_word(run_dir);
  if (resume) command += " --resume " + shell_word(*resume);
  if (profile) command += " --profile";
  return command;
}

}  // namespace

// The error's text with this rank's prefix ("rank 1: ") once: a communicator's own messages
// already start with it.
std::string with_rank(const std::string& message) {
  const std::string prefix = core::rank_prefix();
  if (prefix.empty()) return message;
  std::string out = message.rfind(prefix, 0) == 0 ? message : prefix + message;
  // Several errors in one message (core::ConfigErrors): each of its "error:" lines says the rank.
  const std::string line = "\nerror: ";
  for (auto at = out.find(line); at != std::string::npos; at = out.find(line, at + 1))
    if (out.compare(at + line.size(), prefix.size(), prefix) != 0)
      out.insert(at + line.size(), prefix);
  return out;
}

int run_train(const ConfigArgs& given, const std::string& run_dir,
              const std::optional<std::string>& resume, bool profile) {
  // Rank 1's lines carry "rank 1" from the first, before the communicator confirms the rank.
  core::set_log_rank_from_launcher();
  ConfigArgs cfg = given;
  const bool own_config = cfg.config.empty() && resume;
  if (own_config) {
    cfg.config = run_config_of(*resume).string();
    core::core_logger("train").info("config: " + cfg.config + " (the resumed run's own)");
  }
  auto config = load_config(cfg);
  auto registry = make_registry(&config);
  auto experiment = core::parse_experiment(config, *registry);
  if (own_config)
    if (const auto alone = core::follow_the_launch_on_resume(experiment); !alone.empty())
      core::core_logger("train").info(alone);
  auto components = core::create_components(experiment, *registry);
  components.communicator = core::create_communicator(
      experiment, *registry, *components.backend, train_command(given, run_dir, resume, profile));
  if (!components.communicator)
    return train_with(experiment, std::move(components), run_dir, resume, profile);
  // Data parallel: a failure on one rank must end every rank, never leave the others blocked in
  // a collective it will not join; only an error every rank found together (the config check)
  // lets each rank end normally.
  auto comm = components.communicator;
  core::set_log_rank(comm->rank());
  try {
    return train_with(experiment, std::move(components), run_dir, resume, profile);
  } catch (const core::ConfigDisagreement&) {
    throw;
  } catch (const sdk::UserError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", with_rank(e.full_message()).c_str());
    comm->abort(2);
  } catch (const core::PluginFault& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", with_rank(e.full_message()).c_str());
    comm->abort(1);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", with_rank(e.what()).c_str());
    comm->abort(1);
  }
  return 1;  // not reached: abort() ends the process
}

namespace {

int train_with(core::Experiment& experiment, core::Components components,
               const std::string& run_dir, const std::optional<std::string>& resume, bool profile) {
  core::TrainOptions opt;
  // --profile: steps after the first (which creates primitives and touches fresh memory); the
  // Trainer pauses the window around evaluations and checkpoints and closes it with its loop.
  std::shared_ptr<core::ProfilingBackend> profiler;
  std::int64_t first_profiled = 0, last_profiled = 0;
  if (profile) {
    profiler = core::make_profiling_backend(components.backend);
    components.backend = profiler;
    profiler->set_recording(false);
    opt.after_step = [&](std::int64_t step) {
      if (first_profiled == 0) {
        first_profiled = step + 1;
        profiler->reset();
        profiler->set_recording(true);
        return;
      }
      last_profiled = step;
    };
  }
  opt.run_dir = run_dir;
  if (resume) opt.resume = fs::path(*resume);
  // One live line, rank 0's, for a data-parallel run.
  opt.progress_line = isatty(STDERR_FILENO) != 0 &&
                      (!components.communicator || components.communicator->rank() == 0);
  core::InterruptGuard interrupt_guard;  // Ctrl-C: finish the step, checkpoint, summary, 130
  opt.stop_requested = [] { return core::interrupt_requested(); };
  const bool speaks = !components.communicator || components.communicator->rank() == 0;
  core::Trainer trainer(experiment, std::move(components), opt);
  auto s = trainer.run();
  if (!speaks)
    return s.interrupted ? core::interrupted_exit_code() : s.diverged ? kExitDiverged : 0;
  if (s.already_complete) {  // the trainer said why; nothing was trained or written
    std::printf("nothing to do: the run is already at step %lld\nrun folder: %s\n",
                static_cast<long long>(s.steps), s.run_dir.string().c_str());
    return 0;
  }
  std::printf("%s: %lld steps (%lld skipped), final loss %.5f, ",
              s.interrupted     ? "interrupted"
              : s.diverged      ? "diverged"
              : s.stopped_early ? "stopped early"
                                : "done",
              static_cast<long long>(s.steps), static_cast<long long>(s.skipped_steps),
              s.final_loss);
  // A skipped last step's loss says little of the run: the last finite one says where it got.
  if (s.last_finite_loss)
    std::printf("(the last finite loss %.5f at step %lld), ", *s.last_finite_loss,
                static_cast<long long>(s.last_finite_loss_step));
  if (s.evaluated)
    std::printf("eval accuracy %.4f (step %lld), ", s.eval.accuracy,
                static_cast<long long>(s.eval_step));
  std::printf("%.0f samples/s, peak memory %s, %.1f s\nrun folder: %s\n", s.samples_per_s,
              peak_memory_text(s.peak_memory_bytes).c_str(), s.wall_seconds,
              s.run_dir.string().c_str());
  if (s.stopped_early) std::printf("stopped early: %s\n", s.early_stopping_reason.c_str());
  if (profiler)
    write_profile(*profiler, first_profiled, last_profiled, s.run_dir,
                  core::summarize_model(trainer.model(), experiment.data.batch_size,
                                        experiment.run.accumulate));
  std::fflush(stdout);
  if (s.interrupted) return core::interrupted_exit_code();
  if (s.diverged) {
    // The scaler advice only where it is news: a run with one already needs other remedies.
    const std::string scaler = s.scaler == "dynamic" ? std::string()
                                                     : ", use a dynamic loss scaler (scaler.type = "
                                                       "\"dynamic\"; this run's is \"" +
                                                           s.scaler + "\")";
    if (speaks && !s.divergence_remedy.empty())
      std::fprintf(stderr, "\nerror: the run diverged: %s\n  HINT: %s\n", s.divergence.c_str(),
                   s.divergence_remedy.c_str());
    else if (speaks)
      std::fprintf(stderr,
                   "\nerror: the run diverged: %s\n  HINT: lower optimizer.lr%s or a wider "
                   "precision.policy; metrics.jsonl names the first non-finite tensor of each "
                   "skipped step. `mixtrain calibrate` finds the ops to keep wider, and "
                   "[precision.escalate] widens the op that keeps failing while the run goes on "
                   "(docs/precision-autopilot.md)\n",
                   s.divergence.c_str(), scaler.c_str());
    return kExitDiverged;
  }
  return 0;
}

}  // namespace

namespace {

std::string mib_text(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

// With [model.lora]: what the adapters' FP32 masters and optimizer state take, measured on the
// bound optimizer, against a full fine-tune's (every parameter a master and the same state per
// parameter): the memory LoRA exists to save.
std::string lora_share_line(const core::Trainer& trainer, double state) {
  std::int64_t adapters = 0, all = 0;
  for (const auto& layer : trainer.model().layers())
    for (const auto& p : layer->parameters()) {
      all += p.numel();
      if (!p.frozen) adapters += p.numel();
    }
  if (adapters == 0 || all == 0) return {};
  const double per_parameter = 4.0 + state / static_cast<double>(adapters);
  const double lora = per_parameter * static_cast<double>(adapters);
  const double full = per_parameter * static_cast<double>(all);
  char line[512];
  std::snprintf(line, sizeof line,
                "# LoRA: %lld trainable parameters of %lld; FP32 masters and optimizer state %s, "
                "%.2f%% of a full fine-tune's %s\n",
                static_cast<long long>(adapters), static_cast<long long>(all),
                mib_text(lora).c_str(), 100.0 * lora / full, mib_text(full).c_str());
  return line;
}

}  // namespace

int run_check(const ConfigArgs& cfg, bool rehearse) {
  // Checking a config opens everything training would, init_from included.
  auto session = open_model_session(cfg, SessionWeights::as_training_starts, /*rehearses=*/true);
  const auto& experiment = session.experiment;
  auto& trainer = *session.trainer;

  std::cout << core::resolved_toml(experiment) << "\n";
  // Without held-out rows, evaluation reads the training rows (Trainer::evaluate): say so.
  const auto held_out = trainer.eval_data().rows;
  std::cout << "# data: " << trainer.train_data().rows << " training rows, "
            << (held_out > 0 ? std::to_string(held_out) + " held-out rows"
                             : std::string("no held-out rows (evaluation reads the training rows)"))
            << ", " << trainer.train_data().features << " features, "
            << trainer.train_data().classes << " classes\n";
  // A policy that chooses (auto) says what it chose on this backend, as summary.json records it.
  const std::string resolved = session.policy ? session.policy->resolved_name() : std::string();
  std::cout << "# precision policy: " << experiment.policy_name
            << (resolved.empty() || resolved == experiment.policy_name
                    ? std::string()
                    : " (resolved: " + resolved + ")")
            << "\n";
  const core::ModelSummary summary =
      core::summarize_model(trainer.model(), experiment.data.batch_size, experiment.run.accumulate);
  std::cout << core::render_model_summary(summary);
  // With frozen parameters: bytes per parameter of the frozen base and of what trains, measured
  // on the allocated tensors and the bound optimizer's state.
  if (!experiment.model.freeze.empty()) {
    const std::size_t state = trainer.optimizer_state_bytes();
    if (experiment.model.lora.enabled())
      std::cout << lora_share_line(trainer, static_cast<double>(state));
    const auto memory = core::measure_parameter_memory(trainer.model(), state);
    if (memory.frozen > 0) std::cout << core::parameter_memory_line(memory);
  }
  // A rehearsal moves the trainer one step on; what follows reads only the plan. At a large input
  // a step runs for minutes: the log says what runs and, for each path that took a second or
  // more, how long it took (a quick check stays one line).
  core::Trainer::RehearsalProgress progress;
  if (rehearse) {
    std::cout.flush();  // the resolved config comes first, as a terminal shows it
    core::core_logger("check").info(
        "rehearsing the first training step and an evaluation batch to measure the peak memory "
        "(" +
        core::count_text(static_cast<double>(summary.training_flops_per_step)) +
        " FLOPs a training step; --skip-rehearsal skips this)");
    progress = [started = std::chrono::steady_clock::now()](std::string_view path, double seconds) {
      if (seconds < 1.0) return;
      const double total =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      char line[160];
      std::snprintf(line, sizeof line, "rehearsed %.*s in %.1f s (%.1f s so far)",
                    static_cast<int>(path.size()), path.data(), seconds, total);
      core::core_logger("check").info(line);
    };
  }
  const core::MemoryReport memory = trainer.memory_report(rehearse, progress);
  std::cout << core::render_memory_report(memory);
  if (!rehearse) std::cout << "# (check without --skip-rehearsal predicts the peak)\n";
  std::cout << core::step_time_line(memory, experiment.run.steps, experiment.run.accumulate);
  // check runs in one process (under mpirun it is refused): the figures are that process's.
  if (experiment.distributed.enabled())
    std::cout << "# memory under [distributed]: the figures above are of one process training "
                 "the whole config; each of mpirun's N ranks holds 1/N of data.batch_size's rows"
              << (experiment.distributed.shard_optimizer
                      ? " and of the optimizer state (shard_optimizer)"
                      : "")
              << ", so a rank peaks lower\n";
  // Alignment matters to a backend whose fast 16-bit kernels want aligned rows (CUDA's Tensor
  // Cores); a CPU's GEMMs run any size at one rate, so there it is a note about a later CUDA run,
  // not a warning about this config.
  std::vector<std::string> warnings;
  const bool alignment_matters = sdk::has_feature(trainer.model().backend_ptr()->capabilities(),
                                                  sdk::kFeatureGemmWantsAlignedRows);
  for (auto& w : core::tensor_core_warnings(trainer.model())) {
    if (alignment_matters)
      warnings.push_back(std::move(w));
    else
      std::cout << "# on a CUDA backend (the " << experiment.backend_type
                << " backend runs GEMMs of any size at one rate, so nothing to do here): " << w
                << "\n";
  }
  // The session adapted the policy to the model ("auto" resolved), as training would.
  if (auto w = core::unscaled_narrow_gradients(experiment, *session.policy, trainer.model(),
                                               /*resuming=*/false))
    warnings.push_back(std::move(*w));
  for (auto& w : core::memory_headroom_warnings(memory)) warnings.push_back(std::move(w));
  // The rehearsal ran the first batch: a forward that overflows there is a step the run skips
  // (and a run of them, a divergence), whatever the loss scale.
  if (!memory.nonfinite_forward.empty())
    warnings.push_back(
        "the rehearsed first step is not finite in the forward, first at " +
        memory.nonfinite_forward +
        " (the first batch): training skips such steps, and a loss scale does not help; "
        "`mixtrain calibrate` measures what overflows and writes [[precision.override]] entries, "
        "or [precision.escalate] promotes the node when it happens");
  // The config is valid either way; it is `train` in this process that would refuse it.
  if (auto launch = core::launch_requirement(experiment, train_command(cfg)); !launch.empty())
    std::cout << "# launch: " << launch << "\n";
  for (const auto& w : warnings) core::core_logger("check").warn(w);
  // The trainer warned already about keys left unread and likely slips (Trainer's construction).
  const bool warned =
      !warnings.empty() || !experiment.unused_keys.empty() || !experiment.config_warnings.empty();
  std::cout << "# config OK" << (warned ? " (with warnings)" : "") << "\n";
  return 0;
}

int run_eval(const ConfigArgs& cfg, const std::string& checkpoint, const std::string& layout) {
  auto session = open_model_session(
      cfg, SessionWeights::from_checkpoint, /*rehearses=*/false, core::DataSplits::held_out,
      {.path = checkpoint, .layout = layout, .records_shape = true, .check_model = {}});
  auto& trainer = *session.trainer;
  auto r = trainer.evaluate();
  nlohmann::json j = {{"eval_loss", r.loss}, {"eval_accuracy", r.accuracy}, {"rows", r.rows}};
  if (r.top_k > 0) j[core::top_k_accuracy_key(r.top_k)] = r.top_k_accuracy;
  std::cout << j.dump() << std::endl;
  // JSON has no NaN (the loss prints as null): say what a non-finite loss means, and exit as a
  // diverged run does, so that a script that gates on eval does not take it for a result.
  if (!std::isfinite(r.loss)) {
    report_nonfinite_loss(session.experiment.policy_name);
    return kExitDiverged;
  }
  return 0;
}

void report_nonfinite_loss(const std::string& policy_name) {
  // On stderr whatever --log-level says, as a diverged run's error is: the exit code needs it.
  std::fprintf(
      stderr, "error: %s\n",
      with_rank("the evaluation's loss is not finite: the checkpoint's weights hold NaN or "
                "infinity, or the forward overflows under precision.policy = " +
                policy_name +
                "\n  HINT: --set precision.policy=fp32 tells the two apart; a run's "
                "escalation plan travels in its checkpoints and exports")
          .c_str());
}

int run_compare(const std::vector<std::string>& run_dirs, const std::string& out_dir) {
  std::vector<fs::path> dirs(run_dirs.begin(), run_dirs.end());
  auto comparison = core::compare_runs(dirs);
  const fs::path out = out_dir.empty() ? dirs.front() : fs::path(out_dir);
  auto written = core::write_comparison(comparison, out);
  std::cout << core::comparison_text(comparison);
  if (auto diag = core::diagnostics_text(comparison); !diag.empty())
    std::cout << "\ndiagnostics:\n" << diag;
  std::cout << "wrote:";
  for (const auto& p : written) std::cout << " " << p.string();
  std::cout << std::endl;
  return 0;
}

}  // namespace mixtrain::cli
