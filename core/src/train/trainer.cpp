#include "mixtrain/core/train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "checkpoint/state.h"
#include "distributed/rank_agreement.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/core/console/progress_report.h"
#include "mixtrain/core/distributed/config_agreement.h"
#include "mixtrain/core/graph/model_summary.h"
#include "mixtrain/core/runs/folder.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "train/planned_model.h"
#include "train/step.h"
#include "train/trainer_state.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::size_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

// summary.json's "precision": the policy that applied (`auto` resolved) and, per GEMM input dtype
// the plan uses, whether the backend runs it natively; `compare` labels runs and throughput by it.
void record_precision(TrainSummary& sum, const Model& model, const sdk::PrecisionPolicy& policy,
                      const sdk::BackendCapabilities& caps) {
  for (const auto& l : model.layers()) {
    if (!l->has_gemm()) continue;
    const auto dt = l->precision().gemm_input;
    const auto* support = caps.find(dt);
    sum.gemm_inputs[std::string(sdk::dtype_name(dt))] = {support != nullptr && support->native,
                                                         support != nullptr ? support->how : ""};
  }
  const std::string resolved = policy.resolved_name();
  sum.resolved_policy = resolved.empty() ? sum.policy : resolved;
}

// Why early stopping ends the run now: the watched metric's best and the evaluations since.
std::string early_stopping_reason(const MetricWatch& w, std::int64_t patience) {
  char best[64] = "no evaluation gave a number";
  if (w.state.has_best)
    std::snprintf(best, sizeof best, "best %.6g at step %lld", w.state.best,
                  static_cast<long long>(w.state.best_step));
  char delta[48] = "";
  if (w.min_delta > 0.0) std::snprintf(delta, sizeof delta, " by more than %g", w.min_delta);
  return w.state.metric + " did not improve" + delta + " in " + std::to_string(patience) +
         " evaluation" + (patience == 1 ? "" : "s") + " in a row (" + best +
         "; run.early_stopping_patience = " + std::to_string(patience) + ")";
}

// Text as a markdown code block (kept verbatim, in a fixed-width font).
std::string code_block(const std::string& text) {
  std::string out = "    ";
  for (std::size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '\n' && i + 1 < text.size()) out += "    ";
  }
  return out;
}

// The run's precision plan (the policy, the scaler and every node's dtypes, as `mixtrain check`
// prints them) and its resolved config, for sinks that keep text (TensorBoard's text dashboard),
// at the step the run starts from.
void write_run_text(Trainer::State& s) {
  const auto& e = s.e;
  const std::string resolved = s.c.policy->resolved_name();
  const std::string plan =
      "precision policy **" + e.policy_name + "**" +
      (resolved.empty() || resolved == e.policy_name ? "" : " (resolved: " + resolved + ")") +
      ", scaler **" + e.scaler_type + "**, optimizer **" + e.optimizer_type + "**, backend **" +
      e.backend_type + "** (" + s.c.backend->capabilities().device_name + ")\n\n" +
      code_block(render_model_summary(summarize_model(*s.model, e.data.batch_size)));
  s.metrics.write_text(s.step, "run/precision_plan", plan);
  s.metrics.write_text(s.step, "run/config", code_block(resolved_toml(e)));
}

// What every data-parallel replica must hold identically: the masters, the optimizer's scalars
// and (unsharded: each rank holds all of them) slots, and the scaler's and the policy's state.
std::vector<std::byte> replica_state(Trainer::State& s) {
  std::vector<std::byte> out;
  auto append = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  };
  auto append_view = [&](sdk::TensorView v) {
    const auto host = to_host(*s.c.backend, {}, v);
    out.insert(out.end(), host.bytes.begin(), host.bytes.end());
  };
  for (auto* p : s.model->parameters()) append_view(p->master.view());
  if (!s.dp->sharded())
    for (const auto& t : s.c.optimizer->state_tensors()) append_view(t.view);
  for (const std::string& text :
       {component_state_to_json(s.e.optimizer_type, s.c.optimizer->save_state()).dump(),
        component_state_to_json(s.e.scaler_type, s.c.scaler->save_state()).dump(),
        component_state_to_json(s.e.policy_name, s.c.policy->save_state()).dump()})
    append(text.data(), text.size());
  return out;
}

}  // namespace

