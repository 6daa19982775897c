#include "mixtrain/core/checkpoint/weights_read.h"

#include <string_view>

#include "mixtrain/sdk/format_partial_read.h"

namespace mixtrain::core {

sdk::TrainingState read_checkpoint_weights(const sdk::CheckpointFormat& format,
                                           const std::filesystem::path& path) {
  const auto* partial = dynamic_cast<const sdk::PartialReadFacet*>(&format);
  if (!sdk::facet_serves<sdk::PartialReadFacet>(partial, 0)) return format.read(path);
  return partial->read_only(path,
                            [](std::string_view name) { return !name.starts_with("optimizer/"); });
}

}  // namespace mixtrain::core
