// Trainer::memory_report: the memory report of train/memory_report.h, the step's part measured by
// running each step path once (train/step.h) and one evaluation batch; see trainer.h.
#include <algorithm>
#include <chrono>
#include <map>
#include <span>
#include <tuple>
#include <utility>

#include "graph/allocation_error.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "train/process_memory.h"
#include "train/step.h"
#include "train/trainer_state.h"

namespace mixtrain::core {

namespace {

using sdk::DType;
using Clock = std::chrono::steady_clock;

// The format a node computes in: its GEMM operands' when it has GEMMs, else its activations'.
DType compute_format(const Layer& l) {
  return l.traits().gemms.empty() ? l.precision().activation : l.precision().gemm_input;
}

// Where the backend's scratch and the step's own buffers grow: after each node's forward and
// backward (as a StepObserver) and after each path.
class GrowthWatch final : public StepObserver {
 public:
  GrowthWatch(sdk::DeviceBackend& backend, const sdk::ScratchFacet* scratch, MemoryReport& report)
      : backend_(backend), scratch_(scratch), report_(report) {
    std::tie(allocated_, scratch_bytes_) = now();
  }

  void after_forward(Model& model, std::size_t node, Extent) override {
    node_pass(model, node, "forward");
  }
  void after_backward(Model& model, std::size_t node, Extent,
                      std::span<const sdk::TensorView>) override {
    node_pass(model, node, "backward");
  }
  void after_path(std::string_view path) { grew(std::string(path), std::nullopt); }

 private:
  // The bytes callers hold, and the backend's scratch (0 without the facet: it is in the first).
  std::pair<std::size_t, std::size_t> now() const {
    const std::size_t current = backend_.memory_stats().current_bytes;
    const std::size_t scratch = scratch_ != nullptr ? scratch_->scratch_bytes() : 0;
    return {current - scratch, scratch};
  }
  void node_pass(Model& model, std::size_t node, const char* pass) {
    const Layer& l = *model.layers()[node];
    grew(l.name() + " " + pass, compute_format(l));
  }
  void grew(const std::string& where, std::optional<DType> format) {
    const auto [allocated, scratch] = now();
    if (allocated > allocated_)
      report_.step_growth.push_back({where, format, allocated - allocated_});
    if (scratch > scratch_bytes_)
      report_.scratch_growth.push_back({where, format, scratch - scratch_bytes_});
    allocated_ = allocated;
    scratch_bytes_ = scratch;
  }

  sdk::DeviceBackend& backend_;
  const sdk::ScratchFacet* scratch_;
  MemoryReport& report_;
  std::size_t allocated_ = 0, scratch_bytes_ = 0;
};

// For the rehearsal's scope: the trainer logs nothing (the underflow line, a replay's findings)
// and `watch` is its step observer.
class RehearsalScope {
 public:
  RehearsalScope(Trainer::State& s, StepObserver& watch)
      : s_(s), observer_(std::exchange(s.opt.observer, &watch)) {
    std::swap(s_.log, log_);
  }
  ~RehearsalScope() {
    s_.opt.observer = observer_;
    std::swap(s_.log, log_);
  }
  RehearsalScope(const RehearsalScope&) = delete;
  RehearsalScope& operator=(const RehearsalScope&) = delete;