Trainer::Trainer(const Experiment& experiment, Components components, const TrainOptions& options)
    : s_(std::make_unique<State>()) {
  auto& s = *s_;
  s.e = experiment;
  s.c = std::move(components);
  s.opt = options;
  const auto& e = s.e;
  s.rank_batch = e.data.batch_size;

  // Data parallel: every rank must run the same config before anything else talks to the others.
  if (s.c.communicator) {
    auto& comm = *s.c.communicator;
    check_config_agreement(comm, resolved_toml(e));
    const int world = comm.world_size();
    if (e.data.batch_size % world != 0)
      throw sdk::UserError(
          "data.batch_size = " + std::to_string(e.data.batch_size) +
              " is the global batch, which the " + std::to_string(world) +
              " ranks must share equally: it is not a multiple of " + std::to_string(world),
          "set data.batch_size to a multiple of the number of ranks (" +
              std::to_string(e.data.batch_size / world * world + world) + ", say)");
    DataParallelSettings settings;
    settings.shard_optimizer = e.distributed.shard_optimizer;
    settings.bucket_bytes = static_cast<std::int64_t>(e.distributed.bucket_mb * (1 << 20));
    settings.overlap = e.distributed.overlap;
    settings.sync_batch_norm = e.distributed.batch_norm == BatchNormStats::sync;
    s.dp = std::make_unique<DataParallel>(s.c.communicator, s.c.backend, settings);
    s.rank_batch = e.data.batch_size / world;
    s.writes = options.write_outputs && comm.rank() == 0;
  } else {
    s.writes = options.write_outputs;
  }

  // Data.
  auto loaded = load_data(e.data, e.run.seed);
  s.train = std::move(loaded.train);
  s.eval = std::move(loaded.eval);
  s.black = std::move(loaded.black);
  s.normalization = loaded.normalization;
  if (e.data.normalize.enabled())
    s.log.info(std::string("data: normalised per channel with ") +
               describe_normalization(loaded.normalization) +
               (e.data.normalize.from_training ? " (from the training split)" : ""));
  if (s.train.rows < e.data.batch_size)
    throw sdk::DataError(
        "the training split has " + std::to_string(s.train.rows) +
            " rows, fewer than data.batch_size = " + std::to_string(e.data.batch_size),
        "lower data.batch_size or data.eval_fraction, or use more data");

  // Model under the policy's plan (train/planned_model.h), then its initial weights.
  s.escalation.set_settings(e.escalate);
  build_model(s);
  s.model->init_parameters(e.run.seed);
  if (e.run.accumulate > 1) s.loss_sum = Tensor(s.c.backend, sdk::DType::fp32, sdk::Shape{1});
  if (e.ema.enabled())
    for (auto* p : s.model->parameters())
      s.ema.emplace_back(s.c.backend, sdk::DType::fp32, p->master.view().shape);
  reset_ema(s);
  s.sampler =
      std::make_unique<BatchSampler>(s.train.rows, e.data.batch_size, e.data.shuffle, e.run.seed);
  s.schedule.kind = e.schedule.schedule;
  s.schedule.base_lr = s.c.optimizer->base_lr();
  s.schedule.min_lr = e.schedule.min_lr;
  s.schedule.warmup_steps = e.schedule.warmup_steps;
  s.schedule.total_steps = e.run.steps;
  s.schedule.step_size = e.schedule.step_size;
  s.schedule.gamma = e.schedule.gamma;
  s.schedule.milestones = e.schedule.milestones;
  s.schedule.pct_start = e.schedule.pct_start;
  s.schedule.div_factor = e.schedule.div_factor;
  s.schedule.final_div_factor = e.schedule.final_div_factor;
  for (const auto& unused : e.unused_keys) s.log.warn(unused + "; ignored");
  if (e.run.early_stopping_patience > 0)
    s.early_stopping.emplace(e.run.early_stopping_metric, e.run.early_stopping_min_delta);
  if (!e.checkpoint.keep_best.empty()) s.keep_best.emplace(e.checkpoint.keep_best, 0.0);
  const std::int64_t max_rows = s.model->max_rows();
  if (s.train.is_tokens())
    s.ids_host.resize(static_cast<std::size_t>(max_rows * s.train.features));
  else
    s.x_host.resize(static_cast<std::size_t>(max_rows * s.train.features));
  s.y_host.resize(static_cast<std::size_t>(max_rows * s.train.labels_per_row()));

  if (!e.checkpoint.init_from.empty() && !options.resume)
    load_checkpoint(e.checkpoint.init_from, /*weights_only=*/true, e.checkpoint.init_layout);
  if (options.resume) {
    s.resumed_from =
        resolve_checkpoint_path(*options.resume, s.c.checkpoint_format->file_extension());
    load_checkpoint(s.resumed_from, /*weights_only=*/false);
  }

  // Run folder.
  if (s.writes) {
    RunFolderRequest request;
    request.run_dir = options.run_dir;
    request.resumed_from = s.resumed_from;
    request.resumed_step = s.step;
    request.config_dir = e.run.dir;
    request.run_name = e.run.name;
    request.checkpoint_extension = s.c.checkpoint_format->file_extension();
    s.run_dir = prepare_run_folder(request, resolved_toml(e));
    s.metrics.open(s.run_dir, e.run.metrics, s.step);
    // The plan and the config are rendered only for a sink that keeps text (TensorBoard).
    if (s.metrics.keeps_text()) write_run_text(s);
    // Statistics computed from the training split exist nowhere else on disk: the run keeps them
    // so that its images can be preprocessed outside mixtrain (torchvision's Normalize).
    if (!s.normalization.mean.empty()) {
      const std::string text = json{{"mean", s.normalization.mean},
                                    {"std", s.normalization.std},
                                    {"from_training", e.data.normalize.from_training}}
                                   .dump(1) +
                               "\n";
      sdk::AtomicFileWriter out(s.run_dir / "normalization.json", /*durable=*/false,
                                "normalisation statistics");
      out.write(text.data(), text.size());
      if (const auto warning = out.commit(); !warning.empty()) s.log.warn(warning);
    }
    reconcile_best_checkpoint(s);
  }
}

