#include "mixtrain/core/trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint_state.h"
#include "mixtrain/core/batch_sampler.h"
#include "mixtrain/core/checkpoint_path.h"
#include "mixtrain/core/log_sink.h"
#include "mixtrain/core/lr_schedule.h"
#include "mixtrain/core/progress_report.h"
#include "mixtrain/core/run_folder.h"
#include "mixtrain/core/underflow_report.h"
#include "mixtrain/sdk/atomic_file_writer.h"

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

sdk::HostTensor to_host(sdk::DeviceBackend& b, const std::string& name, sdk::TensorView v) {
  sdk::HostTensor h;
  h.name = name;
  h.dtype = v.dtype;
  h.shape = v.shape.to_vector();
  h.bytes.resize(v.bytes());
  b.copy_to_host(h.bytes.data(), v);
  return h;
}

void from_host(sdk::DeviceBackend& b, const sdk::HostTensor& h, sdk::TensorView v,
               const fs::path& file) {
  if (h.dtype != v.dtype || h.shape != v.shape.to_vector() || h.bytes.size() != v.bytes())
    throw sdk::CheckpointError(
        file.string() + ": tensor '" + h.name + "' is " + std::string(sdk::dtype_name(h.dtype)) +
            " " + sdk::Shape::from_vector(h.shape).to_string() + " but the model expects " +
            std::string(sdk::dtype_name(v.dtype)) + " " + v.shape.to_string(),
        "the checkpoint belongs to a different model; use the config it was trained with");
  b.copy_from_host(v, h.bytes.data());
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

}  // namespace

struct Trainer::State {
  Experiment e;
  Components c;
  TrainOptions opt;
  sdk::Logger log = core_logger("trainer");
  Dataset train, eval;
  std::unique_ptr<Model> model;
  std::vector<sdk::Parameter> params;
  std::vector<sdk::TensorView> grads;
  std::unique_ptr<BatchSampler> sampler;
  LrSchedule schedule;
  std::int64_t step = 0, applied = 0, skipped = 0;
  fs::path run_dir;
  std::ofstream metrics;
  std::vector<float> x_host;
  std::vector<std::int32_t> y_host;
  float last_loss = 0.0f;
  fs::path resumed_from;
  bool underflow_watch = false;  // some layer stores activation gradients in < 32 bits
};

