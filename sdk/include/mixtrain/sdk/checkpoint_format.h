// CheckpointFormat: writes and reads a TrainingState.
//
// Contract
// - write() is atomic: the file at `path` is either the old one or the complete new one, never a
//   torn mix (write a temporary file in the same folder, fsync, rename, fsync the folder). It
//   never modifies any other file.
// - read() validates everything it reads (magic, version, sizes, checksums) and raises
//   CheckpointError naming the file and the damaged part; it never reads out of bounds or
//   allocates more than the file can hold.
// - Tensors are host copies; metadata values are UTF-8 strings (the host stores JSON there).
// - The host marks its training states with the metadata entry "mixtrain.state_version", and
//   --resume reads only files that carry it. A format that keeps part of the state (weights only,
//   or narrowed dtypes) adds the entry "mixtrain.weights_only" to such a state's metadata, so that
//   resuming its file is refused at once ("weights only; use it as checkpoint.init_from") rather
//   than half restored; the version entry stays (exports read it).
#pragma once

#include "mixtrain/sdk/export.h"

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/component.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

struct TrainingState {
  std::vector<HostTensor> tensors;
  std::map<std::string, std::string> metadata;

  const HostTensor* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

class MIXTRAIN_SDK_API CheckpointFormat : public Component {
 public:
  ~CheckpointFormat() override;
  virtual std::string file_extension() const = 0;  // ".mxt"
  virtual void write(const std::filesystem::path& path, const TrainingState& state) const = 0;
  virtual TrainingState read(const std::filesystem::path& path) const = 0;
};

}  // namespace mixtrain::sdk
