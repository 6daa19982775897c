// Trainer: the mixed-precision training loop (docs/architecture.md, "One training step"), its
// outputs and its checkpoints.
//
// Contract
// - Construction loads the data, builds the model under the policy's plan (checked against the
//   backend's capabilities), binds the optimizer and, with `resume`, restores the complete
//   training state so the run continues bit for bit. Bad input raises sdk::UserError subclasses;
//   a checkpoint's counters are all range-checked first (checkpoint/state.h): one out of range,
//   or past run.steps, is sdk::CheckpointError naming the field and the file.
// - run() trains to run.steps, writing into the run folder: config.toml (resolved), metrics.jsonl
//   (one JSON object per logged step and per evaluation, flushed as written), checkpoints/ and
//   summary.json. It never overwrites another run's files: an existing run folder is refused
//   unless it is the folder being resumed. Each checkpoint save first removes the temp files of
//   killed saves (sdk::remove_stale_temp_files), then keeps the checkpoint.keep newest by step.
// - run() stops early, after the step in progress, when TrainOptions::stop_requested answers
//   true (Ctrl-C: see train/interrupt.h), when run.on_nonfinite = "stop" meets a non-finite loss,
//   or when early stopping's patience runs out at an evaluation before run.steps; it still writes
//   the final checkpoint and summary.json, and the summary says interrupted, diverged or
//   stopped_early (runs/summary.h). A diverged run is a result, not an exception. run() is once
//   per Trainer: a second call is std::logic_error (it would evaluate, checkpoint and summarise
//   the finished run again, over its files); a new Trainer with `resume` continues it.
// - training_state() copies from the device and changes nothing: taken before run() without
//   `resume`, its weights are the seeded initialisation (then checkpoint.init_from) that step 1
//   starts from, bit for bit.
// - Early stopping's and checkpoint.keep_best's state (train/metric_watch.h) is part of the
//   training state a checkpoint holds, so a resumed run counts on from the same best and the same
//   evaluations since. keep_best writes checkpoints/best<ext> after every evaluation that improves
//   the best (the whole training state, as a step checkpoint); a resume reconciles that file with
//   the restored best (train/trainer_state.h, reconcile_best_checkpoint).
// - [precision.escalate]: after a skipped step, the op its replay blamed is counted; the
//   `after`-th blame within `window` steps promotes it one format wider and run() rebuilds the
//   model under the new plan, carrying masters, buffers and optimizer state over bit for bit
//   (core/src/train/planned_model.h). The promotions are part of the training state: a resume
//   plans the model as it was trained, and so does load_checkpoint() weights-only in a Trainer
//   that writes nothing (eval, predict, sample, export); model() is a new object after either.
//   Such a load (not the constructor's checkpoint.init_from) also runs the checkpoint as its run
//   evaluated it: under eval.weights = "ema" its EMA becomes the weights (sample decodes with
//   them too), and the policy takes the checkpoint's state when it is the same policy (delayed
//   FP8 scaling's amax histories).
// - Step semantics: loss in FP32, backward seeded with the loss scale, fused unscale + non-finite
//   check on FP32 gradients, optional clipping after unscaling, then the scaler decides; a
//   skipped step leaves master weights, optimizer state and the lr schedule untouched.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/checkpoint/path.h"  // resolve_checkpoint_path (resume)
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/runs/summary.h"
#include "mixtrain/core/train/memory_report.h"
#include "mixtrain/sdk/checkpoint_format.h"

namespace mixtrain::core {

// Watches every computing node of every training micro-batch as the executor runs it: after its
// forward (its output and inputs are written) and after its backward (`input_grads` are the
// contributions it wrote for its inputs, empty views where an input needs none). Views are not
// visited. The views handed over are valid only during the call. Steps with an observer run op by
// op (never replayed from a recorded step graph); what they compute is unchanged. Calibration
// (precision/calibration.h) is the client.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void after_forward(Model& model, std::size_t node, Extent extent) = 0;
  virtual void after_backward(Model& model, std::size_t node, Extent extent,
                              std::span<const sdk::TensorView> input_grads) = 0;
  // After the optimizer step `step` (applied or skipped).
  virtual void after_step(std::int64_t /*step*/) {}
};

