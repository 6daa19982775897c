// The check every command that writes a file of its own (`export`, `predict`, `calibrate`) makes
// before it reads anything: a large checkpoint or a config's data is not loaded for an output that
// could not be written or would overwrite.
//
// Contract: sdk::UserError, naming the path, the `flag` that gave it and the fix, when `out` is
// one of the command's inputs or a record of a run folder (the one an input belongs to, or any
// other: its config.toml, checkpoints/, ...: command_inputs.h; `force` never overrides either),
// exists and
// `force` is false, is a folder (the hint suggests `example_name` in it), is a symbolic link or
// not a regular file (a device, a FIFO, a socket: `force` never replaces one), or lies in a
// folder that does not exist, is not one, or does not take new files (permissions; the writers
// rename a new file into place). check_output_folder() is the same check for a folder of files
// (`export --layout hf` and `peft`): refused when it or one of the `files` written in it is an
// input or a run's record, a link or not a regular file, when it is a file, exists with anything in
// it and `force` is false (with `force` the writer replaces its own files and leaves the others),
// or lies in, or is, a folder that does not exist or takes no new files. A missing folder is fine:
// the writer creates it. remove_abandoned_temp_files(): the temporary files that killed writers
// left in the output's folder (sdk::remove_stale_temp_files: only those no live writer holds a lock
// on), removed before a new output is written there, and returned for the log.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "command_inputs.h"

namespace mixtrain::cli {

void check_output_file(const std::filesystem::path& out, const CommandInputs& inputs, bool force,
                       const std::string& flag, const std::string& example_name);
void check_output_folder(const std::filesystem::path& out, const std::vector<std::string>& files,
                         const CommandInputs& inputs, bool force);
std::vector<std::filesystem::path> remove_abandoned_temp_files(const std::filesystem::path& out);

}  // namespace mixtrain::cli
