// PartialReadFacet: a checkpoint format that reads a file's metadata and only the tensors its
// caller wants. A weights-only load of a full training state (eval, predict, sample,
// checkpoint.init_from) then leaves the optimizer's slots on disk: two thirds of an AdamW run's
// file, and of the host memory its read takes (docs/architecture.md, the component facet table).
//
// Contract
// - A format offers it by deriving from it beside CheckpointFormat; the host finds it with
//   dynamic_cast on the format (an older format never derives from it: the host then calls
//   read(), so adding it changed no core interface). Versioned as a facet (facet.h: name,
//   major.minor, the same step rules, its own record in the ABI guard).
// - read_only(path, wanted) is read(path) without the tensors for which wanted(name) is false:
//   the same metadata, the wanted tensors in the file's order, each validated as read() validates
//   it (its checksum included); the file's structure (preamble, header, the whole tensor table)
//   is checked as read() checks it. A skipped tensor's bytes are neither read nor checked.
// - `wanted` is called once per tensor of the file, on the caller's thread, and must not throw.
// - Errors: those of read() (CheckpointError naming the file and the damaged part).
// - Ownership: the facet is the format itself; it lives as long as the format.
#pragma once

#include "mixtrain/sdk/export.h"

#include <filesystem>
#include <functional>
#include <string_view>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

class MIXTRAIN_SDK_API PartialReadFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "partial_read";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual TrainingState read_only(const std::filesystem::path& path,
                                  const std::function<bool(std::string_view)>& wanted) const = 0;

 protected:
  ~PartialReadFacet() override;  // not owned through the facet: the format is
};

}  // namespace mixtrain::sdk