Trainer::Trainer(const Experiment& experiment, Components components, const TrainOptions& options)
    : s_(std::make_unique<State>()) {
  auto& s = *s_;
  s.e = experiment;
  s.c = std::move(components);
  s.opt = options;
  const auto& e = s.e;
  auto& backend = *s.c.backend;

  // Data.
  Dataset all;
  if (e.data.source == "synthetic") {
    all = make_synthetic(e.data.synthetic);
  } else if (e.data.source == "npy") {
    all = load_npy(e.data.features_path, e.data.labels_path, e.data.classes);
  } else {
    all = load_idx(e.data.images_path, e.data.labels_path, e.data.classes);
  }
  if (e.data.classes > 0) all.classes = std::max(all.classes, e.data.classes);
  auto split = split_holdout(std::move(all), e.data.eval_fraction, e.run.seed);
  s.train = std::move(split.first);
  s.eval = std::move(split.second);
  if (s.train.rows < e.data.batch_size)
    throw sdk::DataError(
        "the training split has " + std::to_string(s.train.rows) +
            " rows, fewer than data.batch_size = " + std::to_string(e.data.batch_size),
        "lower data.batch_size or data.eval_fraction, or use more data");

  // Model under the policy's plan.
  s.model = std::make_unique<Model>(s.c.backend, e.model, s.train.features, s.train.classes);
  auto caps = backend.capabilities();
  plan_precision(*s.model, *s.c.policy, caps, e.overrides);
  for (const auto& l : s.model->layers()) {
    if (!l->has_gemm()) continue;
    auto dt = l->precision().gemm_input;
    if (!caps.supports(dt)) {
      std::string have;
      for (const auto& d : caps.gemm_inputs)
        have += (have.empty() ? "" : ", ") + std::string(sdk::dtype_name(d.dtype));
      throw sdk::BackendError("layer '" + l->name() + "' needs " +
                                  std::string(sdk::dtype_name(dt)) + " GEMM inputs, which the " +
                                  caps.kind + " backend cannot run (it runs: " + have + ")",
                              "choose another precision.policy, or override this layer with "
                              "[[precision.override]] layers = \"" +
                                  l->name() + "\", compute = \"fp32\"");
    }
  }
  for (const auto& l : s.model->layers())
    if (sdk::dtype_size(l->precision().activation_grad) < 4) s.underflow_watch = true;
  const std::int64_t max_rows = std::max(e.data.batch_size, e.data.eval_batch_size);
  if (e.run.underflow_every > 0 && s.underflow_watch) s.model->reserve_fp32_gradient_pass();
  s.model->allocate(max_rows);
  s.model->init_parameters(e.run.seed);
  for (auto* p : s.model->parameters()) {
    sdk::Parameter sp;
    sp.name = p->name;
    sp.tensors.master = p->master.view();
    sp.tensors.grad = p->grad.view();
    if (!p->working.empty()) sp.tensors.working = p->working.view();
    sp.weight_decay = p->weight_decay;
    s.params.push_back(sp);
    s.grads.push_back(p->grad.view());
  }
  s.c.optimizer->bind(backend, s.params);
  s.sampler =
      std::make_unique<BatchSampler>(s.train.rows, e.data.batch_size, e.data.shuffle, e.run.seed);
  s.schedule.kind = e.schedule.schedule;
  s.schedule.base_lr = s.c.optimizer->base_lr();
  s.schedule.min_lr = e.schedule.min_lr;
  s.schedule.warmup_steps = e.schedule.warmup_steps;
  s.schedule.total_steps = e.run.steps;
  s.x_host.resize(static_cast<std::size_t>(max_rows * s.train.features));
  s.y_host.resize(static_cast<std::size_t>(max_rows));

  if (!e.checkpoint.init_from.empty() && !options.resume)
    load_checkpoint(e.checkpoint.init_from, /*weights_only=*/true);
  if (options.resume) {
    s.resumed_from =
        resolve_checkpoint_path(*options.resume, s.c.checkpoint_format->file_extension());
    load_checkpoint(s.resumed_from, /*weights_only=*/false);
  }

  // Run folder.
  if (options.write_outputs) {
    RunFolderRequest request;
    request.run_dir = options.run_dir;
    request.resumed_from = s.resumed_from;
    request.resumed_step = s.step;
    request.config_dir = e.run.dir;
    request.run_name = e.run.name;
    request.checkpoint_extension = s.c.checkpoint_format->file_extension();
    s.run_dir = prepare_run_folder(request, resolved_toml(e));
    s.metrics.open(s.run_dir / "metrics.jsonl", std::ios::app);
    if (!s.metrics)
      throw sdk::UserError("cannot write " + (s.run_dir / "metrics.jsonl").string(),
                           "choose a writable --run-dir");
  }
}

Trainer::~Trainer() = default;

const fs::path& Trainer::run_dir() const {
  return s_->run_dir;
}
const Model& Trainer::model() const {
  return *s_->model;
}
const Dataset& Trainer::train_data() const {
  return s_->train;
}
const Dataset& Trainer::eval_data() const {
  return s_->eval;
}

EvalResult Trainer::evaluate() {
  auto& s = *s_;
  EvalResult r;
  const Dataset& d = s.eval.rows > 0 ? s.eval : s.train;
  const std::int64_t bs = s.e.data.eval_batch_size;
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::vector<std::int64_t> idx;
  for (std::int64_t start = 0; start < d.rows; start += bs) {
    const std::int64_t rows = std::min(bs, d.rows - start);
    idx.resize(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) idx[static_cast<std::size_t>(i)] = start + i;
    gather_batch(d, idx, s.x_host.data(), s.y_host.data());
    s.c.backend->copy_from_host(s.model->input(rows), s.x_host.data());
    s.c.backend->copy_from_host(s.model->labels(rows), s.y_host.data());
    s.model->forward(rows);
    auto lv = s.model->loss(rows, 1.0f, false);
    loss_sum += static_cast<double>(lv.loss) * static_cast<double>(rows);
    correct += lv.correct;
  }
  r.rows = d.rows;
  r.loss = d.rows > 0 ? loss_sum / static_cast<double>(d.rows) : 0.0;
  r.accuracy = d.rows > 0 ? static_cast<double>(correct) / static_cast<double>(d.rows) : 0.0;
  return r;
}