enum class DataSplits { both, held_out, none };

struct TrainOptions {
  std::filesystem::path run_dir;                // empty: run.dir or runs/<name> (made unique)
  std::optional<std::filesystem::path> resume;  // a checkpoint file or a checkpoints folder
  bool progress_line = false;                   // live progress line (a terminal is attached)
  bool write_outputs = true;                    // false: evaluate-only use, nothing written
  std::function<bool()> stop_requested;         // asked before and after each step (and after its
                                         // evaluation or checkpoint); true: stop after the step
                                         // in progress, or the one just finished
  std::function<void(std::int64_t step)> after_step;  // after each training step's update
  // Each record run() adds to metrics.jsonl (a logged or skipped step's, an evaluation's, the
  // diagnostics'), as that line's JSON text, once written: what an embedding program reads of the
  // run without the file. On every rank of a data-parallel run (the global batch's numbers), and
  // where nothing is written (write_outputs = false).
  std::function<void(std::string_view json_line)> on_record;
  StepObserver* observer = nullptr;                   // non-owning; outlives the Trainer's run()
  // > 0: run() stops after this many steps, short of run.steps, without the final evaluation;
  // the schedule still spans run.steps (calibration's first steps of the configured run).
  std::int64_t step_limit = 0;
  // false: a session that evaluates, predicts, samples or exports initial weights, never run() (a
  // logic_error): the optimizer is bound to no parameters, so it holds no state (AdamW's two
  // FP32 moments per weight, a GPT-2 small's 1 GB).
  bool trains = true;
  // The data splits the session reads; a language model's input shape is the config's
  // (block_size, vocab_size), so a token source can be left unopened, and a run folder runs where
  // its token files are not. Image and table sources load unless `shape_from` records their
  // shape.
  // - both: training.
  // - held_out: a session that evaluates and trains nothing (eval): a token source with held-out
  //   files of its own opens only those (data/dataset.h, load_held_out_data).
  // - none: a session that feeds the model inputs of its own (sample, predict): a token source
  //   is not opened, and evaluate() is then a logic_error.
  // Without the training split, run() and memory_report(true) are a logic_error, and so is the
  // constructor with `trains`, `resume` or a communicator.
  DataSplits splits = DataSplits::both;
  // With splits = none: the checkpoint the session loads next (predict). A table or image model
  // then takes its input shape, classes and normalisation from the checkpoint's record
  // (data/data_shape.h) instead of its data files, which are not opened, and evaluate() is a
  // logic_error. With splits = held_out (eval), a cifar10 source whose held-out files are its own
  // (data.cifar10.eval, or the folder's test_batch.bin) takes the same from the record and opens
  // only those files (load_cifar10_held_out); evaluate() runs on them. Other sources ignore it. The
  // file is read once: load_checkpoint() of this path takes what the constructor read. A checkpoint
  // without a readable record (written before it, by another tool, or damaged: a warning) leaves
  // the files to give them. Errors: the format's read(), and sdk::ConfigError for [data] keys that
  // do not fit the recorded data.
  std::filesystem::path shape_from;
  // A checkpoint whose weights the constructor loads last, as load_checkpoint(weights, true,
  // weights_layout) right after it would (eval, predict, sample); with `resume`, a logic_error.
  // Whichever load the constructor makes (this one, checkpoint.init_from or a resume), the
  // parameters it must fill are zeroed rather than drawn (Model::init_parameters): a resume's
  // every one, a weights-only load's all but LoRA adapters, which a base model's file may lack
  // and which then keep their draw.
  std::filesystem::path weights;
  WeightLayout weights_layout = WeightLayout::native;
  // Called with the built model before the constructor loads any weights: a session's check of
  // the model itself, whose error then comes before a checkpoint's (sample: whether the model can
  // decode at all).
  std::function<void(Model&)> check_model;
};

