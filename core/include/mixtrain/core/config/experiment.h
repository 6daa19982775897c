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

#include "mixtrain/core/checkpoint/format_set.h"
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

// The members' defaults are the schemas' (host_schemas.h), read from there: a default is written
// once, and test_experiment.cpp checks that a config that sets nothing leaves every member there.
struct RunSettings {
  std::string name = schema_default_string(run_schema(), "name");
  std::uint64_t seed = static_cast<std::uint64_t>(schema_default_int(run_schema(), "seed"));
  std::int64_t steps = schema_default_int(run_schema(), "steps");
  std::int64_t log_every = schema_default_int(run_schema(), "log_every");
  std::int64_t eval_every = schema_default_int(run_schema(), "eval_every");  // 0: at the end only
  NonfiniteAction on_nonfinite =
      schema_default_choice(run_schema(), "on_nonfinite", kNonfiniteActions);
  // Steps between gradient-underflow reports; 0 = never.
  std::int64_t underflow_every = schema_default_int(run_schema(), "underflow_every");
  // Default run directory when --run-dir is not given.
  std::string dir = schema_default_string(run_schema(), "dir");
  // Micro-batches (of data.batch_size) per optimizer step.
  std::int64_t accumulate = schema_default_int(run_schema(), "accumulate");
  // Replay a recorded static step (train/step_graph.h). Unset: where the backend records step
  // graphs and the step is static, without a word where it cannot.
  std::optional<bool> step_graphs;
  // Queue the optimizer's update before reading the gradient check (train/step.cpp).
  bool gated_update = schema_default_bool(run_schema(), "gated_update");
  // Resume with another run.steps: re-plan the lr schedule.
  bool stretch_schedule = schema_default_bool(run_schema(), "stretch_schedule");
  // Where metric records go; metrics.jsonl is written always.
  std::vector<MetricsSinkKind> metrics = {
      schema_default_choice(run_schema(), "metrics", kMetricsSinks)};
  // Early stopping (train/metric_watch.h): stop after this many evaluations in a row without an
  // improvement of early_stopping_metric by more than early_stopping_min_delta; 0 = off.
  std::int64_t early_stopping_patience =
      schema_default_int(run_schema(), "early_stopping_patience");
  std::string early_stopping_metric = schema_default_string(run_schema(), "early_stopping_metric");
  double early_stopping_min_delta = schema_default_number(run_schema(), "early_stopping_min_delta");
};

struct EmaSettings {
  double decay = schema_default_number(ema_schema(), "decay");  // 0: no EMA
  bool enabled() const { return decay > 0.0; }
};

// [precision.escalate] (docs/precision-autopilot.md, "Escalation"): present means on.
struct EscalationSettings {
  bool enabled = false;
  // Blames within the window that promote a node.
  std::int64_t after = schema_default_int(escalate_schema(), "after");
  // Steps a blame is remembered.
  std::int64_t window = schema_default_int(escalate_schema(), "window");
  // Clean applied steps that undo the latest promotion; 0 off.
  std::int64_t deescalate_after = schema_default_int(escalate_schema(), "deescalate_after");
};

// [distributed] (docs/architecture.md, "Data parallel"): present, or an MPI launch detected from
// the environment, means one process per rank; `type` names the communicator.
struct DistributedSettings {
  std::string type;  // "": one process
  bool shard_optimizer = schema_default_bool(distributed_schema(), "shard_optimizer");
  double bucket_mb = schema_default_number(distributed_schema(), "bucket_mb");
  bool overlap = schema_default_bool(distributed_schema(), "overlap");
  BatchNormStats batch_norm =
      schema_default_choice(distributed_schema(), "batch_norm", kBatchNormStats);
  bool from_launch = false;   // no [distributed] table: chosen because mpirun started the process
  sdk::SourceLocation where;  // distributed.type (an error about the launch points there)
  bool enabled() const { return !type.empty(); }
};

struct EvalSettings {
  EvalWeights weights = schema_default_choice(eval_schema(), "weights", kEvalWeights);
  // > 1: also top-k accuracy (train/top_k.h); 0: off.
  std::int64_t top_k = schema_default_int(eval_schema(), "top_k");
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
  sdk::SourceLocation where;               // the table
  sdk::SourceLocation crop_padding_where;  // its key (a wide crop's warning points there)
};