fs::path Trainer::save_checkpoint() {
  auto& s = *s_;
  auto& b = *s.c.backend;
  sdk::TrainingState st;
  for (auto* p : s.model->parameters())
    st.tensors.push_back(to_host(b, "param/" + p->name, p->master.view()));
  for (const auto& t : s.c.optimizer->state_tensors())
    st.tensors.push_back(to_host(b, "optimizer/" + t.name, t.view));
  auto cursor = s.sampler->cursor();
  st.metadata["mixtrain.state_version"] = kTrainingStateVersion;
  st.metadata["mixtrain.version"] = sdk::kSdkVersion;
  st.metadata["progress"] = progress_to_json({s.step, s.applied, s.skipped, s.last_loss}).dump();
  st.metadata["sampler"] = json{
      {"epoch", cursor.epoch},
      {"position", cursor.position},
      {"seed", s.e.run.seed},
      {"rows", s.train.rows}}.dump();
  st.metadata["scaler"] = component_state_to_json(s.e.scaler_type, s.c.scaler->save_state()).dump();
  st.metadata["policy"] = component_state_to_json(s.e.policy_name, s.c.policy->save_state()).dump();
  st.metadata["optimizer"] =
      component_state_to_json(s.e.optimizer_type, s.c.optimizer->save_state()).dump();
  st.metadata["config"] = resolved_toml(s.e);

  char name[64];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(s.step));
  fs::path dir = s.run_dir / "checkpoints";
  fs::path path = dir / (name + s.c.checkpoint_format->file_extension());
  // A save killed midway (kill -9, power loss) leaves its temporary file; each save removes those
  // that no live writer holds.
  for (const auto& stale : sdk::remove_stale_temp_files(dir))
    s.log.info("removed " + stale.string() + ", left by an interrupted checkpoint write");
  s.c.checkpoint_format->write(path, st);

  // Keep the newest `keep` checkpoints of this run, by step number (names stop sorting by step
  // once a step outgrows the zero padding).
  auto all = step_checkpoints(dir, s.c.checkpoint_format->file_extension());
  std::error_code ec;
  for (std::size_t i = 0; i + static_cast<std::size_t>(s.e.checkpoint.keep) < all.size(); ++i)
    fs::remove(all[i], ec);
  s.log.info("checkpoint written: " + path.string());
  return path;
}

