// Which checkpoint file a path given by the user means (`eval --checkpoint`, `train --resume`,
// `export`), and the step-numbered checkpoints of a folder.
//
// Contract: a file is itself (it must exist). A folder means its newest checkpoint: the
// "step-N" file with the format's extension whose N is largest, compared as numbers (names stop
// sorting by step once N outgrows the zero padding). A run folder — one that holds a
// checkpoints/ folder — means the newest checkpoint in it. Otherwise sdk::CheckpointError names
// the path and says what to pass (`pass`: the option that gives the command a file, "--resume" or
// "--checkpoint", or "" for a command that takes it as an argument); for a run folder without a
// checkpoint it also says why, from
// what the run left (the last step metrics.jsonl logged, whether summary.json exists). Files whose
// name is not "step-" + decimal digits + extension (a negative step, a temp file, "step-final.mxt",
// checkpoint.keep_best's "best.mxt") are not step checkpoints of a run: folders never resolve to
// them and keep-pruning never removes them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain::core {

// `extension` as the checkpoint format writes it, with the dot (".mxt").
std::filesystem::path resolve_checkpoint_path(const std::filesystem::path& path,
                                              const std::string& extension,
                                              const std::string& pass);

// N of a file named "step-N<extension>" (N: decimal digits that fit in int64), else nullopt.
std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& file,
                                            const std::string& extension);

// The run folder a user's checkpoint path belongs to: a folder is itself, a file its folder, and
// a checkpoints/ folder (or a file in one) its parent; "." for a bare file name.
std::filesystem::path run_folder_of(const std::filesystem::path& path);

// The step-N checkpoints directly in `folder`, oldest (smallest N) first; none when the folder
// cannot be read.
std::vector<std::filesystem::path> step_checkpoints(const std::filesystem::path& folder,
                                                    const std::string& extension);

}  // namespace mixtrain::core