struct DataSettings {
  DataSource source = DataSource::synthetic;
  std::int64_t batch_size = schema_default_int(data_common_schema(), "batch_size");
  // 0 in the config means batch_size, which the reader writes in.
  std::int64_t eval_batch_size = schema_default_int(data_common_schema(), "eval_batch_size");
  bool shuffle = schema_default_bool(data_common_schema(), "shuffle");
  // Prepare the next training batch on a loader thread while a step computes.
  bool prefetch = schema_default_bool(data_common_schema(), "prefetch");
  // Batches in the backend's page-locked memory where it offers some (train/host_batch.h).
  bool pin_memory = schema_default_bool(data_common_schema(), "pin_memory");
  // Image pixels: "uint8" kept as bytes (synthetic images rounded to bytes), "float32" decoded
  // when loaded, "auto" bytes where the source stores bytes. `pixels_where` is where a source
  // that cannot give bytes points.
  std::string pixels = schema_default_string(data_common_schema(), "pixels");
  sdk::SourceLocation pixels_where;
  bool keep_bytes() const { return pixels != "float32"; }
  // tokens / text: the tail, unless eval_paths are given.
  double eval_fraction = schema_default_number(data_common_schema(), "eval_fraction");
  // 0: infer from the labels (tables only).
  std::int32_t classes =
      static_cast<std::int32_t>(schema_default_int(data_common_schema(), "classes"));
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
  // image_folder: a folder of class folders to train on and, optionally, one held out (empty:
  // eval_fraction of the training images); crops of crop_size² pixels, cut as `image_spec` says
  // (its resize 0 in the config is written in as round(crop_size · 8 / 7)).
  std::filesystem::path image_train_dir, image_eval_dir;
  std::int64_t crop_size = 0;
  ImageFileSpec image_spec;
  bool check_image_files = true;
  NormalizeSettings normalize;  // image tables only
  AugmentSettings augment;      // image tables only
  // Every file or folder a path option names, with the dotted key and the line it came from: one
  // that does not exist is refused there when the data are loaded, not as a bare path.
  struct NamedFile {
    std::filesystem::path path;
    std::string key;
    sdk::SourceLocation where;
  };
  std::vector<NamedFile> named_files;
};

// [optimizer]'s host keys: the learning-rate schedule (train/lr_schedule.h) and clipping. The
// reader checks each schedule's keys together (sorted milestones, onecycle's phases, min_lr at
// most the optimizer's lr); keys given that the chosen schedule does not read are listed in
// Experiment::unused_keys.
struct ScheduleSettings {
  LrScheduleKind schedule = schema_default_choice(schedule_schema(), "schedule", kLrScheduleKinds);
  std::int64_t warmup_steps = schema_default_int(schedule_schema(), "warmup_steps");
  double min_lr = schema_default_number(schedule_schema(), "min_lr");
  std::int64_t step_size = schema_default_int(schedule_schema(), "step_size");
  double gamma = schema_default_number(schedule_schema(), "gamma");
  std::vector<std::int64_t> milestones;
  double pct_start = schema_default_number(schedule_schema(), "pct_start");
  double div_factor = schema_default_number(schedule_schema(), "div_factor");
  double final_div_factor = schema_default_number(schedule_schema(), "final_div_factor");
  // 0: no clipping.
  double clip_grad_norm = schema_default_number(schedule_schema(), "clip_grad_norm");
};

struct CheckpointSettings {
  std::string format;
  // 0: only the final checkpoint.
  std::int64_t every = schema_default_int(checkpoint_core_schema(), "every");
  // The checkpoint at the end of the run (and at an interrupt); false: none.
  bool write_final = schema_default_bool(checkpoint_core_schema(), "final");
  std::int64_t keep = schema_default_int(checkpoint_core_schema(), "keep");
  std::string init_from = schema_default_string(checkpoint_core_schema(), "init_from");
  // Where init_from was given: a file that does not exist is refused there when it is loaded.
  sdk::SourceLocation init_from_where;
  // How init_from stores its weights.
  WeightLayout init_layout =
      parse_weight_layout(schema_default_string(checkpoint_core_schema(), "init_layout"));
  // The evaluation number whose best value keeps checkpoints/best<ext> (train/metric_watch.h);
  // "" = none.
  std::string keep_best = schema_default_string(checkpoint_core_schema(), "keep_best");
};

// [model] from_pretrained (README, "Language models"): the Hugging Face GPT-2 folder whose
// config.json gave the gpt preset's sizes; its model.safetensors is checkpoint.init_from, read in
// the gpt2 layout. The resolved config records those instead (sizes, init_from, init_layout), so
// a run's config.toml no longer reads the folder.
struct PretrainedSource {
  std::filesystem::path folder, weights;  // absolute; empty: no from_pretrained
  sdk::SourceLocation where;              // of the from_pretrained key
  bool enabled() const { return !folder.empty(); }
};

// [model.lora] from_peft (README, "LoRA"): the PEFT adapter folder whose lora_A and
// lora_B tensors the run's adapters start from (after the base weights: from_pretrained or
// checkpoint.init_from). Its adapter_config.json gave the r, alpha, dropout and targets the table
// leaves out; the resolved config states them, so a run's config.toml reads the folder only to
// start a new run (a resume and eval, predict and sample take the adapters from the checkpoint).
struct PeftAdapterSource {
  std::filesystem::path folder;  // absolute; empty: no from_peft
  sdk::SourceLocation where;     // of the from_peft key
  bool gpt_modules = false;  // the nodes are GPT2LMHeadModel's modules (peft_adapter.h)
  // Where r, alpha and targets were stated (the folder's config file where it gave them), for
  // the errors of a disagreement with the folder.
  sdk::SourceLocation r_where, alpha_where, targets_where;
  bool enabled() const { return !folder.empty(); }
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
  PretrainedSource from_pretrained;
  PeftAdapterSource from_peft;
  std::vector<PrecisionOverride> overrides;
  EscalationSettings escalate;
  DistributedSettings distributed;
  std::vector<std::filesystem::path> plugin_paths;

