#include "mixtrain/core/checkpoint/weights_read.h"

#include <exception>
#include <string_view>
#include <unordered_set>

#include "mixtrain/core/plugins/plugin_fault.h"
#include "mixtrain/sdk/error.h"

#include "mixtrain/sdk/format_partial_read.h"

namespace mixtrain::core {

sdk::TrainingState read_checkpoint_weights(const sdk::CheckpointFormat& format,
                                           const std::filesystem::path& path) {
  const auto* partial = dynamic_cast<const sdk::PartialReadFacet*>(&format);
  if (!sdk::facet_serves<sdk::PartialReadFacet>(partial, 0)) return format.read(path);
  return partial->read_only(path,
                            [](std::string_view name) { return !name.starts_with("optimizer/"); });
}

sdk::TrainingState read_checkpoint_with(const sdk::CheckpointFormat& format,
                                        const std::filesystem::path& path, bool weights_only,
                                        const std::string& plugin) {
  const auto read = [&] {
    return weights_only ? read_checkpoint_weights(format, path) : format.read(path);
  };
  if (plugin.empty()) return read();
  try {
    return read();
  } catch (const sdk::UserError&) {
    throw;
  } catch (const PluginFault&) {
    throw;
  } catch (const std::exception& e) {
    throw PluginFault(path.string() + ": " + plugin + " failed reading it: " + e.what(),
                      "an error inside the checkpoint format, which threw no sdk::UserError: "
                      "report it to its authors; or the file is damaged: use an earlier "
                      "checkpoint, or read it with another format");
  }
}

void refuse_repeated_tensors(const sdk::TrainingState& state, const std::filesystem::path& path,
                             const std::string& format) {
  std::unordered_set<std::string_view> seen;
  for (const auto& t : state.tensors)
    if (!seen.insert(t.name).second)
      throw sdk::CheckpointError(
          path.string() + ": " + format + " read tensor '" + t.name +
              "' twice; a checkpoint holds each tensor once",
          "the format's read() is at fault (report it to its authors), or the file is damaged: "
          "use an earlier checkpoint, or read it with another format");
}

}  // namespace mixtrain::core
