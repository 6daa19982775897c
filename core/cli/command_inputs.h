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

}  // namespace mixtrain::cli
