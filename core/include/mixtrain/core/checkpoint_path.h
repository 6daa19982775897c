// Which checkpoint file a path given by the user means (`eval --checkpoint`, `train --resume`,
// `export`).
//
// Contract: a file is itself (it must exist). A folder means its newest checkpoint: the
// "step-*" file with the format's extension whose name sorts last (step numbers are zero-padded).
// A run folder — one that holds a checkpoints/ folder — means the newest checkpoint in it.
// Otherwise sdk::CheckpointError names the path and says what to pass.
#pragma once

#include <filesystem>
#include <string>

namespace mixtrain::core {

// `extension` as the checkpoint format writes it, with the dot (".mxt").
std::filesystem::path resolve_checkpoint_path(const std::filesystem::path& path,
                                              const std::string& extension);

}  // namespace mixtrain::core
