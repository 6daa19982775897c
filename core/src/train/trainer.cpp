#include "mixtrain/core/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <span>

#include <nlohmann/json.hpp>

#include "checkpoint/state.h"
#include "data/data_fingerprint.h"
#include "distributed/data_parallel_reducer.h"
#include "distributed/launch.h"
#include "distributed/local_reducer.h"
#include "distributed/rank_agreement.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/core/console/progress_report.h"
#include "mixtrain/core/distributed/config_agreement.h"
#include "mixtrain/core/graph/lora.h"
#include "mixtrain/core/graph/model_summary.h"
#include "mixtrain/core/precision/loss_scaling_advice.h"
#include "mixtrain/core/profiling/profiling_backend.h"
#include "mixtrain/core/runs/folder.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "train/peft_import.h"
#include "train/planned_model.h"
#include "train/process_memory.h"
#include "train/settled_state.h"
#include "train/step.h"
#include "train/trainer_state.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// summary.json's "precision": the policy that applied (`auto` resolved) and, per GEMM input dtype
// the plan uses, whether the backend runs it natively; `compare` labels runs and throughput by it.
// Block-scaled GEMMs are one entry of their own: their fp8_e4m3 mark is not the per-tensor route.
void record_precision(TrainSummary& sum, const Model& model, const sdk::PrecisionPolicy& policy,
                      const sdk::BackendCapabilities& caps) {
  for (const auto& l : model.layers()) {
    if (!l->has_gemm()) continue;
    if (l->block_scaled()) {
      const bool simulated = caps.kind == "cpu";
      sum.gemm_inputs["block-scaled"] = {
          !simulated, simulated ? "emulated: the exact block-scaled GEMM simulator (element values "
                                  "decoded exactly, each k-block's dot product in double, scaled "
                                  "and summed in fp32)"
                                : "block-scaled GEMMs of the " + caps.kind + " backend"};
      continue;
    }
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
  // The evaluations counted, which a resumed stopped run's carry past the patience.
  const std::int64_t bad = std::max<std::int64_t>(w.state.bad_evals, patience);
  return w.state.metric + " did not improve" + delta + " in " + std::to_string(bad) +
         " evaluation" + (bad == 1 ? "" : "s") + " in a row (" + best +
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
      code_block(
          render_model_summary(summarize_model(*s.model, e.data.batch_size, e.run.accumulate)));
  s.metrics.records.write_text(s.position.step, "run/precision_plan", plan);
  s.metrics.records.write_text(s.position.step, "run/config", code_block(resolved_toml(e)));
}

// What every data-parallel replica must hold identically besides the optimizer's slots (the
// reducer adds those it holds whole): the masters, the EMA of them ([ema]), the optimizer's
// scalars, and the scaler's and the policy's state. Not the state of a policy that scales each
// operand from its current amax (fp8-current): that is the last step's amaxes of each replica's
// own rows, which differ by design (docs/architecture.md, "Data parallel").
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
  for (auto* p : s.model->parameters()) {
    if (!p->quantized()) {
      append_view(p->value());
      continue;
    }
    append_view(p->quant.codes.view());
    append_view(p->quant.scales.view());
  }
  for (const auto& average : s.ema) append_view(average.view());
  for (const std::string& text :
       {component_state_to_json(s.e.optimizer_type, s.c.optimizer->save_state()).dump(),
        component_state_to_json(s.e.scaler_type, s.c.scaler->save_state()).dump(),
        s.c.policy->wants_current_amax()
            ? std::string()
            : component_state_to_json(s.e.policy_name, s.c.policy->save_state()).dump()})
    append(text.data(), text.size());
  return out;
}

// Only rank 0 writes the run folder (State::writes), so a --run-dir that another rank was given
// names a folder nothing is written to. It is a command-line choice, not part of the config the
// ranks compare, so it is compared here and said on rank 0, which writes the log: a warning, as
// the run itself is sound.
void warn_of_other_run_dirs(Trainer::State& s, sdk::Communicator& comm) {
  const auto given = [](const std::string& dir) {
    return dir.empty() ? std::string("no --run-dir") : "--run-dir " + dir;
  };
  const std::string mine = s.opt.run_dir.string();
  const std::string first = rank0_text(comm, mine);
  const RankText other = lowest_rank_text(comm, mine == first ? std::string() : given(mine));
  if (other.rank < 0 || comm.rank() != 0) return;
  s.log.warn("rank " + std::to_string(other.rank) + " was started with " + other.text +
             " and rank 0 with " + given(first) +
             ": only rank 0 writes the run, so the run folder is rank 0's choice; give every rank "
             "the same --run-dir");
}

// Joins the other ranks when there are any: every rank must run the same config before anything
// else talks to the others, and the global batch must split evenly.
void join_replicas(Trainer::State& s) {
  const auto& e = s.e;
  if (!s.c.communicator) {
    s.reducer = std::make_unique<LocalReducer>(s.c.backend);
  } else {
    auto& comm = *s.c.communicator;
    check_config_agreement(comm, resolved_toml(e) + "\n" + s.c.origins);
    warn_of_other_run_dirs(s, comm);
    const int world = comm.world_size();
    if (e.data.batch_size % world != 0) {
      // The rank counts the batch splits over (a resume keeps its batch size: only the launch
      // can change).
      std::string counts;
      int listed = 0;
      for (std::int64_t n = 1; n <= e.data.batch_size && listed < 6; ++n)
        if (e.data.batch_size % n == 0)
          counts += (listed++ ? ", " : "") + std::to_string(n);
      const std::string launch = "launch on a rank count that divides it (" + counts + ", ...)";
      throw sdk::UserError(
          "data.batch_size = " + std::to_string(e.data.batch_size) +
              " is the global batch, which the " + std::to_string(world) +
              " ranks must share equally: it is not a multiple of " + std::to_string(world),
          s.opt.resume ? "a resume keeps the run's data.batch_size: " + launch
                       : "set data.batch_size to a multiple of the number of ranks (" +
                             std::to_string(e.data.batch_size / world * world + world) +
                             ", say), or " + launch);
    }
    DataParallelSettings settings;
    settings.shard_optimizer = e.distributed.shard_optimizer;
    settings.bucket_bytes = static_cast<std::int64_t>(e.distributed.bucket_mb * (1 << 20));
    settings.overlap = e.distributed.overlap;
    settings.sync_batch_norm = e.distributed.batch_norm == BatchNormStats::sync;
    s.reducer = std::make_unique<DataParallelReducer>(s.c.communicator, s.c.backend, settings);
  }
  s.rank_batch = e.data.batch_size / s.reducer->world();
  s.writes = s.opt.write_outputs && s.reducer->leads();
}

