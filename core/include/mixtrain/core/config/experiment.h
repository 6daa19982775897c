// Experiment: a config resolved and validated against the core's and the plugins' schemas.
//
// Contract
// - parse_experiment() reads every table of the config (component sections are laid out as
//   config/component_section.h says), rejects unknown tables and keys (with "did you mean"),
//   validates types and ranges (errors name file:line:col and the key), resolves the plugins named
//   by the config in the registry (errors list what exists) and validates their options against
//   their declared schemas. It creates no plugin object. File paths come back absolute: relative to
//   the config file when written there, to the current folder when given with --set.
// - create_components() instantiates backend, policy, scaler, optimizer and checkpoint format;
//   plugin-specific checks that a schema cannot express fail here, still as sdk::UserError.
// - resolved_toml() renders every effective value (defaults included) as a TOML document that
//   reproduces the run when fed back to `mixtrain train`.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/config/setting_choices.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/precision/planning.h"
#include "mixtrain/core/train/lr_schedule.h"
#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/optimizer.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::core {

struct RunSettings {
  std::string name;
  std::uint64_t seed = 0;
  std::int64_t steps = 0;
  std::int64_t log_every = 10;
  std::int64_t eval_every = 0;  // 0: evaluate at the end only
  NonfiniteAction on_nonfinite = NonfiniteAction::skip;
  std::int64_t underflow_every = 100;  // steps between gradient-underflow reports; 0 = never
  std::string dir;                     // default run directory when --run-dir is not given
  std::int64_t accumulate = 1;         // micro-batches (of data.batch_size) per optimizer step
  bool step_graphs = false;            // replay a recorded static step (train/step_graph.h)
  bool stretch_schedule = false;       // resume with another run.steps: re-plan the lr schedule
  // Where metric records go (host_schemas.h metrics_sinks()); metrics.jsonl is written always.
  std::vector<MetricsSinkKind> metrics = {MetricsSinkKind::jsonl};
  // Early stopping (train/metric_watch.h): stop after this many evaluations in a row without an
  // improvement of early_stopping_metric by more than early_stopping_min_delta; 0 = off.
  std::int64_t early_stopping_patience = 0;
  std::string early_stopping_metric = "eval_loss";
  double early_stopping_min_delta = 0.0;
};

struct EmaSettings {
  double decay = 0.0;  // 0: no EMA
  bool enabled() const { return decay > 0.0; }
};

// [precision.escalate] (docs/precision-autopilot.md, "Escalation"): present means on.
struct EscalationSettings {
  bool enabled = false;
  std::int64_t after = 3;             // blames within the window that promote a node
  std::int64_t window = 200;          // steps a blame is remembered
  std::int64_t deescalate_after = 0;  // clean applied steps that undo the latest promotion; 0 off
};

// [distributed] (docs/architecture.md, "Data parallel"): present, or an MPI launch detected from
// the environment, means one process per rank; `type` names the communicator.
struct DistributedSettings {
  std::string type;  // "": one process
  bool shard_optimizer = false;
  double bucket_mb = 25.0;
  bool overlap = true;
  BatchNormStats batch_norm = BatchNormStats::local;
  bool from_launch = false;   // no [distributed] table: chosen because mpirun started the process
  sdk::SourceLocation where;  // distributed.type (an error about the launch points there)
  bool enabled() const { return !type.empty(); }
};

struct EvalSettings {
  EvalWeights weights = EvalWeights::master;
  std::int64_t top_k = 0;           // > 1: also top-k accuracy (train/top_k.h); 0: off
  sdk::SourceLocation top_k_where;  // a top_k above the model's classes is refused there
};

// [data.normalize]: per-channel (x − mean) / std of image data, given or computed from the
// training split. The locations are where errors that need the loaded data (a count that is not
// the channel count, image-only settings on other data) point.
struct NormalizeSettings {
  std::vector<double> mean, std;  // one per channel when given
  bool from_training = false;     // compute mean and std from the training split instead
  sdk::SourceLocation where, mean_where, std_where;
  bool enabled() const { return from_training || !mean.empty(); }
};

// [data.augment]: training-batch augmentation of image data (augment_batch).
struct AugmentSettings {
  AugmentSpec spec;
  sdk::SourceLocation where;
};

