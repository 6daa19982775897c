// StreamedWriteFacet: a checkpoint format that writes a training state whose tensors the host
// hands over one at a time, as the format asks for them, instead of a TrainingState holding every
// tensor on the host at once. A save then needs host memory for about one tensor beyond what
// training holds, not a second copy of the whole state: a GPT-2 small's AdamW state is 1.5 GB,
// which a whole-state save added to the CPU process's peak (docs/architecture.md, the component
// facet table).
//
// Contract
// - A format offers it by deriving from it beside CheckpointFormat; the host finds it with
//   dynamic_cast on the format (an older format never derives from it: the host then builds the
//   whole TrainingState and calls write(), so adding it changed no core interface). Versioned as
//   a facet (facet.h: name, major.minor, the same step rules, its own record in the ABI guard).
// - write_streamed(path, tensors, metadata, read) writes the file write(path, state) writes for
//   the state of these tensors (in this order, with these names, dtypes and shapes), whose bytes
//   read gives, and this metadata: the same bytes, atomic as write() is. Everything write() refuses
//   about the tensors' names, shapes and dtypes is refused before read is first called.
// - read(i, buffer) gives tensor i's bytes, shape × dtype size long: either in `buffer` (which
//   the format passes, that long, and read fills) or bytes the host holds; the span returned is
//   valid until the next call of read. A format may ask for a tensor more than once (a checksum
//   pass, then the write) and in any order; each call gives the same bytes. read is called on the
//   caller's thread only.
// - An exception read throws ends the write: the format lets it propagate unchanged and leaves
//   no file (an existing target stays as it was). The host uses this to stop a save whose weights
//   are not finite.
// - Memory: the format holds at most one tensor's bytes at a time (plus buffers of a fixed
//   size), so a save's extra host memory is the largest tensor.
// - Errors: those of write() (CheckpointError naming the file and the cause), and read's own.
// - Ownership: the facet is the format itself; it lives as long as the format.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

// A tensor of a streamed state: what the file's table records before its bytes are read.
struct StreamedTensor {
  std::string name;
  DType dtype = DType::fp32;
  std::vector<std::int64_t> shape;
};

// read(i, buffer): tensor i's bytes, in buffer or held by the host (above).
using StreamedTensorReader =
    std::function<std::span<const std::byte>(std::size_t index, std::span<std::byte> buffer)>;

class MIXTRAIN_SDK_API StreamedWriteFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "streamed_write";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual void write_streamed(const std::filesystem::path& path,
                              const std::vector<StreamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              const StreamedTensorReader& read) const = 0;

 protected:
  ~StreamedWriteFacet() override;  // not owned through the facet: the format is
};

}  // namespace mixtrain::sdk