  std::string backend_type, policy_name, scaler_type, optimizer_type;
  // Where precision.policy, scaler.type and optimizer.type were given: a resume may change one
  // of them only by a --set (train/checkpoint_load.cpp), a deliberate choice, never by an edited
  // or merged file.
  sdk::SourceLocation policy_where, scaler_where, optimizer_where;
  // Where backend.type was given (line 0: not given, the default): a backend that cannot start
  // (no usable GPU) is refused naming it.
  sdk::SourceLocation backend_where;
  sdk::Options backend_options, policy_options, scaler_options, optimizer_options,
      checkpoint_options, communicator_options;
  std::vector<ResolvedSection> core_sections;  // run, data, model, ... in resolved form
  // Keys given that the rest of the config leaves unread (a schedule's keys after a --set
  // optimizer.schedule=... swap, say), each naming its location: the trainer warns about them.
  std::vector<std::string> unused_keys;
  // Values that are valid but likely not what was meant (a multistep milestone after run.steps),
  // each a sentence naming its location and the fix: the trainer warns about them.
  std::vector<std::string> config_warnings;
};

struct Components {
  std::shared_ptr<sdk::DeviceBackend> backend;
  std::shared_ptr<sdk::PrecisionPolicy> policy;
  std::shared_ptr<sdk::LossScaler> scaler;
  std::shared_ptr<sdk::Optimizer> optimizer;
  std::shared_ptr<sdk::CheckpointFormat> checkpoint_format;
  // Every registered checkpoint format (the configured one first, with its options, the others
  // with defaults), named: weights-only loads (init_from, eval) pick theirs by file extension, so
  // a .safetensors file initialises a run that saves .mxt checkpoints. Two never share an
  // extension (formats_by_extension(), checkpoint/format_set.h).
  std::vector<NamedFormat> weight_formats;
  // [distributed]: this process's link to the other ranks (create_communicator); null: one process.
  std::shared_ptr<sdk::Communicator> communicator;
  // Which plugin (name, version, library file) each configured component came from, as TOML
  // lines under a [loaded] header: the data-parallel start check compares them with the config,
  // since a rank with another build of a plugin would compute other numbers under one config.
  std::string origins;
};

// Folders from [plugins] paths, resolved against the config's folder. Read before the registry
// is scanned, because the plugins' schemas are needed to validate the rest.
std::vector<std::filesystem::path> config_plugin_paths(const Config& config);

// What the command that parses a config does with it. `model_only`: eval, predict, sample and
// export run the model and never scale a loss or step the optimizer, so a table of [scaler] or
// [optimizer] named after no loaded component (the run trained with a plugin this command does
// not load, [scaler.chaos]) is a warning in config_warnings, not an error. The selected scaler
// and optimizer must exist (the hint offers the built-in default, as good here), and every other
// section reads as for `training` (train, check), which refuses such a table (likely a typo).
enum class ExperimentUse { training, model_only };

Experiment parse_experiment(const Config& config, const PluginRegistry& registry,
                            ExperimentUse use = ExperimentUse::training);
Components create_components(const Experiment& e, const PluginRegistry& registry);
// For `train --resume RUN` with the run's own config.toml: a [distributed] table the run was
// trained under gives way to one process when no MPI launcher started this one (a checkpoint
// resumes on any number of ranks); the table stays in the resolved config that the run's folder
// records, for a later launch on several ranks. Returns the line that says so, or "" when nothing
// changed.
std::string follow_the_launch_on_resume(Experiment& e);
// Empty when this process can train `e` as it is. For a [distributed] config in a process no MPI
// launcher started: why it cannot, and the mpirun line that can (`check` prints it; `train` throws
// it from create_communicator). `train_command` is the command mpirun is to run ("mixtrain train
// CONFIG --set ...", the user's own arguments, shell-quoted); empty: "mixtrain train CONFIG".
std::string launch_requirement(const Experiment& e, const std::string& train_command);
// Empty unless an MPI launcher started this process as one of several ranks: then why `mixtrain
// <command>` (any command but train) cannot run so: a command that `writes` files would write
// the same outputs on every rank (racing past an overwrite check); any other would repeat its
// work and print everything once per rank.
std::string one_process_requirement(const std::string& command, bool writes);
// [distributed]: the communicator, bound to `backend`. Only `train` makes one (it joins the other
// ranks). A type given without an MPI launch is sdk::ConfigError at distributed.type, with the
// mpirun line that launches `train_command` (launch_requirement()).
std::shared_ptr<sdk::Communicator> create_communicator(const Experiment& e,
                                                       const PluginRegistry& registry,
                                                       sdk::DeviceBackend& backend,
                                                       const std::string& train_command);
std::string resolved_toml(const Experiment& e);

}  // namespace mixtrain::core