namespace {

// The format that reads `path` for a weights-only load: the one whose extension the file has
// (e.g. .safetensors exported for or by other tools), else the configured one. Full resumes always
// use the configured format, which holds the whole training state.
const sdk::CheckpointFormat& weights_format_for(const Components& c, const fs::path& path) {
  const auto ext = path.extension().string();
  if (c.checkpoint_format->file_extension() == ext) return *c.checkpoint_format;
  for (const auto& f : c.weight_formats)
    if (f->file_extension() == ext) return *f;
  return *c.checkpoint_format;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

void Trainer::load_checkpoint(const fs::path& path, bool weights_only) {
  auto& s = *s_;
  auto& b = *s.c.backend;
  auto st =
      weights_only ? weights_format_for(s.c, path).read(path) : s.c.checkpoint_format->read(path);
  // Weights are "param/<layer>.<weight|bias>" in mixtrain's checkpoints and plain
  // "<layer>.<weight|bias>" in files exported for (or written by) other tools.
  std::set<const sdk::HostTensor*> used;
  for (auto* p : s.model->parameters()) {
    const auto* t = st.find("param/" + p->name);
    if (t == nullptr) t = st.find(p->name);
    if (t == nullptr) {
      std::string have;
      for (std::size_t i = 0; i < st.tensors.size() && i < 8; ++i)
        have += (i ? ", " : "") + st.tensors[i].name;
      if (st.tensors.size() > 8) have += ", ...";
      throw sdk::CheckpointError(path.string() + ": no tensor for parameter '" + p->name +
                                     "' (looked for 'param/" + p->name + "' and '" + p->name + "')",
                                 "the file belongs to a different model; it holds: " +
                                     (have.empty() ? "no tensors" : have));
    }
    const auto expected = p->master.view().shape.to_vector();
    if (t->shape != expected)
      throw sdk::CheckpointError(path.string() + ": tensor '" + t->name + "' has shape " +
                                     shape_text(t->shape) + " but parameter '" + p->name +
                                     "' expects " + shape_text(expected),
                                 "the file belongs to a different model; check [model] layers");
    from_host(b, *t, p->master.view(), path);
    used.insert(t);
  }
  s.model->refresh_working_copies();
  if (weights_only) {
    for (const auto& t : st.tensors)
      if (!used.count(&t) &&
          (t.name.find('/') == std::string::npos || t.name.rfind("param/", 0) == 0))
        s.log.warn(path.string() + ": tensor '" + t.name + "' matches no parameter; ignored");
    s.log.info("initial weights loaded from " + path.string());
    return;
  }
  auto meta = [&](const std::string& key) -> json {
    auto it = st.metadata.find(key);
    if (it == st.metadata.end())
      throw sdk::CheckpointError(path.string() + ": no '" + key + "' entry",
                                 "this file holds weights only; use it as checkpoint.init_from");
    auto j = json::parse(it->second, nullptr, false);
    if (j.is_discarded())
      throw sdk::CheckpointError(path.string() + ": the '" + key + "' entry is not valid JSON");
    return j;
  };
  check_training_state_version(st.metadata, path);
  try {
    auto progress = read_progress(meta("progress"), s.e.run.steps, path);
    auto sampler = meta("sampler");
    if (read_checkpoint_int(sampler.at("rows"), "sampler.rows", 0,
                            std::numeric_limits<std::int64_t>::max(), path) != s.train.rows ||
        !sampler.at("seed").is_number_unsigned() ||
        sampler.at("seed").get<std::uint64_t>() != s.e.run.seed)
      throw sdk::CheckpointError(
          path.string() + ": the checkpoint was trained on other data (rows or seed differ)",
          "resume with the same [data] and run.seed as the original run");
    for (const auto& t : s.c.optimizer->state_tensors()) {
      const auto* h = st.find("optimizer/" + t.name);
      if (h == nullptr)
        throw sdk::CheckpointError(path.string() + ": no optimizer state '" + t.name + "'",
                                   "resume with the same optimizer as the original run");
      from_host(b, *h, t.view, path);
    }
    // The components range-check their own entries; their messages gain the file's name.
    auto load = [&](const char* what, const std::string& type, auto& component) {
      auto state = component_state_from_json(meta(what), what, type, path);
      check_component_counters(state, what, progress, path);
      try {
        component.load_state(state);
      } catch (const sdk::CheckpointError& e) {
        const std::string message = e.what();
        const bool says_role = message.rfind(what, 0) == 0;  // "scaler 'dynamic' state ..."
        throw sdk::CheckpointError(
            path.string() + ": " + (says_role ? "" : what + std::string(": ")) + message, e.hint());
      }
    };
    load("optimizer", s.e.optimizer_type, *s.c.optimizer);
    load("scaler", s.e.scaler_type, *s.c.scaler);
    load("policy", s.e.policy_name, *s.c.policy);
    s.sampler->set_cursor(
        read_sampler_cursor(sampler, progress.step, s.sampler->batches_per_epoch(), path));
    s.step = progress.step;
    s.applied = progress.applied;
    s.skipped = progress.skipped;
    s.last_loss = progress.last_loss;
  } catch (const json::exception& e) {
    throw sdk::CheckpointError(path.string() + ": malformed training state: " + e.what(),
                               "the checkpoint is damaged; use an earlier one");
  }
  s.log.info("resumed from " + path.string() + " at step " + std::to_string(s.step));
}

TrainSummary Trainer::run() {
  auto& s = *s_;
  auto& e = s.e;
  auto& b = *s.c.backend;
  const std::int64_t bs = e.data.batch_size;
  TrainSummary sum;
  sum.run_dir = s.run_dir;

  s.log.info("run '" + e.run.name + "': " + std::to_string(s.model->parameter_count()) +
             " parameters, policy " + e.policy_name + ", scaler " + e.scaler_type + ", optimizer " +
             e.optimizer_type + ", backend " + b.capabilities().device_name + ", folder " +
             s.run_dir.string());
  auto write_record = [&](const json& j) {
    if (s.metrics.is_open()) {
      s.metrics << j.dump() << '\n';
      s.metrics.flush();
    }
  };

  // Per layer boundary, the share of non-zero activation gradients that flush to zero in the
  // dtype the policy stores them in, at the loss scale of this step: the underflow that loss
  // scaling exists to prevent, made visible. metrics.jsonl gets every tensor, the log one line.
  auto underflow_record = [&](float scale) {
    const auto counts = s.model->measure_gradient_underflow(bs, scale);
    json shares = json::object();
    for (const auto& c : counts) {
      if (c.dtype == sdk::DType::fp32) continue;
      // nonzero = 0 (all zero) has no share; 0 keeps the field numeric for readers.
      const double share =
          c.nonzero ? static_cast<double>(c.flushed) / static_cast<double>(c.nonzero) : 0.0;
      shares[c.tensor] = {
          {"dtype", sdk::dtype_name(c.dtype)}, {"flushed_share", share}, {"nonzero", c.nonzero}};
    }
    if (auto line = underflow_summary_line(counts, scale); !line.empty()) s.log.info(line);
    return json{{"step", s.step}, {"underflow_scale", scale}, {"underflow", shares}};
  };

  // Per FP8 operand slot of this step: amax, scale, and the shares that saturated or flushed to
  // zero in the cast.
  auto fp8_record = [&]() {
    json slots = json::object();
    for (const auto& l : s.model->layers())
      for (const auto& st : l->operand_stats()) {
        const double nz = st.nonzero ? static_cast<double>(st.nonzero) : 1.0;
        slots[st.slot] = {{"dtype", sdk::dtype_name(st.dtype)},
                          {"amax", st.amax},
                          {"scale", st.scale},
                          {"saturated_share", static_cast<double>(st.saturated) / nz},
                          {"underflow_share", static_cast<double>(st.underflowed) / nz}};
      }
    return json{{"step", s.step}, {"fp8", slots}};
  };

  auto evaluate_and_log = [&]() {
    sum.eval = evaluate();
    sum.evaluated = true;
    sum.eval_step = s.step;
    write_record(
        {{"step", s.step}, {"eval_loss", sum.eval.loss}, {"eval_accuracy", sum.eval.accuracy}});
    char line[160];
    std::snprintf(line, sizeof line, "eval at step %lld: loss %.5f accuracy %.4f",
                  static_cast<long long>(s.step), sum.eval.loss, sum.eval.accuracy);
    s.log.info(line);
  };

  const auto t_start = Clock::now();
  auto t_window = t_start;
  std::int64_t window_rows = 0;
  const std::int64_t first_step = s.step;
  ProgressReport progress(first_step, e.run.steps, bs, s.opt.progress_line, s.log);
  bool interrupted = false;
  std::string stopped_by;  // run.on_nonfinite = "stop": why

  while (s.step < e.run.steps) {
    ++s.step;
    auto idx = s.sampler->next();
    gather_batch(s.train, idx, s.x_host.data(), s.y_host.data());
    b.copy_from_host(s.model->input(bs), s.x_host.data());
    b.copy_from_host(s.model->labels(bs), s.y_host.data());

    const float scale = s.c.scaler->scale();
    if (s.c.policy->uses_scaled_operands() && e.run.underflow_every > 0)
      for (auto& l : s.model->layers())
        l->collect_operand_stats(s.step % e.run.underflow_every == 0);
    s.model->forward(bs);
    if (e.run.underflow_every > 0 && s.step % e.run.underflow_every == 0 && s.underflow_watch)
      write_record(underflow_record(scale));
    const bool fp8_stats_step = s.c.policy->uses_scaled_operands() && e.run.underflow_every > 0 &&
                                s.step % e.run.underflow_every == 0;
    // The loss stays on the device: the step's one wait is the found_inf read below.
    s.model->compute_loss(bs, scale, true);
    s.model->backward(bs);
    // A stop request (Ctrl-C) lets this step finish and then reports it as the last one.
    interrupted = s.opt.stop_requested && s.opt.stop_requested() && s.step < e.run.steps;
    const bool last_step = s.step == e.run.steps || interrupted;
    const bool log_step = s.step % e.run.log_every == 0 || last_step;
    // Clipping and the logged gradient norm need Σg²: read with found_inf, in the same wait.
    const bool wants_norm = e.schedule.clip_grad_norm > 0.0 || log_step;
    bool found_inf = false;
    double grad_sum_squares = std::nan("");
    if (wants_norm) {
      const auto check = b.unscale_check_and_sum_squares(s.grads, 1.0f / scale);
      found_inf = check.found_inf;
      grad_sum_squares = check.sum_of_squares;
    } else {
      found_inf = b.unscale_and_check_finite(s.grads, 1.0f / scale);
    }
    // The device is idle now, so what the host reads next costs no pipeline stall: the delayed
    // FP8 amaxes of this step's casts, and the loss where this step reports or keeps it.
    if (s.c.policy->uses_scaled_operands()) s.model->flush_operand_amaxes();
    auto decision = s.c.scaler->update(found_inf);
    const bool live_refresh = progress.live_due(s.step) || (progress.live() && last_step);
    const bool eval_step = e.run.eval_every > 0 && s.step % e.run.eval_every == 0 && !interrupted;
    const bool checkpoint_step = e.checkpoint.every > 0 && s.step % e.checkpoint.every == 0;
    LossValues lv;
    lv.loss = s.last_loss;
    if (log_step || !decision.apply_step || live_refresh || eval_step || checkpoint_step) {
      lv = s.model->read_loss();  // before an eval overwrites the loss buffer
      s.last_loss = lv.loss;
    }

    double grad_norm = std::nan("");
    std::string nonfinite_where;
    double lr = s.schedule.lr_at(s.applied);
    if (decision.apply_step) {
      float coef = 1.0f;
      if (wants_norm) {
        grad_norm = std::sqrt(grad_sum_squares);
        if (e.schedule.clip_grad_norm > 0.0 && grad_norm > e.schedule.clip_grad_norm)
          coef = static_cast<float>(e.schedule.clip_grad_norm / (grad_norm + 1e-6));
      }
      s.c.optimizer->step(b, s.params, {static_cast<float>(lr), coef});
      ++s.applied;
      s.c.policy->on_step_end(true);
    } else {
      ++s.skipped;
      // Name the first non-finite tensor by replaying the step with a check after every write;
      // the policy hears of the skip afterwards, so it discards the replay's amaxes too.
      nonfinite_where = s.model->locate_first_nonfinite(bs, decision.scale_before);
      s.c.policy->on_step_end(false);
      const std::string where = nonfinite_where.empty() ? "none on replay" : nonfinite_where;
      char msg[256];
      std::snprintf(
          msg, sizeof msg, "step %lld skipped: non-finite values (first: %s); loss scale %g -> %g",
          static_cast<long long>(s.step), where.c_str(), static_cast<double>(decision.scale_before),
          static_cast<double>(decision.scale_after));
      s.log.warn(msg);
      if (!std::isfinite(lv.loss) && e.run.on_nonfinite == "stop")
        stopped_by = "run.on_nonfinite = \"stop\" stopped it at step " + std::to_string(s.step) +
                     ": the loss is not finite (first non-finite tensor: " + where +
                     "); master weights are unchanged by this step";
    }
    window_rows += bs;
    if (fp8_stats_step) write_record(fp8_record());

    if (log_step || !decision.apply_step) {
      auto now = Clock::now();
      double dt = std::chrono::duration<double>(now - t_window).count();
      double sps = dt > 0 ? static_cast<double>(window_rows) / dt : 0.0;
      t_window = now;
      window_rows = 0;
      json rec = {{"step", s.step},
                  {"loss", lv.loss},
                  {"loss_scale", decision.scale_before},
                  {"next_loss_scale", decision.scale_after},
                  {"skipped", !decision.apply_step},
                  {"lr", lr},
                  {"grad_norm", std::isfinite(grad_norm) ? json(grad_norm) : json(nullptr)},
                  {"samples_per_s", sps},
                  {"epoch", s.sampler->cursor().epoch}};
      if (!decision.apply_step) rec["nonfinite"] = nonfinite_where;
      write_record(rec);
      progress.log_step(s.step, lv.loss, decision.scale_before, lr, sps);
    }
    if (live_refresh) progress.show_live(s.step, lv.loss, s.c.scaler->scale());
    if (eval_step) evaluate_and_log();
    const bool stopping = interrupted || !stopped_by.empty();
    if (stopping) break;
    if (checkpoint_step && s.step != e.run.steps) save_checkpoint();
  }
  progress.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
  // An interrupted run goes straight to its checkpoint; the evaluation would make the user wait.
  if (!interrupted && !(sum.evaluated && sum.eval_step == s.step)) evaluate_and_log();
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
  if (s.opt.write_outputs) write_run_summary(s.run_dir / "summary.json", sum);
  if (interrupted)
    s.log.warn("interrupted after step " + std::to_string(s.step) + " of " +
               std::to_string(e.run.steps) +
               (last_checkpoint.empty() ? std::string()
                                        : "; continue with --resume " + last_checkpoint.string()));
  return sum;
}

}  // namespace mixtrain::core