Trainer::~Trainer() = default;

const fs::path& Trainer::run_dir() const {
  return s_->run_dir;
}
const Model& Trainer::model() const {
  return *s_->model;
}
Model& Trainer::model() {
  return *s_->model;
}
const Dataset& Trainer::train_data() const {
  return s_->train;
}
const Dataset& Trainer::eval_data() const {
  return s_->eval;
}
const ChannelStats& Trainer::normalization() const {
  return s_->normalization;
}

TrainSummary Trainer::run() {
  auto& s = *s_;
  auto& e = s.e;
  auto& b = *s.c.backend;
  // Rows per optimizer step: run.accumulate micro-batches of data.batch_size.
  const std::int64_t bs = e.data.batch_size * e.run.accumulate;
  TrainSummary sum;
  sum.run_dir = s.run_dir;

  if (s.dp)
    s.log.info("data parallel: " + s.c.communicator->description() + ", " +
               std::to_string(s.rank_batch) + " rows per rank of each batch of " +
               std::to_string(e.data.batch_size) + ", " + std::to_string(s.dp->buckets().size()) +
               " gradient buckets" +
               (s.dp->sharded() ? ", optimizer state sharded (ZeRO stage 1)" : ""));
  s.log.info(
      "run '" + e.run.name + "': " + std::to_string(s.model->parameter_count()) +
      " parameters, policy " + e.policy_name + ", scaler " + e.scaler_type + ", optimizer " +
      e.optimizer_type + ", backend " + b.capabilities().device_name +
      (s.run_dir.empty() ? std::string(" (no run folder)") : ", folder " + s.run_dir.string()));
  bool interrupted = false;
  std::string stopped_by;     // run.on_nonfinite = "stop": why
  std::string stopped_early;  // early stopping: why
  auto evaluate_and_log = [&]() {
    // Every rank evaluates every row, with rank 0's batch-norm statistics (as DDP broadcasts its
    // buffers), so all ranks agree on early stopping and the best checkpoint.
    if (s.dp) s.dp->broadcast_buffers(*s.model);
    sum.eval = evaluate();
    sum.evaluated = true;
    sum.eval_step = s.step;
    json rec = {
        {"step", s.step}, {"eval_loss", sum.eval.loss}, {"eval_accuracy", sum.eval.accuracy}};
    if (sum.eval.top_k > 0) rec[top_k_accuracy_key(sum.eval.top_k)] = sum.eval.top_k_accuracy;
    s.metrics.write(rec);
    char line[200];
    int n = std::snprintf(line, sizeof line, "eval at step %lld: loss %.5f accuracy %.4f",
                          static_cast<long long>(s.step), sum.eval.loss, sum.eval.accuracy);
    if (sum.eval.top_k > 0 && n > 0 && static_cast<std::size_t>(n) < sizeof line)
      std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n), " top-%lld %.4f",
                    static_cast<long long>(sum.eval.top_k), sum.eval.top_k_accuracy);
    s.log.info(line);
    if (s.early_stopping) {
      auto& w = *s.early_stopping;
      w.observe(eval_metric_value(sum.eval, w.state.metric), s.step);
      // Patience used up at the last step changes nothing: the run ends there anyway.
      if (w.state.bad_evals >= e.run.early_stopping_patience && s.step < e.run.steps)
        stopped_early = early_stopping_reason(w, e.run.early_stopping_patience);
    }
    // After early stopping's count, so the best checkpoint holds the same state as the step's.
    if (s.keep_best &&
        s.keep_best->observe(eval_metric_value(sum.eval, e.checkpoint.keep_best), s.step) &&
        s.opt.write_outputs)
      save_best_checkpoint(s);
  };

  CommunicationTiming comm_total;  // data parallel: summed over the logged windows
  const auto t_start = Clock::now();
  auto t_window = t_start;
  std::int64_t window_rows = 0;
  const std::int64_t first_step = s.step;
  const std::int64_t end_step =
      s.opt.step_limit > 0 ? std::min(e.run.steps, first_step + s.opt.step_limit) : e.run.steps;
  const bool cut_short = end_step < e.run.steps;
  ProgressReport progress(first_step, end_step, bs, s.opt.progress_line, s.log);
  while (s.step < end_step) {
    ++s.step;
    // A stop request (Ctrl-C) lets this step finish and then reports it as the last one.
    interrupted = s.opt.stop_requested && s.opt.stop_requested() && s.step < end_step;
    // Data parallel: a stop request (mpirun forwards Ctrl-C to every rank, each sees it at its own
    // moment) must end every rank after the same step, or the ranks' collectives part ways.
    if (s.dp) interrupted = any_rank(s.dp->communicator(), interrupted);
    const bool last_step = s.step == end_step || interrupted;
    const bool log_step = s.step % e.run.log_every == 0 || last_step;
    const bool live_refresh = progress.live_due(s.step) || (progress.live() && last_step);
    const bool eval_step = e.run.eval_every > 0 && s.step % e.run.eval_every == 0 && !interrupted;
    const bool checkpoint_step = e.checkpoint.every > 0 && s.step % e.checkpoint.every == 0;

    StepRequest request;
    request.wants_norm = e.schedule.clip_grad_norm > 0.0 || log_step;
    request.statistics = e.run.underflow_every > 0 && s.step % e.run.underflow_every == 0;
    request.read_loss = log_step || live_refresh || eval_step || checkpoint_step;
    const StepOutcome step = run_training_step(s, request);
    const auto& decision = step.decision;
    window_rows += bs;
    if (s.opt.after_step) s.opt.after_step(s.step);

    if (!decision.apply_step && !std::isfinite(step.loss.loss) &&
        e.run.on_nonfinite == NonfiniteAction::stop)
      stopped_by = "run.on_nonfinite = \"stop\" stopped it at step " + std::to_string(s.step) +
                   ": the loss is not finite (first non-finite tensor: " +
                   (step.first_nonfinite.empty() ? "none on replay" : step.first_nonfinite) +
                   "); master weights are unchanged by this step";
    if (log_step || !decision.apply_step) {
      auto now = Clock::now();
      double dt = std::chrono::duration<double>(now - t_window).count();
      double sps = dt > 0 ? static_cast<double>(window_rows) / dt : 0.0;
      t_window = now;
      window_rows = 0;
      json rec = {
          {"step", s.step},
          {"loss", step.loss.loss},
          {"loss_scale", decision.scale_before},
          {"next_loss_scale", decision.scale_after},
          {"skipped", !decision.apply_step},
          {"lr", step.lr},
          {"grad_norm", std::isfinite(step.grad_norm) ? json(step.grad_norm) : json(nullptr)},
          {"samples_per_s", sps},
          {"epoch", s.sampler->cursor().epoch}};
      // Counters the backend and the kernel keep: no device wait.
      const auto memory = b.memory_stats();
      rec["device_memory_bytes"] = memory.current_bytes;
      rec["device_peak_memory_bytes"] = memory.peak_bytes;
      rec["host_peak_rss_bytes"] = peak_rss_bytes();
      if (!decision.apply_step) rec["nonfinite"] = step.first_nonfinite;
      if (s.dp) {
        const auto t = s.dp->take_timing();
        comm_total += t;
        rec["allreduce_wait_seconds"] = t.wait_seconds;
        rec["buckets_started_in_backward"] = t.started_in_backward;
        rec["buckets_communicated"] = t.buckets;
        if (s.dp->sharded()) rec["allgather_seconds"] = t.gather_seconds;
      }
      s.metrics.write(rec);
      progress.log_step(s.step, step.loss.loss, decision.scale_before, step.lr, sps);
    }
    // After the step's record, so the promotion shows after the skip that caused it.
    escalate_after_step(s, s.step, step);
    if (live_refresh) progress.show_live(s.step, step.loss.loss, s.c.scaler->scale());
    if (eval_step) evaluate_and_log();
    const bool stopping = interrupted || !stopped_by.empty() || !stopped_early.empty();
    if (stopping) break;
    if (checkpoint_step && s.step != e.run.steps) save_checkpoint();
  }
  progress.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
  // An interrupted run goes straight to its checkpoint; the evaluation would make the user wait.
  if (!interrupted && !cut_short && !(sum.evaluated && sum.eval_step == s.step)) evaluate_and_log();
  // The training loop's peak, before the final checkpoint's host copies of the state.
  const std::size_t training_peak_rss = peak_rss_bytes();
  fs::path last_checkpoint;
  if (s.opt.write_outputs) last_checkpoint = save_checkpoint();

  sum.steps = s.step;
  sum.applied_steps = s.applied;
  sum.skipped_steps = s.skipped;
  sum.final_loss = s.last_loss;
  sum.final_loss_scale = s.c.scaler->scale();
  sum.peak_memory_bytes = b.memory_stats().peak_bytes;
  sum.peak_rss_bytes = training_peak_rss;
  sum.peak_rss_bytes_with_checkpoint = peak_rss_bytes();
  const std::int64_t trained = s.step - first_step;
  sum.samples_per_s = wall > 0 ? static_cast<double>(trained * bs) / wall : 0.0;
  sum.wall_seconds = wall;
  sum.parameters = s.model->parameter_count();
  sum.policy = e.policy_name;
  sum.scaler = e.scaler_type;
  sum.optimizer = e.optimizer_type;
  sum.backend = e.backend_type;
  record_precision(sum, *s.model, *s.c.policy, b.capabilities());
  sum.resumed_from = s.resumed_from;
  sum.interrupted = interrupted;
  sum.divergence = divergence_reason(sum, stopped_by);
  sum.diverged = !sum.divergence.empty();
  if (s.early_stopping) {
    const auto& w = s.early_stopping->state;
    sum.early_stopping = true;
    sum.early_stopping_patience = e.run.early_stopping_patience;
    sum.early_stopping_min_delta = e.run.early_stopping_min_delta;
    sum.early_stopping_watch = {w.metric, w.has_best, w.best, w.best_step, w.bad_evals};
    sum.stopped_early = !stopped_early.empty();
    sum.early_stopping_reason = stopped_early;
  }
  if (s.keep_best) {
    const auto& w = s.keep_best->state;
    sum.keep_best = true;
    sum.best = {w.metric, w.has_best, w.best, w.best_step, w.bad_evals};
    sum.best_checkpoint = s.best_path;
  }
  if (s.dp) {
    comm_total += s.dp->take_timing();  // what the last window left
    std::size_t state_bytes = 0;
    for (const auto& slot : s.c.optimizer->state_tensors()) state_bytes += slot.view.bytes();
    // The largest rank's bytes: what each machine must hold.
    double per_rank[2] = {static_cast<double>(state_bytes),
                          static_cast<double>(sum.peak_memory_bytes)};
    s.c.communicator->all_reduce_host(per_rank, sdk::ReduceOp::max);
    auto& d = sum.distributed;
    d.world_size = s.dp->world();
    d.communicator = s.c.communicator->description();
    d.shard_optimizer = s.dp->sharded();
    d.buckets = static_cast<std::int64_t>(s.dp->buckets().size());
    d.optimizer_state_bytes = static_cast<std::size_t>(per_rank[0]);
    d.peak_memory_bytes = static_cast<std::size_t>(per_rank[1]);
    d.wait_seconds = comm_total.wait_seconds;
    d.gather_seconds = comm_total.gather_seconds;
    d.buckets_started_in_backward = comm_total.started_in_backward;
    d.buckets_communicated = comm_total.buckets;
    d.ranks_identical = s.dp->ranks_agree(replica_state(s));
    if (!d.ranks_identical)
      s.log.error(
          "the ranks' training states differ at the end of the run: the replicas went "
          "out of step (a nondeterministic op, or a bug); this rank's checkpoint is "
          "rank 0's");
  }
  if (s.writes) write_run_summary(s.run_dir / "summary.json", sum);
  if (sum.stopped_early)
    s.log.info("stopped early at step " + std::to_string(s.step) + ": " + stopped_early);
  if (interrupted)
    s.log.warn("interrupted after step " + std::to_string(s.step) + " of " +
               std::to_string(e.run.steps) +
               (last_checkpoint.empty() ? std::string()
                                        : "; continue with --resume " + last_checkpoint.string()));
  return sum;
}

}  // namespace mixtrain::core
