// The run folder: where a training run writes config.toml (the resolved config), metrics.jsonl
// (and metrics.csv, TensorBoard event files: run.metrics), checkpoints/step-N.<ext> and
// summary.json.
//
// Contract
// - prepare_run_folder() picks the folder and readies it, in this order of choice: --run-dir; for
//   a resume, the folder of the run resumed (…/<run>/checkpoints/step-N.<ext> → …/<run>, or "."
//   for checkpoints/step-N.<ext> given from inside it; a checkpoint in a folder not named
//   "checkpoints" belongs to no run folder, so the choice goes on); run.dir; runs/<run.name>. A
//   folder that already holds a run (metrics.jsonl, summary.json, or any file in checkpoints/) is
//   refused when the user named it, and the default gets a "-2", "-3", … suffix instead: an earlier
//   run is never overwritten. The one exception is continuing: resuming a checkpoint inside its own
//   run folder.
// - One run a folder: the run holds an flock on <dir>/.mixtrain.lock (which names its pid) for
//   as long as the PreparedRunFolder lives. A folder another live run holds is refused when named
//   (or continued) and skipped by the default's suffixes, so runs started at once never share
//   one. The file stays after the run (removing it would race the next run's lock); the kernel
//   drops the lock with the process however it ends.
// - A config.toml is replaced only if a run wrote it (its first line is resolved_toml()'s
//   header): a folder holding the user's own config is refused, named or continued, before
//   anything is created in it, and skipped by the default's suffixes.
// - Continuing from step N abandons what the folder holds after N, without deleting it: metrics
//   records with a step above N move to metrics.discarded-after-step-N.jsonl, rows of
//   metrics.csv likewise to metrics.discarded-after-step-N.csv, checkpoints above N to
//   checkpoints.discarded-after-step-N/, TensorBoard event files holding a step above N to
//   tensorboard.discarded-after-step-N/ (each replaced by its events up to N:
//   runs/tensorboard_writer.h), and, when any of those moved, summary.json and profile.json (they
//   describe the abandoned continuation; a profile whose last_step is N or below stays) to
//   summary.discarded-after-step-N.json and profile.discarded-after-step-N.json, and the
//   config.toml it trained with, when the resumed run's holds other values (comments aside), is
//   kept as config.discarded-after-step-N.toml (the new one replaces it). A second
//   continuation from the same step gets the suffix ".2" (then ".3", …) on those names, so what the
//   first one left is never overwritten. Left in place, keep-pruning would count those checkpoints
//   as the newest and a later --resume would pick them up. A record whose step is not a JSON
//   integer (an edited file) stays. What moved is reported (moved_aside) so the run can say it in
//   one line.
// - It creates checkpoints/ and writes config.toml atomically. Errors are sdk::UserError naming
//   the folder or file, with a hint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "mixtrain/sdk/support/unique_fd.h"

namespace mixtrain::core {

struct RunFolderRequest {
  std::filesystem::path run_dir;       // --run-dir; empty when not given
  std::filesystem::path resumed_from;  // the checkpoint file resumed; empty for a fresh run
  std::int64_t resumed_step = 0;       // its step
  std::string config_dir;              // run.dir (absolute when set); empty when not set
  std::string run_name;                // run.name
  std::string checkpoint_extension;    // ".mxt"
};

// Writes one of the run folder's text files so that readers see the old file or the whole new
// one, never a torn one (a second Ctrl-C lands in a run's final writes). `what` names it in
// messages; errors are sdk::CheckpointError naming the file.
void write_run_file(const std::filesystem::path& file, const std::string& text,
                    const std::string& what);

// The steps a profile.json of `train --profile` names (first_step, last_step), or nullopt when the
// file is missing, unreadable or names none (written before it named them).
struct ProfileSteps {
  std::int64_t first = 0, last = 0;
};
std::optional<ProfileSteps> profile_steps(const std::filesystem::path& file);

// The flock that makes a folder one run's (see the contract). Movable; released when destroyed.
class RunFolderLock {
 public:
  // Takes the lock on `file` (created if missing), or nullopt when another process holds it. On
  // a file system without flock it holds nothing and says yes. sdk::UserError if `file` cannot
  // be opened.
  static std::optional<RunFolderLock> try_take(const std::filesystem::path& file);

 private:
  explicit RunFolderLock(std::unique_ptr<sdk::UniqueFd> fd) : fd_(std::move(fd)) {}
  std::unique_ptr<sdk::UniqueFd> fd_;
};

struct PreparedRunFolder {
  std::filesystem::path dir;
  // Empty, or one sentence: what continuing moved aside and where ("2 checkpoints and 4 metrics
  // records from after step 20 moved to checkpoints.discarded-after-step-20/ and
  // metrics.discarded-after-step-20.*").
  std::string moved_aside;
  RunFolderLock lock;  // keep it for the whole run
};

// The run folder a resume continues in place: the resumed checkpoint's run (…/<run>/checkpoints/
// step-N.<ext> → …/<run>) when it holds a run (as above) and `run_dir` (--run-dir) is empty
// or that same folder; nullopt for a fresh run or a resume into another folder. What
// prepare_run_folder() continues, and what a finished run's resume leaves untouched.
std::optional<std::filesystem::path> continued_run_folder(
    const std::filesystem::path& run_dir, const std::filesystem::path& resumed_from);

// Whether `dir` holds a training run: a trace of one (metrics.jsonl, summary.json, a file in
// checkpoints/) or a config.toml a run wrote (its first line is the resolved config's header; a
// run writes it before its first step). What export, predict and calibrate never write a record
// of, whichever run they read.
bool holds_training_run(const std::filesystem::path& dir);

// The folder, ready: checkpoints/ exists and config.toml holds `resolved_config`.
PreparedRunFolder prepare_run_folder(const RunFolderRequest& request,
                                     const std::string& resolved_config);

}  // namespace mixtrain::core
