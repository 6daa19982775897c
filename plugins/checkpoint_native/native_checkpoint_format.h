// NativeCheckpointFormat: the `native` checkpoint format (.mxt) — the full training state for an
// exact resume. File layout: native_file_layout.h and README.md.
//
// Contract
// - write() is atomic: it writes `.<name>.tmp.<pid>.<n>` in the target's folder, fsyncs it (option
//   `fsync`), renames it over the target and fsyncs the folder. On any failure the temp file is
//   removed, an existing target is left byte-identical, and a CheckpointError names the path, the
//   OS error and a hint. An invalid TrainingState (duplicate or empty names, rank > 4, byte count
//   not matching shape × dtype, non-UTF-8 strings) is rejected before anything touches the disk.
// - read() trusts nothing: every size, offset, type and checksum is checked before use, and any
//   defect raises CheckpointError naming the file, the damaged part and what to do. It never reads
//   out of bounds, and no single allocation exceeds the file's size.
// - read_only() (sdk/format_partial_read.h) is read() of the tensors its caller wants: the
//   preamble, header and tensor table are checked whole, and only the wanted tensors' data is
//   read and checksummed.
// - write_streamed() (sdk/format_streamed_write.h) writes the file write() writes, byte for byte,
//   reading each tensor twice through the host's reader (the header, which comes first, holds
//   every tensor's checksum): host memory for one tensor, not the whole state. The state is
//   checked as write() checks it before the first read.
// - The object is immutable after construction; write() and the reads may run concurrently from
//   several threads (on different target paths for write()).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/format_partial_read.h"
#include "mixtrain/sdk/format_streamed_write.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::checkpoint_native {

class NativeCheckpointFormat final : public sdk::CheckpointFormat,
                                     public sdk::PartialReadFacet,
                                     public sdk::StreamedWriteFacet {
 public:
  static sdk::OptionSchema option_schema();

  NativeCheckpointFormat(const sdk::Options& options, const sdk::PluginContext& context);

  std::string file_extension() const override { return ".mxt"; }
  void write(const std::filesystem::path& path, const sdk::TrainingState& state) const override;
  sdk::TrainingState read(const std::filesystem::path& path) const override;
  sdk::TrainingState read_only(const std::filesystem::path& path,
                               const std::function<bool(std::string_view)>& wanted) const override;
  void write_streamed(const std::filesystem::path& path,
                      const std::vector<sdk::StreamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const sdk::StreamedTensorReader& read) const override;

 private:
  bool fsync_;
  sdk::Logger logger_;
};

}  // namespace mixtrain::checkpoint_native