void load_training_data(Trainer::State& s, const DataSettings& data) {
  const auto& e = s.e;
  auto loaded = load_data(data, e.run.seed);
  s.train = std::move(loaded.train);
  s.eval = std::move(loaded.eval);
  s.black = std::move(loaded.black);
  s.normalization = loaded.normalization;
  s.train_fingerprint = data_fingerprint(s.train);
  s.eval_fingerprint = data_fingerprint(s.eval);
  if (data.normalize.enabled())
    s.log.info(std::string("data: normalised per channel with ") +
               describe_normalization(loaded.normalization) +
               (data.normalize.from_training ? " (from the training split)" : ""));
  if (s.train.rows < e.data.batch_size)
    throw sdk::DataError(
        "the training split has " + std::to_string(s.train.rows) +
            " rows, fewer than data.batch_size = " + std::to_string(e.data.batch_size),
        "lower data.batch_size or data.eval_fraction, or use more data");
}

// The parameters that the constructor's checkpoint load fills (TrainOptions::weights): a resume
// needs every one, and a weights-only load every one but LoRA's adapters, which a base model's
// file may lack (load_parameters refuses a file that lacks any other). Empty without a load.
std::function<bool(const ModelParameter&)> filled_by_constructor_load(const Trainer::State& s) {
  if (s.opt.resume) return [](const ModelParameter&) { return true; };
  if (s.opt.weights.empty() && s.e.checkpoint.init_from.empty()) return {};
  return [lora = s.e.model.lora.enabled()](const ModelParameter& p) {
    return !(lora && is_lora_parameter(p.name));
  };
}

// The model under the policy's plan (train/planned_model.h) with its seeded initial weights, and
// what the step keeps beside it: the accumulated loss and the EMA. The weights a checkpoint's
// load replaces next are not drawn.
void build_initial_model(Trainer::State& s) {
  const auto& e = s.e;
  s.precision.escalation.set_settings(e.escalate);
  build_model(s);
  s.model->init_parameters(e.run.seed, filled_by_constructor_load(s));
  if (e.run.accumulate > 1) s.loss_sum = Tensor(s.c.backend, sdk::DType::fp32, sdk::Shape{1});
  if (e.ema.enabled())  // a frozen parameter's average is itself
    for (auto* p : s.model->trainable_parameters())
      s.ema.emplace_back(s.c.backend, sdk::DType::fp32, p->master.view().shape);
  reset_ema(s);
}

LrSchedule schedule_of(const Experiment& e, double base_lr) {
  LrSchedule schedule;
  schedule.kind = e.schedule.schedule;
  schedule.base_lr = base_lr;
  schedule.min_lr = e.schedule.min_lr;
  schedule.warmup_steps = e.schedule.warmup_steps;
  schedule.total_steps = e.run.steps;
  schedule.step_size = e.schedule.step_size;
  schedule.gamma = e.schedule.gamma;
  schedule.milestones = e.schedule.milestones;
  schedule.pct_start = e.schedule.pct_start;
  schedule.div_factor = e.schedule.div_factor;
  schedule.final_div_factor = e.schedule.final_div_factor;
  return schedule;
}

// Byte images travel as bytes when the backend decodes them for the model's input dtype
// (sdk/backend_image_input.h): each split's table goes to the device once. Otherwise the host
// decodes each batch (gather_batch), with the same values.
void prepare_pixel_tables(Trainer::State& s) {
  if (!s.train.is_bytes()) return;
  const sdk::DType input = s.model->input_dtype();
  const sdk::ImageInputFacet* facet = s.model->facets().find<sdk::ImageInputFacet>();
  const sdk::DType dtypes[] = {sdk::DType::fp32, input};
  if (facet == nullptr || !facet->supports(sdk::ImageInputOp::decode_images, dtypes)) {
    s.log.info("data: byte images, decoded on the host: the backend has no image_input facet for " +
               std::string(sdk::dtype_name(input)) + " input");
    return;
  }
  const auto upload = [&](const Dataset& d, Tensor& table) {
    if (!d.is_bytes()) return;
    table = Tensor(s.c.backend, sdk::DType::fp32, sdk::Shape{d.channels(), 256});
    s.c.backend->copy_from_host(table.view(), d.pixel_values.data());
  };
  upload(s.train, s.train_pixel_table);
  upload(s.eval, s.eval_pixel_table);
  s.log.info("data: images travel to the device as bytes (" +
             std::to_string(s.e.data.batch_size * s.train.features >> 10) +
             " KiB a batch instead of " +
             std::to_string(s.e.data.batch_size * s.train.features * 4 >> 10) +
             " as fp32) and are decoded there");
}

// The host batches (the step's and, with data.prefetch, the loader's spare), sized for the model's
// largest batch, in the backend's upload memory where it has some (train/host_batch.h).
void allocate_host_batches(Trainer::State& s) {
  auto* facet = s.e.data.pin_memory ? sdk::facet<sdk::HostMemoryFacet>(*s.c.backend) : nullptr;
  s.data.host_memory = std::make_unique<HostMemory>(facet, s.log);
  // The step's batch also carries evaluation batches (Model::max_rows); the loader's spare only
  // training batches of this rank.
  const auto sized = [&](std::int64_t max_rows) {
    HostBatch b(s.data.host_memory.get());
    if (s.train.is_tokens())
      b.ids.resize(static_cast<std::size_t>(max_rows * s.train.features));
    else if (!s.train_pixel_table.empty())
      b.pixels.resize(static_cast<std::size_t>(max_rows * s.train.features));
    else
      b.x.resize(static_cast<std::size_t>(max_rows * s.train.features));
    b.y.resize(static_cast<std::size_t>(max_rows * s.train.labels_per_row()));
    return b;
  };
  s.data.host = sized(s.model->max_rows());
  if (s.e.data.prefetch) s.data.prefetcher = std::make_unique<BatchPrefetcher>(sized(s.rank_batch));
  if (s.data.host_memory->pinned())
    s.log.info(
        "data.pin_memory: batches are prepared in the backend's page-locked memory and "
        "uploaded from it in place");
}

