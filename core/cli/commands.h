// The subcommands of the `mixtrain` executable. Each returns the process exit code and lets
// sdk::UserError (exit 2) and other exceptions (exit 1) reach main(), which prints them once.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mixtrain::cli {

struct ConfigArgs {
  std::string config;  // empty: the embedded quickstart
  std::vector<std::string> sets;
};

// Exit code of a run that diverged (every step skipped, a non-finite final loss, or stopped by
// run.on_nonfinite = "stop"); an interrupted run exits with core::kInterruptedExitCode (130).
inline constexpr int kExitDiverged = 3;
int run_train(const ConfigArgs& cfg, const std::string& run_dir,
              const std::optional<std::string>& resume);
int run_check(const ConfigArgs& cfg);
// Lists components, failed libraries and the search path (a missing entry is a warning); with
// a non-empty `describe` (NAME or KIND/NAME), prints that component's option schema instead.
int run_plugins(const std::string& describe);
int run_eval(const ConfigArgs& cfg, const std::string& checkpoint);
// Parity table of runs against the first; writes compare.{json,md,svg} into out_dir (empty: the
// first run's folder).
int run_compare(const std::vector<std::string>& run_dirs, const std::string& out_dir);

struct ExportArgs {
  std::string checkpoint;  // a file, or a run / checkpoints/ folder: its newest checkpoint
  std::string format;      // the checkpoint_format to write, e.g. "safetensors"
  std::string from;        // the format to read; empty: chosen by the checkpoint's extension
  std::string dtype;       // the writer's `dtype` option when given
  std::string out;         // empty: the checkpoint's name with the writer's extension, in the
                           // run folder (never inside checkpoints/)
  bool force = false;      // overwrite an existing output file
};
// Converts a checkpoint to another format (weights for other tools: safetensors). Never
// overwrites an existing file without `force`.
int run_export(const ExportArgs& args);

}  // namespace mixtrain::cli
