// The check every command that writes a file of its own (`export`, `predict`) makes before it
// reads anything: a large checkpoint or a config's data is not loaded for an output that could
// not be written or would overwrite.
//
// Contract: sdk::UserError, naming the path and the fix, when `out` is the input itself, exists
// and `force` is false, is a folder, or lies in a folder that does not exist (or is not one).
// check_output_folder() is the same check for a folder of files (`export --layout hf`): refused
// when it is the input, is a file, exists with anything in it and `force` is false (with `force`
// the writer replaces its own files and leaves the others), or lies in a folder that does not
// exist. A missing folder is fine: the writer creates it.
#pragma once

#include <filesystem>

namespace mixtrain::cli {

void check_output_file(const std::filesystem::path& out, const std::filesystem::path& input,
                       bool force);
void check_output_folder(const std::filesystem::path& out, const std::filesystem::path& input,
                         bool force);

}  // namespace mixtrain::cli