struct DataSettings {
  DataSource source = DataSource::synthetic;
  std::int64_t batch_size = 0;
  std::int64_t eval_batch_size = 0;
  bool shuffle = true;
  double eval_fraction = 0.1;  // tokens / text: the tail, unless eval_paths are given
  std::int32_t classes = 0;    // 0: infer from the labels (tables only)
  SyntheticSpec synthetic;
  std::filesystem::path features_path, labels_path, images_path;
  // npy: how a rank-4 features array holds images: channels-first [N, C, H, W] (PyTorch's, the
  // default) or channels-last [N, H, W, C] (torchvision's CIFAR-10 `.data`, NumPy and TF
  // image arrays), permuted to channels-first when loaded. `npy_layout_where` is where an
  // implausible reading (check_image_plausible) points.
  bool npy_channels_last = false;
  sdk::SourceLocation npy_layout_where;
  // tokens: one llm.c file each; text: files read one after another. No eval_paths: the tail.
  std::vector<std::filesystem::path> token_paths, eval_token_paths;
  std::int64_t block_size = 0;  // tokens / text: tokens a window predicts from (T)
  std::int32_t vocab_size = 0;  // tokens / text: V (text: >= 256)
  // cifar10: binary batch files; cifar_dir (when set) fills in the lists left empty with its
  // data_batch_*.bin and test_batch.bin; no eval files at all: eval_fraction of the training
  // records.
  std::filesystem::path cifar_dir;
  std::vector<std::filesystem::path> cifar_train_paths, cifar_eval_paths;
  NormalizeSettings normalize;  // image tables only
  AugmentSettings augment;      // image tables only
};

// [optimizer]'s host keys: the learning-rate schedule (train/lr_schedule.h) and clipping. The
// reader checks each schedule's keys together (sorted milestones, onecycle's phases, min_lr at
// most the optimizer's lr); keys given that the chosen schedule does not read are listed in
// Experiment::unused_keys.
struct ScheduleSettings {
  LrScheduleKind schedule = LrScheduleKind::constant;
  std::int64_t warmup_steps = 0;
  double min_lr = 0.0;
  std::int64_t step_size = 1;
  double gamma = 0.1;
  std::vector<std::int64_t> milestones;
  double pct_start = 0.3;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  double clip_grad_norm = 0.0;  // 0: no clipping
};

struct CheckpointSettings {
  std::string format;
  std::int64_t every = 0;  // 0: only the final checkpoint
  std::int64_t keep = 3;
  std::string init_from;
  WeightLayout init_layout = WeightLayout::native;  // how init_from stores its weights
  // The evaluation number whose best value keeps checkpoints/best<ext> (train/metric_watch.h);
  // "" = none.
  std::string keep_best;
};

struct Experiment {
  std::string source_name;
  RunSettings run;
  DataSettings data;
  ScheduleSettings schedule;
  CheckpointSettings checkpoint;
  EmaSettings ema;
  EvalSettings eval;
  ModelSpec model;
  std::vector<PrecisionOverride> overrides;
  EscalationSettings escalate;
  DistributedSettings distributed;
  std::vector<std::filesystem::path> plugin_paths;

  std::string backend_type, policy_name, scaler_type, optimizer_type;
  sdk::Options backend_options, policy_options, scaler_options, optimizer_options,
      checkpoint_options, communicator_options;
  std::vector<ResolvedSection> core_sections;  // run, data, model, ... in resolved form
  // Keys given that the rest of the config leaves unread (a schedule's keys after a --set
  // optimizer.schedule=... swap, say), each naming its location: the trainer warns about them.
  std::vector<std::string> unused_keys;
};

struct Components {
  std::shared_ptr<sdk::DeviceBackend> backend;
  std::shared_ptr<sdk::PrecisionPolicy> policy;
  std::shared_ptr<sdk::LossScaler> scaler;
  std::shared_ptr<sdk::Optimizer> optimizer;
  std::shared_ptr<sdk::CheckpointFormat> checkpoint_format;
  // Every registered checkpoint format (the configured one with its options, the others with
  // defaults): weights-only loads (init_from, eval) pick theirs by file extension, so a
  // .safetensors file initialises a run that saves .mxt checkpoints.
  std::vector<std::shared_ptr<sdk::CheckpointFormat>> weight_formats;
  // [distributed]: this process's link to the other ranks (create_communicator); null: one process.
  std::shared_ptr<sdk::Communicator> communicator;
};

// Folders from [plugins] paths, resolved against the config's folder. Read before the registry
// is scanned, because the plugins' schemas are needed to validate the rest.
std::vector<std::filesystem::path> config_plugin_paths(const Config& config);

Experiment parse_experiment(const Config& config, const PluginRegistry& registry);
Components create_components(const Experiment& e, const PluginRegistry& registry);
// [distributed]: the communicator, bound to `backend`. Only `train` makes one (it joins the other
// ranks). A type given without an MPI launch is sdk::ConfigError at distributed.type, with the
// mpirun line that launches the config.
std::shared_ptr<sdk::Communicator> create_communicator(const Experiment& e,
                                                       const PluginRegistry& registry,
                                                       sdk::DeviceBackend& backend,
                                                       const std::string& config_path);
std::string resolved_toml(const Experiment& e);

}  // namespace mixtrain::core
