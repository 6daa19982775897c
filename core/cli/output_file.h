// The check every command that writes a file of its own (`export`, `predict`) makes before it
// reads anything: a large checkpoint or a config's data is not loaded for an output that could
// not be written or would overwrite.
//
// Contract: sdk::UserError, naming the path and the fix, when `out` is the input itself, exists
// and `force` is false, is a folder, or lies in a folder that does not exist (or is not one).
#pragma once

#include <filesystem>

namespace mixtrain::cli {

void check_output_file(const std::filesystem::path& out, const std::filesystem::path& input,
                       bool force);

}  // namespace mixtrain::cli