// One batch of predictions (Trainer::predict): rows [first_row, first_row + rows) of the input
// and their logits in FP32, [rows, classes], or [rows, T, classes] for a language model.
struct PredictionBatch {
  std::int64_t first_row = 0, rows = 0;
  std::span<const float> logits;
};

class Trainer {
 public:
  Trainer(const Experiment& experiment, Components components, const TrainOptions& options);
  ~Trainer();

  TrainSummary run();
  // The eval split (the training split when it is empty): predict() over all its rows.
  EvalResult evaluate();
  // Runs the model in evaluation mode, under the training precision plan and with the weights
  // evaluate() uses (eval.weights), over every row of `inputs` — data of the training split's
  // form, shape and classes, normalised as it was — in data.eval_batch_size batches, handing each
  // batch's logits to `on_batch` (when set) in row order. Loss and accuracy are means over the
  // labels of rows [0, labelled_rows) (rows = labelled_rows), batched as evaluate() batches, so
  // predicting the eval split gives evaluate()'s numbers bit for bit; the rows after them run in
  // batches of their own. std::invalid_argument when labelled_rows is outside [0, inputs.rows],
  // or the inputs are not of the training split's form (token windows or rows, their width) or
  // hold fewer values, tokens or labels than their rows need (a table's every row needs a label,
  // any class where it is unknown: only the first labelled_rows count).
  EvalResult predict(const Dataset& inputs, std::int64_t labelled_rows,
                     const std::function<void(const PredictionBatch&)>& on_batch);
  // Loads parameters (and, unless weights_only, the whole training state) from a checkpoint.
  // `layout` gpt2 (weights only) reads a Hugging Face GPT-2 file (checkpoint/gpt2_layout.h): every
  // tensor must then be a parameter of the model; a missing, extra or misshapen one is
  // sdk::CheckpointError naming it.
  void load_checkpoint(const std::filesystem::path& path, bool weights_only,
                       WeightLayout layout = WeightLayout::native);
  // What a checkpoint taken now holds, as save_checkpoint() writes it: "param/<name>" (FP32
  // masters) and "buffer/<name>" tensors and the metadata (progress, sampler, component states,
  // the resolved config); unless weights_only, also "optimizer/<slot>" and "ema/<name>"
  // (`mixtrain export --initial` takes the weights before run()).
  sdk::TrainingState training_state(bool weights_only) const;
  // The bytes of the "optimizer/<slot>" tensors training_state(false) would hold, from their
  // shapes and dtypes, copying nothing (collective under data parallelism, as training_state is).
  std::size_t optimizer_state_bytes() const;
  std::filesystem::path save_checkpoint();
  const std::filesystem::path& run_dir() const;
  const Model& model() const;
  Model& model();  // e.g. to decode with it (`mixtrain sample`)
  const Dataset& train_data() const;
  const Dataset& eval_data() const;
  // The per-channel normalisation applied to the data (given, or computed from the training
  // split); empty when there is none.
  const ChannelStats& normalization() const;
  // What run() will hold in the backend's memory at its peak (train/memory_report.h), in the
  // allocator's own count, so it cannot drift from what run() reports. Without `rehearse`, what
  // is allocated before the first step, item by item; nothing runs. With it, also what the step
  // adds, measured by rehearsing every path a step may take once (train/step.h,
  // run_each_step_path) and one evaluation batch of data.eval_batch_size rows, on the first
  // training batch and the first evaluation rows: quietly (no log lines, no records), but the
  // Trainer is then one step on — weights, optimizer state, data position — so that is for a
  // Trainer that will not train (`check`). Not covered: a model rebuilt by [precision.escalate].
  // `progress`, when set, is called after each rehearsed path (its name, as in
  // MemoryReport::rehearsed) with the seconds it took: a step at a large input runs for minutes.
  using RehearsalProgress = std::function<void(std::string_view path, double seconds)>;
  MemoryReport memory_report(bool rehearse, const RehearsalProgress& progress = {});

  // Opaque outside the core (core/src/train/trainer_state.h), named here so the files that
  // implement the trainer (one per job) can share it.
  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace mixtrain::core
