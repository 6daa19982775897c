#include "mixtrain/core/checkpoint_path.h"

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

fs::path resolve_checkpoint_path(const fs::path& path, const std::string& extension) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path folder =
        fs::is_directory(path / "checkpoints", ec) ? path / "checkpoints" : path;
    fs::path best;
    for (const auto& f : fs::directory_iterator(folder, ec))
      if (f.is_regular_file() && f.path().extension() == extension &&
          f.path().filename().string().rfind("step-", 0) == 0 &&
          (best.empty() || f.path().filename() > best.filename()))
        best = f.path();
    if (best.empty())
      throw sdk::CheckpointError("no checkpoint (step-*" + extension + ") in " + folder.string(),
                                 "pass a checkpoint file, a run folder or its checkpoints/ folder");
    return best;
  }
  if (!fs::exists(path, ec))
    throw sdk::CheckpointError("checkpoint " + path.string() + " does not exist",
                               "check the path; runs keep theirs in <run-dir>/checkpoints/");
  return path;
}

}  // namespace mixtrain::core
