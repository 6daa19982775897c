// Trainer::State: what one training run holds, shared by the files that implement the Trainer
// (train/trainer.cpp: construction and the loop; step.cpp: one step; checkpoint_save.cpp and
// checkpoint_load.cpp: save and resume; format_keeps.cpp: what checkpoint.format keeps, and so how
// a run goes on from its checkpoints; best_checkpoint.cpp: checkpoint.keep_best; evaluation.cpp:
// evaluation). Internal to the core. The run's position, its precision state, its
// data position and its metrics are objects of their own (train/run_position.h,
// precision_state.h, data_position.h, run_metrics.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "distributed/reducer.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/data/data_shape.h"
#include "mixtrain/core/runs/component_history.h"
#include "mixtrain/core/runs/folder.h"
#include "mixtrain/core/train/lr_schedule.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/optimizer_gated_step.h"
#include "train/data_position.h"
#include "train/host_tensor.h"
#include "train/precision_state.h"
#include "train/run_metrics.h"
#include "train/run_position.h"
#include "train/step_graph.h"

namespace mixtrain::core {

struct Trainer::State {
  Experiment e;
  Components c;
  TrainOptions opt;
  sdk::Logger log = core_logger("trainer");
  Dataset train, eval;
  // data/data_fingerprint.h, of each split as loaded: checkpoints keep them, a resume compares.
  std::string train_fingerprint, eval_fingerprint;
  // Image data: what a raw 0 pixel is after normalisation, per channel (crop padding's fill).
  std::vector<float> black;
  ChannelStats normalization;  // [data.normalize] as applied; empty: none
  // Byte images decoded on the device (sdk/backend_image_input.h): each split's table, fp32
  // [C, 256] in the backend's memory. Empty when the host decodes: float images, or a backend
  // without the image_input facet for the model's input dtype.
  Tensor train_pixel_table, eval_pixel_table;
  std::unique_ptr<Model> model;
  // What the optimizer is bound to and what the step unscales and checks (the reducer may have
  // moved the gradients: distributed/reducer.h).
  std::vector<sdk::Parameter> params;
  std::vector<sdk::TensorView> grads;
  LrSchedule schedule;
  std::filesystem::path run_dir;
  std::optional<RunFolderLock> run_folder_lock;  // held while the run writes run_dir
  bool loading_initial_weights = false;          // the constructor's checkpoint.init_from load
  // The init_from file, when it held trained LoRA adapters (from_peft must not replace them).
  std::optional<std::filesystem::path> initial_adapters_from;
  bool ran = false;                              // run() was called (it runs once)
  bool data_loaded = true;  // the training split (TrainOptions::splits both, or not tokens)
  bool evaluates = true;    // the held-out split (TrainOptions::splits other than none)
  // TrainOptions::shape_from's record, when the model was built from it: train and eval are
  // dataset_of_shape() (no rows), and no data file was read.
  std::optional<DataShape> recorded_shape;
  // That checkpoint as read: load_checkpoint() of the same path takes it instead of reading the
  // file again.
  std::optional<std::pair<std::filesystem::path, sdk::TrainingState>> shape_checkpoint;
  RunPosition position;
  // From a training step's first forward until its update is made (run_training_step): an error
  // then leaves a half-made state that no checkpoint may hold (train/settled_state.h).
  bool step_in_flight = false;
  // The components of the steps before this process's first (a resumed run's, from its
  // checkpoint); this process's own segment starts at history_first_step (current_history()).
  ComponentHistory history;
  std::int64_t history_first_step = 1;
  PrecisionState precision;
  DataPosition data;
  RunMetrics metrics;
  // Gradient accumulation (run.accumulate > 1): the mean loss of the step's micro-batches, summed
  // on the device.
  Tensor loss_sum;
  // [ema]: an FP32 copy per trainable parameter (model.trainable_parameters() order), updated
  // after applied steps.
  std::vector<Tensor> ema;
  // Forward, loss and backward recorded and replayed where the backend and the step allow.
  std::unique_ptr<StepGraph> step_graph;
  // The gated update (train/step.cpp; docs/architecture.md, "One training step"): the optimizer's
  // GatedStepFacet where the step queues the update before it reads the gradient check (null:
  // the step waits for the check, then updates), and the status the queued check writes and the
  // update reads on the device (int32 [4], sdk::GradientStatus). Set by build_model.
  sdk::GatedStepFacet* gated_optimizer = nullptr;
  Tensor gradient_status;
  // The replicas that share the step (distributed/reducer.h): a LocalReducer in one process.
  // rank_batch is the rows this process computes per micro-batch (data.batch_size / world:
  // data.batch_size is the global batch). Only the leading rank writes files (`writes`); every
  // rank runs the collectives that checkpoints and evaluation need.
  std::unique_ptr<Reducer> reducer;
  std::int64_t rank_batch = 0;
  // Rows per evaluation batch (Trainer::predict), set by build_model: data.eval_batch_size, or, in
  // a trainer that trains, at most the rows it evaluates (the held-out split, else the training
  // split), so that a larger setting sizes no buffer for rows that never exist. A session that
  // never trains batches inputs of its own (predict's) at data.eval_batch_size.
  std::int64_t eval_batch_rows = 0;
  bool writes = true;
  bool warned_of_scaler_contract = false;  // a scaler applied a non-finite step (step.cpp)
  // checkpoint.format keeps the training state (probe_checkpoint_format, at the start of run()):
  // messages offer --resume of the run's checkpoints, or else a new run from their weights.
  bool checkpoints_resume = true;
};

// Copies the given rows of `d` (features or token ids, and their labels) into the model's batch;
// byte images travel as bytes and are decoded on the device when `d`'s table is there.
// A training batch passes its batch number — the sampler's count of batches drawn before it,
// epoch · batches_per_epoch + position, which a resumed run restores — and gets [data.augment]
// (augment_batch with the run seed); evaluation passes none and is never augmented.
void feed_batch(Trainer::State& s, const Dataset& d, std::span<const std::int64_t> rows,
                std::optional<std::uint64_t> training_batch = std::nullopt);

// The training state on the host, as a checkpoint holds it (checkpoint_save.cpp): the tensors
// "param/<node>.<param>" (FP32: the masters, and a frozen parameter's one copy widened; a quantized
// weight decoded), "buffer/<node>.<buffer>", and unless weights_only "optimizer/<slot>" (whole
// slots, gathered from every rank's shard) and "ema/<node>.<param>" (with [ema]); the metadata
// (checkpoint/state.h) in both. weights_only is what `export --initial` writes. Under data
// parallelism every rank must call it (the optimizer's gather), not only the one that writes.
sdk::TrainingState capture_state(Trainer::State& s, bool weights_only);
// The same state staged (checkpoint/staged_state.h): the metadata, and the tensors read only when
// a format asks (the gathered optimizer slots of a sharded run excepted, read here). Collective as
// capture_state is. `for_save`: for the replica that writes the save while the others serve its
// reads (Reducer::optimizer_state_for_save): it then ends them (end_save_reads) once the format is
// done, also when it failed.
StagedState stage_state(Trainer::State& s, bool weights_only, bool for_save = false);
// Ends the served reads of a save when it leaves scope, however the write went.
struct SaveReadsEnd {
  Reducer& reducer;
  ~SaveReadsEnd();
};
// The run's components by range of steps, this process's included (checkpoint_save.cpp).
ComponentHistory current_history(const Trainer::State& s);
// The newest step checkpoint this run's folder holds from before `step`, if any: what a run that
// ends without writing one leaves to continue from.
std::optional<std::filesystem::path> newest_checkpoint_before(const Trainer::State& s,
                                                              std::int64_t step);
// The frozen parameters' names, sorted: what a resume must freeze again (the "resume" record).
std::vector<std::string> frozen_names(Model& model);

// checkpoint.keep_best: writes the whole training state to checkpoints/best<ext> (atomically, as
// every checkpoint) after an evaluation improved the best.
void save_best_checkpoint(Trainer::State& s);
// After a resume into the run folder: a best checkpoint written after the resumed step belongs to
// the abandoned continuation and moves aside (checkpoints.discarded-after-step-N/), and the
// restored best's file is found in the folder, or copied from the resumed run's, or its absence
// is a warning (the next improvement writes one).
void reconcile_best_checkpoint(Trainer::State& s);
// What checkpoint.format keeps of a training state (format_keeps.cpp), asked of the format
// itself: a one-tensor state ("ema/probe", with "mixtrain.state_version") written to and read back
// from checkpoints/, then removed. training_state: it read back the version and no
// "mixtrain.weights_only" mark (sdk/checkpoint_format.h), so its checkpoints resume. Both true
// without a run folder, on a rank that writes nothing, or when the probe could not tell (the
// format refused the state).
struct FormatKeeps {
  bool training_state = true;
  bool ema = true;
};
FormatKeeps probe_checkpoint_format(const Trainer::State& s);
// With [ema]: the warning when the format drops the EMA's ema/ tensors; nullopt otherwise.
std::optional<std::string> ema_kept_by_format_warning(const Trainer::State& s,
                                                      const FormatKeeps& keeps);
// The warning when the format keeps the weights only: the run's checkpoints cannot be resumed.
std::optional<std::string> weights_only_format_warning(const Trainer::State& s,
                                                       const FormatKeeps& keeps);
// How to go on from `checkpoint`, one of this run's: "--resume <resume_as>" when the run's
// checkpoints resume (State::checkpoints_resume); otherwise a new run from its weights, the
// command that starts one (the run's config.toml with checkpoint.init_from).
std::string continue_route(const Trainer::State& s, const std::filesystem::path& checkpoint,
                           const std::filesystem::path& resume_as);

// Loads the data again normalised with `stats` (the checkpoint's record, for a session that runs
// trained weights: eval, predict) instead of the config's [data.normalize], and uploads the byte
// images' tables anew; a model built from a recorded shape rebuilds its rowless datasets
// instead. Throws what load_data throws.
void normalize_data_as(Trainer::State& s, const ChannelStats& stats);

// TrainOptions::shape_from: reads `checkpoint` (kept in s.shape_checkpoint, for the load that
// follows) and, when it records the data's shape ("data_shape"), sets s.recorded_shape and
// s.normalization (the config's [data.normalize] mean and std when it gives them, the record's
// with from_training, else none) and returns true. false: a checkpoint written before the record,
// by another tool, or whose record cannot be read (said as a warning). Throws what the format's
// read() throws, and sdk::ConfigError for [data] keys that do not fit the recorded data
// (check_data_settings_fit).
bool take_recorded_shape(Trainer::State& s, const std::filesystem::path& checkpoint);

// The format that reads `path` for a weights-only load: the one whose extension the file has
// (e.g. .safetensors exported for or by other tools), else the configured one. Full resumes always
// use the configured format, which holds the whole training state.
const sdk::CheckpointFormat& weights_format_for(const Components& c,
                                                const std::filesystem::path& path);
// `format`'s name and origin among c.weight_formats; null for one the host did not create from
// the registry (a test's wrapper).
const NamedFormat* named_format_of(const Components& c, const sdk::CheckpointFormat& format);
// A resume of `resume` (a file, a run folder or its checkpoints/ folder) whose checkpoint another
// registered format wrote (the file's extension is that format's; a folder holds no step
// checkpoint of checkpoint.format's but one of another's): a run cannot change its checkpoint
// format on resume, so it is sdk::CheckpointError naming both formats, with the --set of the
// file's format that resumes it, and checkpoint.init_from for a new run in this one. A file of a
// format that keeps the weights only is refused as such (its read says so). Nothing otherwise.
void refuse_another_format(const Trainer::State& s, const std::filesystem::path& resume);

// ema = decay * ema + (1 - decay) * master, on the device, for every trainable parameter.
void update_ema(Trainer::State& s);
// ema = master (a fresh EMA: at initialisation, or after loading initial weights).
void reset_ema(Trainer::State& s);

}  // namespace mixtrain::core
