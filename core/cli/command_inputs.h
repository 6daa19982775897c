// The files a command reads, each named by the argument that gave it, and the one check every
// command that writes a file makes against them: an output is never one of its own inputs, with
// --force or without (a typo must not turn the run's newest checkpoint into a .npy).
//
// Contract
// - is_input() is true when `out` exists and is the same file as `input` (same inode, symlinks
//   resolved, std::filesystem::equivalent); a path that does not exist yet is never an input,
//   and neither is an empty one.
// - refuse_input_as_output() throws sdk::UserError naming the output flag, the input it
//   collides with (its argument and path) and the fix, for the first input `out` is.
// - refuse_run_record_as_output() throws sdk::UserError when an input belongs to a training run's
//   folder (core::run_folder_of: a checkpoint in its checkpoints/, the folder itself, its
//   config.toml; a run folder is one that holds a checkpoints/ folder) and `out` is one of that
//   run's own records, existing or not: its config.toml, summary.json, profile.json, metrics
//   files (metrics.jsonl, metrics.csv, TensorBoard event files), .mixtrain.lock, what a
//   continuation moved aside (*.discarded-after-step-*), or checkpoints/ and anything under it.
//   The same holds for the records of any other run: `out` is refused when a folder above it
//   holds a training run (core::holds_training_run: metrics.jsonl, summary.json, a file in
//   checkpoints/, or a config.toml a run wrote) and `out` is one of that run's records, though
//   the command reads nothing of it. The message names the run, the record and the fix
//   (`example_name` beside the run); other files in a run folder (an export beside the run) are
//   fine.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"

namespace mixtrain::cli {

struct CommandInput {
  std::string argument;  // how the user gave it: "--checkpoint", "--merge", "CONFIG"
  std::filesystem::path path;
};
using CommandInputs = std::vector<CommandInput>;

// The config file and its --merge files.
CommandInputs config_inputs(const ConfigArgs& cfg);

bool is_input(const std::filesystem::path& out, const std::filesystem::path& input);
void refuse_input_as_output(const std::string& out_flag, const std::filesystem::path& out,
                            const CommandInputs& inputs);
void refuse_run_record_as_output(const std::string& out_flag, const std::filesystem::path& out,
                                 const CommandInputs& inputs, const std::string& example_name);

}  // namespace mixtrain::cli