// Statistics computed from the training split exist nowhere else on disk: the run keeps them so
// that its images can be preprocessed outside mixtrain (torchvision's Normalize).
void write_normalization(Trainer::State& s) {
  if (s.normalization.mean.empty()) return;
  const std::string text = json{{"mean", s.normalization.mean},
                                {"std", s.normalization.std},
                                {"from_training", s.e.data.normalize.from_training}}
                               .dump(1) +
                           "\n";
  sdk::AtomicFileWriter out(s.run_dir / "normalization.json", /*durable=*/false,
                            "normalisation statistics");
  out.write(text.data(), text.size());
  if (const auto warning = out.commit(); !warning.empty()) s.log.warn(warning);
}

// An image folder numbers its classes by their folders' names: the run keeps the names in label
// order, so that a prediction's class index can be named outside mixtrain (checkpoints record
// them too, data/data_shape.h).
void write_class_names(Trainer::State& s) {
  if (s.train.class_names.empty()) return;
  const std::string text =
      json{{"classes", s.train.class_names}}.dump(1, ' ', false, json::error_handler_t::replace) +
      "\n";
  sdk::AtomicFileWriter out(s.run_dir / "classes.json", /*durable=*/false, "class names");
  out.write(text.data(), text.size());
  if (const auto warning = out.commit(); !warning.empty()) s.log.warn(warning);
}

void open_run_folder(Trainer::State& s) {
  const auto& e = s.e;
  RunFolderRequest request;
  request.run_dir = s.opt.run_dir;
  request.resumed_from = s.position.resumed_from;
  request.resumed_step = s.position.step;
  request.config_dir = e.run.dir;
  request.run_name = e.run.name;
  request.checkpoint_extension = s.c.checkpoint_format->file_extension();
  PreparedRunFolder folder = prepare_run_folder(request, resolved_toml(e));
  s.run_dir = folder.dir;
  s.run_folder_lock.emplace(std::move(folder.lock));
  if (!folder.moved_aside.empty()) s.log.info(folder.moved_aside);
  s.metrics.records.open(s.run_dir, e.run.metrics, s.position.step);
  // The plan and the config are rendered only for a sink that keeps text (TensorBoard).
  if (s.metrics.records.keeps_text()) write_run_text(s);
  write_normalization(s);
  write_class_names(s);
  reconcile_best_checkpoint(s);
}

// How a run ends before run.steps, and why.
struct RunEnd {
  bool interrupted = false;
  std::string stopped_by;     // run.on_nonfinite = "stop", or weights not finite: why
  std::string stopped_early;  // early stopping: why
  std::int64_t nonfinite_tail = 0;  // the last steps in a row whose loss was not finite
  // The weights are not finite (StepOutcome::nonfinite_weights): the run stops, writes no
  // checkpoint of them and skips the final evaluation; `remedy` is the hint its end gives.
  bool weights_not_finite = false;
  std::string remedy;
  // Skipped steps, and those whose first non-finite tensor was in the forward (the first such
  // tensor kept): when every skip is one, no update was ever made and the inputs overflow.
  std::int64_t skips = 0, forward_skips = 0;
  std::string first_forward;
  bool stopping() const { return interrupted || !stopped_by.empty() || !stopped_early.empty(); }
};

// What one step of the loop does besides training.
struct StepPlan {
  bool log = false;           // a metrics record (a skipped step writes one anyway)
  bool live_refresh = false;  // the live progress line
  bool evaluate = false;
  bool checkpoint = false;
  StepRequest request;
};

// A stop request (Ctrl-C) that came while the step ran: the step just finished is the last.
// Every rank asks at the same point, as plan_step does.
bool stop_asked_after_step(Trainer::State& s, std::int64_t end_step, RunEnd& end) {
  if (end.interrupted || s.position.step >= end_step || !s.opt.stop_requested) return false;
  end.interrupted = s.reducer->any_rank(s.opt.stop_requested());
  return end.interrupted;
}

// Decides the current step's plan; a stop request (Ctrl-C) lets this step finish and then
// reports it as the last one. Data parallel: mpirun forwards Ctrl-C to every rank, each sees it
// at its own moment, so every rank must stop after the same step or their collectives part ways.
StepPlan plan_step(Trainer::State& s, const ProgressReport& progress, std::int64_t end_step,
                   RunEnd& end) {
  const auto& e = s.e;
  const std::int64_t step = s.position.step;
  end.interrupted =
      s.reducer->any_rank(s.opt.stop_requested && s.opt.stop_requested() && step < end_step);
  const bool last_step = step == end_step || end.interrupted;
  StepPlan plan;
  plan.log = step % e.run.log_every == 0 || last_step;
  plan.live_refresh = progress.live_due(step) || (progress.live() && last_step);
  plan.evaluate = e.run.eval_every > 0 && step % e.run.eval_every == 0 && !end.interrupted;
  plan.checkpoint = e.checkpoint.every > 0 && step % e.checkpoint.every == 0;
  plan.request.wants_norm = e.schedule.clip_grad_norm > 0.0 || plan.log;
  plan.request.statistics = e.run.underflow_every > 0 && step % e.run.underflow_every == 0;
  plan.request.read_loss = plan.log || plan.live_refresh || plan.evaluate || plan.checkpoint;
  return plan;
}