 private:
  Trainer::State& s_;
  StepObserver* observer_;
  sdk::Logger log_;  // a Logger without a sink: silent
};

// The first `rows` rows of `d` (evaluation reads them from the start).
Dataset first_rows(const Dataset& d, std::int64_t rows) {
  Dataset out;
  out.rows = rows;
  out.features = d.features;
  out.classes = d.classes;
  out.stride = d.stride;
  out.sample_shape = d.sample_shape;
  if (d.is_tokens()) {
    // Window r reads tokens [r·stride, r·stride + T] (its targets are shifted by one).
    const auto need = static_cast<std::size_t>((rows - 1) * d.stride + d.features + 1);
    out.tokens.assign(d.tokens.begin(), d.tokens.begin() + static_cast<std::ptrdiff_t>(
                                                               std::min(need, d.tokens.size())));
  } else {
    const auto values = static_cast<std::ptrdiff_t>(rows * d.features);
    if (d.is_image_files()) {
      out.image_files.assign(d.image_files.begin(), d.image_files.begin() + rows);
      out.image_spec = d.image_spec;
      out.pixel_values = d.pixel_values;
    } else if (d.is_bytes()) {
      out.pixels.assign(d.pixels.begin(), d.pixels.begin() + values);
      out.pixel_values = d.pixel_values;
    } else {
      out.x.assign(d.x.begin(), d.x.begin() + values);
    }
    out.y.assign(d.y.begin(), d.y.begin() + static_cast<std::ptrdiff_t>(rows));
  }
  return out;
}

std::size_t bytes_of(const Tensor& t) {
  return t.empty() ? 0 : t.bytes();
}

// What the model, the optimizer and the step hold before the first step, from the tensors.
std::vector<MemoryItem> held_items(Trainer::State& s) {
  std::vector<MemoryItem> items;
  auto add = [&](std::string what, std::size_t bytes, std::string note = {}) {
    if (bytes > 0) items.push_back({std::move(what), bytes, std::move(note)});
  };
  std::size_t masters = 0, grads = 0, frozen = 0, quantized = 0;
  const QuantizedWeight* quantized_example = nullptr;
  std::map<DType, std::size_t> working;
  for (auto* p : s.model->parameters()) {
    if (p->quantized()) {  // codes and scales; decoded into a shared scratch per GEMM
      quantized += p->stored_bytes();
      quantized_example = &p->quant;
      continue;
    }
    if (p->frozen) {  // one copy, in the dtype its op computes with
      frozen += bytes_of(p->master) + bytes_of(p->working);
      continue;
    }
    masters += bytes_of(p->master);
    grads += bytes_of(p->grad);
    if (!p->working.empty()) working[p->working.dtype()] += p->working.bytes();
  }
  add("fp32 master weights", masters);
  add("fp32 weight gradients", grads);
  for (const auto& [dtype, bytes] : working)
    add(std::string(sdk::dtype_name(dtype)) + " working copies of the weights", bytes);
  add("frozen weights", frozen, "stored once, in their ops' dtype");
  if (quantized_example != nullptr)
    add("frozen " + format_label(quantized_example->format) + " weights", quantized,
        (quantized_example->format == FrozenFormat::nf4
             ? "4-bit codes and an fp32 absmax per " + std::to_string(quantized_example->block) +
                   " elements"
             : format_detail(*quantized_example) + ", a code byte per element") +
            ", decoded per GEMM into one shared working copy");
  std::size_t buffers = 0;
  for (auto* b : s.model->buffers()) buffers += bytes_of(b->value);
  add("buffers (running statistics)", buffers);
  std::size_t slots = 0;
  for (const auto& t : s.c.optimizer->state_tensors()) slots += t.view.bytes();
  add("optimizer state (" + s.e.optimizer_type + ")", slots);
  std::size_t ema = 0;
  for (const auto& t : s.ema) ema += bytes_of(t);
  add("EMA of the weights", ema);

  const ExecutorMemory m = s.model->executor().memory();
  const std::int64_t rows = s.model->max_rows();
  const std::string sized = rows > s.rank_batch
                                ? std::to_string(rows) + " rows: data.eval_batch_size, the larger" +
                                      (rows < s.e.data.eval_batch_size
                                           ? " (its " + std::to_string(s.e.data.eval_batch_size) +
                                                 " cut to the rows evaluated)"
                                           : std::string())
                                : std::to_string(rows) + " rows";
  add("input batch and labels", m.input, sized);
  const std::size_t fp32 = s.model->plan_activations(s.rank_batch, DType::fp32).arena_bytes;
  // One arena holds both; what each alone would take says what the sharing saved.
  const StepMemoryPlan& plan = s.model->executor().step_plan();
  std::string detail = std::to_string(s.rank_batch) + " rows; alone " +
                       memory_text(plan.activations.arena_bytes) + " and " +
                       memory_text(plan.gradients.planned.arena_bytes);
  if (plan.activations.arena_bytes + 4 < fp32)
    detail += "; the activations " + memory_text(fp32) + " in fp32";
  if (plan.fp32_gradients != kNoBuffer)
    detail += "; with the run.underflow_every pass's fp32 gradients (" +
              memory_text(plan.lives[plan.fp32_gradients].bytes) + ")";
  // The ops' step workspaces (a convolution's cuDNN workspace), each live at its pass's step.
  std::size_t workspaces = 0, largest = 0;
  for (const auto* at : {&plan.forward_workspace, &plan.backward_workspace})
    for (const std::size_t k : *at)
      if (k != kNoBuffer) {
        ++workspaces;
        largest = std::max(largest, plan.lives[k].bytes);
      }
  if (workspaces > 0)
    detail += "; with " + std::to_string(workspaces) + " workspaces of the convolutions' passes (" +
              memory_text(largest) + " the largest), each live at its pass's step";
  // An evaluation of more rows keeps nothing for a backward: its forward alone shares the bytes.
  if (const std::size_t evaluation = s.model->executor().evaluation_plan().arena.arena_bytes;
      evaluation > 0)
    detail += "; an evaluation batch of " + std::to_string(s.eval_batch_rows) +
              " rows, forward only, " + memory_text(evaluation) + " in the same bytes";
  add("activations and their gradients", m.activations, detail);
  // An arena of nothing is one word: "the rest" holds such noise.
  if (m.deferred_outputs >= 1024)
    add("outputs written only unfused", m.deferred_outputs, "the skipped-step replay's");
  return items;
}

}  // namespace

MemoryReport Trainer::memory_report(bool rehearse, const RehearsalProgress& progress) {
  auto& s = *s_;
  auto& b = *s.c.backend;
  const sdk::ScratchFacet* scratch = sdk::facet<sdk::ScratchFacet>(b);
  MemoryReport r;
  const sdk::BackendCapabilities caps = b.capabilities();
  r.backend = caps.kind;
  r.device_memory = caps.memory_bytes;
  r.device_name = caps.device_name;
  for (const auto& d : caps.gemm_inputs)
    if (!d.native) r.emulated.push_back(d);

  const sdk::MemoryStats before = b.memory_stats();
  const std::size_t scratch_before = scratch != nullptr ? scratch->scratch_bytes() : 0;
  r.held_bytes = before.current_bytes - scratch_before;
  r.held = held_items(s);
  std::size_t listed = 0;
  for (const auto& item : r.held) listed += item.bytes;
  if (listed < r.held_bytes)
    r.held.push_back({"op buffers and the rest", r.held_bytes - listed,
                      "workspaces, saved statistics, buckets"});

  if (rehearse && (!s.opt.trains || !s.data_loaded))
    throw std::logic_error(
        "Trainer::memory_report: rehearsing a step needs a Trainer that trains "
        "(TrainOptions::trains, splits = both)");
  if (!rehearse) {
    r.peak_bytes = before.peak_bytes;
    if (scratch != nullptr) r.scratch_bytes = scratch_before;
    r.transient_bytes = before.peak_bytes - before.current_bytes;
    return r;
  }

  // What the process could grow to from here: a CPU backend's tensors are in its resident set.
  r.host_memory_at_start = process_memory_limit();
  GrowthWatch watch(b, scratch, r);
  auto started = Clock::now();
  const auto path_done = [&](std::string_view path) {
    r.rehearsed.emplace_back(path);
    watch.after_path(path);
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - started).count();
    r.rehearsed_seconds.push_back(seconds);
    if (progress) progress(path, seconds);
    started = now;
  };
  {
    RehearsalScope scope(s, watch);
    const auto evaluation = [&] {
      const Dataset& d = s.eval.rows > 0 ? s.eval : s.train;
      const Dataset batch = first_rows(d, std::min(s.eval_batch_rows, d.rows));
      if (s.e.eval.top_k > 0)  // top-k reads each batch's logits on the host
        predict(batch, batch.rows, [](const PredictionBatch&) {});
      else
        predict(batch, batch.rows, nullptr);
      path_done(rehearsed_path::kEvaluation);
    };
    // What an evaluation grows (the backend's scratch, at its rows) is still held by the steps
    // after it: a run that evaluates before its last step peaks at a step on top of that.
    const bool steps_follow_an_evaluation =
        s.e.run.eval_every > 0 && s.e.run.eval_every < s.e.run.steps;
    if (steps_follow_an_evaluation) evaluation();
    ++s.position.step;  // as run() numbers its first step (dropout keys its masks on it)
    const NonfiniteSite site = run_each_step_path(s, path_done);
    if (!site.where.empty() && !site.where.starts_with("backward"))
      r.nonfinite_forward = site.where;
    if (!steps_follow_an_evaluation) evaluation();
  }

  const sdk::MemoryStats after = b.memory_stats();
  const std::size_t scratch_after = scratch != nullptr ? scratch->scratch_bytes() : 0;
  if (scratch != nullptr) r.scratch_bytes = scratch_after;
  const std::size_t allocated_after = after.current_bytes - scratch_after;
  r.step_bytes = allocated_after > r.held_bytes ? allocated_after - r.held_bytes : 0;
  r.peak_bytes = after.peak_bytes;
  r.transient_bytes = after.peak_bytes - after.current_bytes;
  if (r.host_memory_at_start > 0) r.host_peak_rss = process_peak_rss_bytes();
  return r;
}

}  // namespace mixtrain::core