void note_divergence(const Trainer::State& s, const StepOutcome& step, RunEnd& end) {
  if (!step.nonfinite_weights.empty()) {
    // No loss scale brings them back: every later step would be skipped, and a checkpoint of them
    // would rotate out the good ones (checkpoint.keep). Stopped here, without writing one.
    end.weights_not_finite = true;
    end.nonfinite_tail += 1;
    end.stopped_by = "the weights are not finite at step " + std::to_string(s.position.step) +
                     " (first: " + step.nonfinite_weights +
                     "), so every step would be skipped at any loss scale: the run stopped there "
                     "and wrote no checkpoint of them";
    const auto last = newest_checkpoint_before(s, s.position.step);
    end.remedy =
        "an optimizer update made them so (an optimizer.lr too large, or an optimizer "
        "plugin's fault) unless the run started from them. " +
        (last ? "The newest checkpoint, " + last->string() +
                    ", holds finite weights: go on from it (" +
                    continue_route(s, *last, s.run_dir) + ") with a lower optimizer.lr"
              : std::string("This run has no checkpoint from before them"));
    return;
  }
  if (!step.decision.apply_step) {
    ++end.skips;
    if (step.blame.found() && !step.blame.in_backward()) {
      ++end.forward_skips;
      if (end.first_forward.empty()) end.first_forward = step.blame.tensor;
    }
  }
  // An applied step had finite gradients, so a finite loss, whether or not it was read.
  end.nonfinite_tail =
      !step.decision.apply_step && !std::isfinite(step.loss.loss) ? end.nonfinite_tail + 1 : 0;
  if (!step.decision.apply_step && !std::isfinite(step.loss.loss) &&
      s.e.run.on_nonfinite == NonfiniteAction::stop)
    end.stopped_by =
        "run.on_nonfinite = \"stop\" stopped it at step " + std::to_string(s.position.step) +
        ": the loss is not finite (first non-finite tensor: " + step.blame.tensor_or_none() +
        "); master weights are unchanged by this step";
}

// The rows trained since the last logged step, and the time they took: the logged throughput.
// Evaluations and checkpoint writes inside the window are not training time (`aside`): counted
// in, one evaluation every step made a run look 30 times slower than it trains.
struct ThroughputWindow {
  Clock::time_point start;
  std::int64_t rows = 0;
  Clock::duration aside{};
  // Samples per second since the window opened; opens the next one.
  double take() {
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - start - aside).count();
    const double sps = dt > 0 ? static_cast<double>(rows) / dt : 0.0;
    start = now;
    rows = 0;
    aside = {};
    return sps;
  }
};

// The step's metrics record and progress line.
void log_step(Trainer::State& s, const StepOutcome& step, double sps, ProgressReport& progress) {
  const auto& decision = step.decision;
  json rec = {{"step", s.position.step},
              {"loss", step.loss.loss},
              {"loss_scale", decision.scale_before},
              {"next_loss_scale", decision.scale_after},
              {"skipped", !decision.apply_step},
              {"lr", step.lr},
              {"grad_norm", std::isfinite(step.grad_norm) ? json(step.grad_norm) : json(nullptr)},
              {"samples_per_s", sps},
              {"epoch", s.data.sampler->cursor().epoch}};
  // Counters the backend and the kernel keep: no device wait.
  const auto memory = s.c.backend->memory_stats();
  rec["device_memory_bytes"] = memory.current_bytes;
  rec["device_peak_memory_bytes"] = memory.peak_bytes;
  rec["host_peak_rss_bytes"] = process_peak_rss_bytes();
  if (!decision.apply_step) rec["nonfinite"] = step.blame.tensor;
  s.reducer->report_step(rec);
  s.metrics.records.write(rec);
  progress.log_step(s.position.step, step.loss.loss, decision.scale_before, step.lr, sps);
}

// Every rank evaluates every row, with rank 0's batch-norm statistics (as DDP broadcasts its
// buffers), and then takes rank 0's numbers, so all ranks agree on early stopping and the best
// checkpoint even where their kernels differ in the last bits.
void evaluate_and_log(Trainer& trainer, Trainer::State& s, TrainSummary& sum, RunEnd& end) {
  const auto& e = s.e;
  s.reducer->before_evaluation(*s.model);
  sum.eval = trainer.evaluate();
  s.reducer->agree_on_evaluation(sum.eval);
  sum.evaluated = true;
  sum.eval_step = s.position.step;
  json rec = {{"step", s.position.step},
              {"eval_loss", sum.eval.loss},
              {"eval_accuracy", sum.eval.accuracy}};
  if (sum.eval.top_k > 0) rec[top_k_accuracy_key(sum.eval.top_k)] = sum.eval.top_k_accuracy;
  s.metrics.records.write(rec);
  char line[200];
  int n = std::snprintf(line, sizeof line, "eval at step %lld: loss %.5f accuracy %.4f",
                        static_cast<long long>(s.position.step), sum.eval.loss, sum.eval.accuracy);
  if (sum.eval.top_k > 0 && n > 0 && static_cast<std::size_t>(n) < sizeof line)
    std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n), " top-%lld %.4f",
                  static_cast<long long>(sum.eval.top_k), sum.eval.top_k_accuracy);
  s.log.info(line);
  // Only the evaluations every run.eval_every steps count: the one at the end of a run that stops
  // off that grid (run.steps not a multiple) would be one more for patience and the best than a
  // run continued past it has, and a resume would then decide otherwise than the uninterrupted run.
  if (e.run.eval_every <= 0 || s.position.step % e.run.eval_every != 0) return;
  if (s.metrics.early_stopping) {
    auto& w = *s.metrics.early_stopping;
    w.observe(eval_metric_value(sum.eval, w.state.metric), s.position.step);
    // Patience used up at the last step changes nothing: the run ends there anyway.
    if (w.state.bad_evals >= e.run.early_stopping_patience && s.position.step < e.run.steps)
      end.stopped_early = early_stopping_reason(w, e.run.early_stopping_patience);
  }
  // After early stopping's count, so the best checkpoint holds the same state as the step's.
  if (s.metrics.keep_best &&
      s.metrics.keep_best->observe(eval_metric_value(sum.eval, e.checkpoint.keep_best),
                                   s.position.step) &&
      s.opt.write_outputs)
    save_best_checkpoint(s);
}

// What the training loop measured, for the summary.
struct LoopMeasures {
  double wall_seconds = 0.0;  // the whole loop
  double step_seconds = 0.0;  // without the evaluations and checkpoints inside it
  std::int64_t trained_rows = 0;
  std::size_t training_peak_rss = 0;  // before the final checkpoint's host copies
};

void summarize_watches(const Trainer::State& s, TrainSummary& sum, const RunEnd& end) {
  const auto& e = s.e;
  if (s.metrics.early_stopping) {
    const auto& w = s.metrics.early_stopping->state;
    sum.early_stopping = true;
    sum.early_stopping_patience = e.run.early_stopping_patience;
    sum.early_stopping_min_delta = e.run.early_stopping_min_delta;
    sum.early_stopping_watch = {w.metric, w.has_best, w.best, w.best_step, w.bad_evals};
    sum.stopped_early = !end.stopped_early.empty();
    sum.early_stopping_reason = end.stopped_early;
  }
  if (s.metrics.keep_best) {
    const auto& w = s.metrics.keep_best->state;
    sum.keep_best = true;
    sum.best = {w.metric, w.has_best, w.best, w.best_step, w.bad_evals};
    sum.best_checkpoint = s.metrics.best_path;
  }
}

void summarize_run(Trainer::State& s, TrainSummary& sum, const RunEnd& end,
                   const LoopMeasures& measured) {
  const auto& e = s.e;
  auto& b = *s.c.backend;
  sum.steps = s.position.step;
  sum.applied_steps = s.position.applied;
  sum.skipped_steps = s.position.skipped;
  sum.final_loss = s.metrics.last_loss;
  if (!std::isfinite(sum.final_loss) && s.metrics.last_finite_loss) {
    sum.last_finite_loss = s.metrics.last_finite_loss->first;
    sum.last_finite_loss_step = s.metrics.last_finite_loss->second;
  }
  sum.trailing_nonfinite_steps = end.nonfinite_tail;
  sum.final_loss_scale = s.c.scaler->scale();
  sum.peak_memory_bytes = b.memory_stats().peak_bytes;
  sum.peak_rss_bytes = measured.training_peak_rss;
  sum.peak_rss_bytes_with_checkpoint = process_peak_rss_bytes();
  sum.samples_per_s = measured.step_seconds > 0
                          ? static_cast<double>(measured.trained_rows) / measured.step_seconds
                          : 0.0;
  sum.wall_seconds = measured.wall_seconds;
  sum.parameters = s.model->parameter_count();
  std::size_t state_bytes = 0;
  for (const auto& t : s.c.optimizer->state_tensors()) state_bytes += t.view.bytes();
  sum.parameter_memory = measure_parameter_memory(*s.model, state_bytes);
  sum.policy = e.policy_name;
  sum.scaler = e.scaler_type;
  sum.optimizer = e.optimizer_type;
  sum.backend = e.backend_type;
  record_precision(sum, *s.model, *s.c.policy, b.capabilities());
  sum.resumed_from = s.position.resumed_from;
  sum.segments = current_history(s);
  sum.interrupted = end.interrupted;
  sum.divergence = divergence_reason(sum, end.stopped_by);
  sum.diverged = !sum.divergence.empty();
  sum.divergence_remedy = end.remedy;
  // Every step skipped, each for a forward overflow: the inputs overflow before any update, which
  // neither a lower lr nor a loss scale (it multiplies gradients, not activations) can change.
  if (sum.diverged && end.stopped_by.empty() && sum.applied_steps == 0 && end.skips > 0 &&
      end.forward_skips == end.skips) {
    sum.divergence = "every one of the " + std::to_string(sum.steps) +
                     " steps was skipped: the forward was not finite (first: " + end.first_forward +
                     ") at every loss scale tried, so no update was ever made";
    sum.divergence_remedy =
        "the forward overflows on the input data before any update, so neither a lower "
        "optimizer.lr nor a loss scale helps: `mixtrain calibrate` measures what overflows and "
        "writes [[precision.override]] entries that keep it wider, [precision.escalate] "
        "(`--set precision.escalate.after=3`) widens the failing op while the run goes on "
        "(docs/precision-autopilot.md), or train under a wider precision.policy";
  }
  summarize_watches(s, sum, end);
  s.reducer->report_run(
      sum, *s.c.optimizer, [&] { return replica_state(s); }, s.log);
}

void report_end(Trainer::State& s, const RunEnd& end, const fs::path& last_checkpoint) {
  if (const BatchPrefetcher* loader = s.data.prefetcher.get(); loader != nullptr)
    s.log.info("data.prefetch: " + std::to_string(loader->taken()) +
               " training batches came ready from the loader thread, " +
               std::to_string(loader->dropped()) + " prepared ahead were dropped");
  if (!end.stopped_early.empty())
    s.log.info("stopped early at step " + std::to_string(s.position.step) + ": " +
               end.stopped_early);
  if (end.interrupted)
    s.log.warn("interrupted after step " + std::to_string(s.position.step) + " of " +
               std::to_string(s.e.run.steps) +
               (last_checkpoint.empty()
                    ? std::string()
                    : "; continue with " + continue_route(s, last_checkpoint, last_checkpoint)));
}

// A resume of a checkpoint at or past run.steps: says so and how to go on; trains and writes
// nothing (the final checkpoint, its metrics and summary stay as the finished run left them).
TrainSummary already_complete(Trainer::State& s, TrainSummary& sum) {
  sum.already_complete = true;
  sum.steps = s.position.step;
  sum.applied_steps = s.position.applied;
  sum.skipped_steps = s.position.skipped;
  sum.resumed_from = s.position.resumed_from;
  s.log.info("the run is already at step " + std::to_string(s.position.step) + " of run.steps = " +
             std::to_string(s.e.run.steps) + " (" + s.position.resumed_from.string() +
             "): nothing to train, nothing written; to train on, resume with a larger "
             "run.steps (--set run.steps=N, N > " +
             std::to_string(s.position.step) + ")");
  return sum;
}

// The input a dataset gives each sample, for messages: "11 features", "images [3, 32, 32]".
std::string input_text(const Dataset& d) {
  if (!d.is_image()) return std::to_string(d.features) + " features";
  std::string input = "images [";
  for (std::size_t i = 0; i < d.sample_shape.size(); ++i)
    input += (i ? ", " : "") + std::to_string(d.sample_shape[i]);
  return input + "]";
}

// A config error while the model is built for the input a checkpoint records: the config the
// checkpoint was trained with builds for that input, so the two are of different models (a CNN's
// config given a table model's checkpoint). Said as eval says it, with the config's own error
// inside, rather than as a bare error at a line of the config. (The config's [data] keys are
// checked against the record before, at their own lines: those are the config's to fix.)
[[noreturn]] void throw_recorded_misfit(const fs::path& checkpoint, const std::string& input,
                                        const sdk::ConfigError& e) {
  throw sdk::CheckpointError(checkpoint.string() + " records an input of " + input +
                                 ", which the config's model cannot read (" + e.what() + ")",
                             "the file belongs to a different model; use the config it was "
                             "trained with (the config.toml of its run folder)");
}

}  // namespace

void normalize_data_as(Trainer::State& s, const ChannelStats& stats) {
  if (s.recorded_shape) {
    s.normalization = stats;
    s.train = dataset_of_shape(*s.recorded_shape, stats);
    s.eval = s.train;
    prepare_pixel_tables(s);
    return;
  }
  DataSettings data = s.e.data;
  data.normalize.from_training = false;
  data.normalize.mean = stats.mean;
  data.normalize.std = stats.std;
  load_training_data(s, data);
  prepare_pixel_tables(s);
}

Trainer::Trainer(const Experiment& experiment, Components components, const TrainOptions& options)
    : s_(std::make_unique<State>()) {
  auto& s = *s_;
  s.e = experiment;
  s.c = std::move(components);
  s.opt = options;
  if (s.opt.on_record)
    s.metrics.records.observe(
        [on_record = s.opt.on_record](const json& record) { on_record(record.dump()); });
  const auto& e = s.e;
  join_replicas(s);
  const bool tokens = is_token_source(e.data.source);
  // CIFAR-10's held-out files are its own (not a split of the training ones): an evaluation reads
  // only them when the checkpoint records the model's input.
  // So are an image folder's, labelled by the class names the checkpoint records: the training
  // folder need not be there.
  const bool held_out_files =
      options.splits == DataSplits::held_out &&
      ((e.data.source == DataSource::cifar10 &&
        (!e.data.cifar_eval_paths.empty() || !e.data.cifar_dir.empty())) ||
       (e.data.source == DataSource::image_folder && !e.data.image_eval_dir.empty()));
  const bool shape_recorded = (options.splits == DataSplits::none || held_out_files) && !tokens &&
                              !options.shape_from.empty() &&
                              take_recorded_shape(s, options.shape_from);
  s.data_loaded = !shape_recorded &&
                  (options.splits == DataSplits::both || !tokens ||
                   (options.splits == DataSplits::held_out && e.data.eval_token_paths.empty()));
  s.evaluates =
      (held_out_files || !shape_recorded) && (options.splits != DataSplits::none || !tokens);
  if (options.resume && !options.weights.empty())
    throw std::logic_error(
        "Trainer: TrainOptions::weights loads weights into a new session; a resume takes its own");
  if (!s.data_loaded && (options.trains || options.resume || s.c.communicator))
    throw std::logic_error(
        "Trainer: a Trainer that trains, resumes or runs on ranks reads the training split "
        "(TrainOptions::splits = both)");
  if (shape_recorded) {
    s.train = dataset_of_shape(*s.recorded_shape, s.normalization);
    s.eval = s.train;
    if (held_out_files) {
      s.eval = e.data.source == DataSource::image_folder
                   ? load_image_folder_held_out(e.data, s.train, options.shape_from.string(),
                                                s.normalization)
                   : load_cifar10_held_out(e.data, s.train, options.shape_from.string(),
                                           s.normalization);
      // The pixels' form is the config's (data.pixels), as when every file loads.
      if (s.eval.is_bytes() != s.train.is_bytes()) {
        DataShape form = *s.recorded_shape;
        form.bytes = s.eval.is_bytes();
        s.train = dataset_of_shape(form, s.normalization);
      }
      s.eval_fingerprint = data_fingerprint(s.eval);
    }
    s.log.info("data: the model reads " + input_text(s.train) + " into " +
               std::to_string(s.train.classes) + " classes, as " + options.shape_from.string() +
               " records; " +
               (held_out_files ? "only the held-out files are opened" : "no data file is opened"));
  } else if (s.data_loaded) {
    load_training_data(s, e.data);
  } else if (s.evaluates) {
    auto loaded = load_held_out_data(e.data, e.run.seed);
    s.train = std::move(loaded.train);
    s.eval = std::move(loaded.eval);
    s.eval_fingerprint = data_fingerprint(s.eval);
  } else {
    s.train = token_data_shape(e.data.block_size, e.data.vocab_size);
    s.eval = s.train;
  }
  try {
    build_initial_model(s);
  } catch (const sdk::ConfigError& misfit) {
    if (!shape_recorded) throw;
    throw_recorded_misfit(options.shape_from, input_text(s.train), misfit);
  }
  if (options.check_model) options.check_model(*s.model);
  if (s.data_loaded)
    s.data.sampler =
        std::make_unique<BatchSampler>(s.train.rows, e.data.batch_size, e.data.shuffle, e.run.seed);
  // Every epoch drops its incomplete last batch (data/batch_sampler.h); shuffled, each epoch's
  // dropped rows differ, in order they are the same rows every time.
  if (const std::int64_t never = s.train.rows % e.data.batch_size; !e.data.shuffle && never > 0)
    s.log.warn("data.shuffle = false: the last " + std::to_string(never) + " of the " +
               std::to_string(s.train.rows) +
               " training rows never train (each epoch drops its incomplete last batch of " +
               std::to_string(e.data.batch_size) +
               " rows); shuffle, or a data.batch_size that divides the rows, trains every row");
  s.schedule = schedule_of(e, s.c.optimizer->base_lr());
  for (const auto& unused : e.unused_keys) s.log.warn(unused + "; ignored");
  for (const auto& warning : e.config_warnings) s.log.warn(warning);
  if (e.run.early_stopping_patience > 0)
    s.metrics.early_stopping.emplace(e.run.early_stopping_metric, e.run.early_stopping_min_delta);
  if (!e.checkpoint.keep_best.empty()) s.metrics.keep_best.emplace(e.checkpoint.keep_best, 0.0);
  prepare_pixel_tables(s);
  allocate_host_batches(s);
  if (!e.checkpoint.init_from.empty() && !options.resume) {
    // A missing file is the config's mistake, said at its key (a format's own "cannot open" names
    // no key, and a step file's hint speaks of resuming).
    std::error_code missing;
    if (!e.from_pretrained.enabled() && !fs::exists(e.checkpoint.init_from, missing))
      throw sdk::ConfigError(
          e.checkpoint.init_from_where, "checkpoint.init_from",
          "names " + sdk::option_value_to_string(e.checkpoint.init_from) + ", which does not exist",
          "correct the path (a relative one is read from the folder of the "
          "file that sets it, or from the current folder when given with "
          "--set), or remove init_from to start from the seeded weights");
    s.loading_initial_weights = true;  // step 0's weights, not a checkpoint to run as trained
    load_checkpoint(e.checkpoint.init_from, /*weights_only=*/true, e.checkpoint.init_layout);
    s.loading_initial_weights = false;
  }
  if (e.from_peft.enabled() && !options.resume) load_peft_adapter(s);
  if (!options.weights.empty()) load_checkpoint(options.weights, true, options.weights_layout);
  if (options.resume) {
    const std::string extension = s.c.checkpoint_format->file_extension();
    refuse_another_format(s, *options.resume);
    s.position.resumed_from = resolve_checkpoint_path(*options.resume, extension, "--resume");
    try {
      load_checkpoint(s.position.resumed_from, /*weights_only=*/false);
    } catch (const sdk::CheckpointError& e) {
      // A folder meant its newest checkpoint; when that file cannot be read at all (a crash's,
      // a full disk's), name the one before it, which --resume takes when given as a file. An
      // error about what a readable file holds (a changed batch size, say) is left as it is.
      std::optional<fs::path> earlier;
      const fs::path folder = s.position.resumed_from.parent_path();
      if (!fs::is_regular_file(*options.resume))
        for (const auto& file : step_checkpoints(folder, extension))
          if (file != s.position.resumed_from) earlier = file;
      bool readable = true;
      try {
        const auto state = s.c.checkpoint_format->read(s.position.resumed_from);
      } catch (const std::exception&) {
        readable = false;
      }
      if (!earlier || readable) throw;
      throw sdk::CheckpointError(std::string(e.what()),
                                 e.hint() + (e.hint().empty() ? "" : "; ") +
                                     "the checkpoint before it is " + earlier->string() +
                                     ": --resume " + earlier->string());
    }
    // Continuing in place only: resumed into another folder, the finished run is copied there.
    if (s.position.step >= e.run.steps)
      if (const auto in_place = continued_run_folder(options.run_dir, s.position.resumed_from)) {
        s.position.complete_on_resume = true;
        s.run_dir = *in_place;  // read, never written
      }
  }
  if (s.c.communicator) {
    const auto cursor = s.data.sampler->cursor();
    // The replicas' weights and states too: two checkpoints of one step, or an init_from file
    // whose contents differ per rank, would otherwise train apart until the end-of-run check.
    char state_crc[16];
    std::snprintf(state_crc, sizeof state_crc, "%08x", crc32_of(replica_state(s)));
    check_start_agreement(*s.c.communicator,
                          std::to_string(s.train.rows) + " training rows (" + s.train_fingerprint +
                              ") and " + std::to_string(s.eval.rows) + " held-out rows (" +
                              s.eval_fingerprint + "), " +
                              (s.position.resumed_from.empty()
                                   ? std::string("starting at step 0")
                                   : "resumed at step " + std::to_string(s.position.step) +
                                         " (sampler epoch " + std::to_string(cursor.epoch) +
                                         ", position " + std::to_string(cursor.position) + ")") +
                              " from weights and state with CRC-32 " + state_crc);
  }
  if (!s.position.complete_on_resume && s.writes) open_run_folder(s);
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

namespace {

// A checkpoint written by `save`, noted in `settled` (its step saved; an error inside it is the
// save's own, which says what the run has to go on from).
template <class Save>
fs::path saved_by(SettledState& settled, Save&& save) {
  settled.saving = true;
  fs::path path = save();
  settled.saving = false;
  settled.saved = settled.step;
  return path;
}

}  // namespace

TrainSummary Trainer::run() {
  auto& s = *s_;
  if (s.ran)
    throw std::logic_error(
        "Trainer::run: this trainer has run; a new Trainer with TrainOptions::resume continues "
        "the run from its checkpoint");
  if (!s.opt.trains || !s.data_loaded)
    throw std::logic_error(
        "Trainer::run: this trainer was opened with TrainOptions::trains = false (evaluation, "
        "prediction, sampling) or without the training split: it cannot train");
  s.ran = true;
  const auto& e = s.e;
  // Rows per optimizer step: run.accumulate micro-batches of data.batch_size.
  const std::int64_t bs = e.data.batch_size * e.run.accumulate;
  TrainSummary sum;
  sum.run_dir = s.run_dir;
  if (s.position.complete_on_resume) return already_complete(s, sum);
  s.reducer->announce(s.log, e.data.batch_size);
  std::int64_t trainable = 0;
  for (const auto* p : s.model->trainable_parameters()) trainable += p->numel();
  const std::int64_t total = s.model->parameter_count();
  s.log.info(
      "run '" + e.run.name + "': " + std::to_string(total) + " parameters" +
      (trainable == total ? std::string() : " (" + std::to_string(trainable) + " trainable)") +
      ", policy " + e.policy_name + ", scaler " + e.scaler_type + ", optimizer " +
      e.optimizer_type + ", backend " + s.c.backend->capabilities().device_name +
      (s.run_dir.empty() ? std::string(" (no run folder)") : ", folder " + s.run_dir.string()));
  if (const auto warning =
          unscaled_narrow_gradients(e, *s.c.policy, *s.model, !s.position.resumed_from.empty()))
    s.log.warn(*warning);
  const FormatKeeps keeps = probe_checkpoint_format(s);
  s.checkpoints_resume = keeps.training_state;
  if (const auto warning = weights_only_format_warning(s, keeps)) s.log.warn(*warning);
  if (const auto warning = ema_kept_by_format_warning(s, keeps)) s.log.warn(*warning);
  if (e.distributed.enabled() && s.reducer->leads())
    if (const auto grace = stop_grace_warning(detect_mpi_launch()); !grace.empty())
      s.log.warn(grace);
  // Evaluation reads the training rows then (Trainer::evaluate): its numbers, and the decisions
  // taken from them, are not held-out ones. `check` says the same.
  if (s.eval.rows == 0 && s.reducer->leads())
    s.log.warn("no held-out rows (data.eval_fraction = 0 and no eval file): the eval_* numbers" +
               std::string(e.run.early_stopping_patience > 0 || !e.checkpoint.keep_best.empty()
                               ? ", early stopping and keep_best"
                               : "") +
               " read the training rows");
  // What this process could grow to before the steps allocate theirs: a run near the host's
  // memory is said after its first step (as `check` says it), not found by the OOM killer.
  const std::size_t could_hold = process_memory_limit();
  // An error from here on writes the last settled step's checkpoint before it ends the run
  // (train/settled_state.h): the steps since the last periodic checkpoint are not lost.
  SettledState settled = settled_at_start(s);
  try {
    RunEnd end;
    const auto t_start = Clock::now();
    ThroughputWindow window{t_start};
    Clock::duration outside_steps{};  // evaluations and checkpoints inside the loop
    const std::int64_t first_step = s.position.step;
    const std::int64_t end_step =
        s.opt.step_limit > 0 ? std::min(e.run.steps, first_step + s.opt.step_limit) : e.run.steps;
    ProgressReport progress(first_step, end_step, bs, s.opt.progress_line, s.log);
    fs::path periodic_checkpoint;  // the last one the loop wrote (its step: settled.saved)
    // --profile's figures are per training step: an evaluation or checkpoint inside its window
    // pauses it, and the loop's end closes it (an early stop, a divergence, Ctrl-C included).
    auto* const profiler = dynamic_cast<ProfilingBackend*>(s.c.backend.get());
    while (s.position.step < end_step) {
      settled.cursor = s.data.sampler->cursor();
      ++s.position.step;
      const StepPlan plan = plan_step(s, progress, end_step, end);
      StepOutcome step = run_training_step(s, plan.request);
      // The step's end includes its precision escalation, when one is on (below).
      settled.step =
          s.precision.escalation.settings().enabled ? SettledState::kUnsettled : s.position.step;
      window.rows += bs;
      if (s.opt.after_step) s.opt.after_step(s.position.step);
      if (s.position.step == first_step + 1)
        if (auto w = host_memory_warning(process_peak_rss_bytes(), could_hold,
                                         "by the end of its first step"))
          s.log.warn(*w);
      // A stop asked for during this step makes it the last: plan_step saw only earlier requests,
      // and waiting for them would train one more step (and write its checkpoint) before stopping.
      // The last step's record and the summary report its loss, which the plan had not asked for.
      const bool stopped_in_step = stop_asked_after_step(s, end_step, end);
      if (stopped_in_step) read_loss_after_step(s, step);
      note_divergence(s, step, end);
      const bool logged = plan.log || stopped_in_step || !step.decision.apply_step;
      if (logged) log_step(s, step, window.take(), progress);
      // After the step's record, so the promotion shows after the skip that caused it.
      escalate_after_step(s, s.position.step, step);
      settled.step = s.position.step;
      if (plan.live_refresh || (stopped_in_step && progress.live()))
        progress.show_live(s.position.step, step.loss.loss, s.c.scaler->scale());
      const bool evaluate = plan.evaluate && !stopped_in_step;
      const auto aside_from = Clock::now();
      const bool paused =
          profiler != nullptr && (evaluate || plan.checkpoint) && profiler->recording();
      if (paused) profiler->set_recording(false);
      if (evaluate) evaluate_and_log(*this, s, sum, end);
      // The last step's checkpoint is the final one, unless checkpoint.final = false asks for none:
      // then a step stopped by Ctrl-C keeps its own.
      const bool checkpointed =
          plan.checkpoint && (!end.stopping() || (stopped_in_step && !e.checkpoint.write_final)) &&
          (s.position.step != e.run.steps || !e.checkpoint.write_final);
      if (checkpointed) {
        periodic_checkpoint = saved_by(settled, [&] { return save_checkpoint(); });
      }
      // A stop asked for during this step's evaluation or checkpoint (seconds, where a step may be
      // milliseconds): stop here rather than after one more step, with this step's record (its
      // loss was read for the evaluation or checkpoint).
      if (!end.stopping() && (evaluate || checkpointed) &&
          stop_asked_after_step(s, end_step, end) && !logged)
        log_step(s, step, window.take(), progress);
      if (paused) profiler->set_recording(true);
      const auto aside = Clock::now() - aside_from;
      window.aside += aside;
      outside_steps += aside;
      if (end.stopping()) break;
    }
    progress.finish();
    if (profiler != nullptr) profiler->set_recording(false);
    LoopMeasures measured;
    const auto loop = Clock::now() - t_start;
    measured.wall_seconds = std::chrono::duration<double>(loop).count();
    measured.step_seconds = std::chrono::duration<double>(loop - outside_steps).count();
    measured.trained_rows = (s.position.step - first_step) * bs;
    // An interrupted run goes straight to its checkpoint; the evaluation would make the user wait.
    // A step_limit run (calibration's) never evaluates, even when the limit reaches run.steps.
    const bool limited = s.opt.step_limit > 0;
    if (!end.interrupted && !limited && !end.weights_not_finite &&
        !(sum.evaluated && sum.eval_step == s.position.step))
      evaluate_and_log(*this, s, sum, end);
    measured.training_peak_rss = process_peak_rss_bytes();
    fs::path last_checkpoint;
    // A run that stops at a step the loop has just checkpointed (Ctrl-C during that write or, with
    // checkpoint.final = false, during the step) has its checkpoint already: nothing changed since.
    if (s.opt.write_outputs && e.checkpoint.write_final && !end.weights_not_finite)
      last_checkpoint = settled.saved == s.position.step
                            ? periodic_checkpoint
                            : saved_by(settled, [&] { return save_checkpoint(); });
    summarize_run(s, sum, end, measured);
    if (s.writes) write_run_summary(s.run_dir / "summary.json", sum);
    report_end(s, end, last_checkpoint);
    return sum;
  } catch (...) {
    keep_settled_state(*this, s, settled);
    throw;
  }
}

}  // namespace mixtrain::core
