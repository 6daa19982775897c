#include "mixtrain/core/checkpoint/weights_read.h"

#include <exception>
#include <stdexcept>
#include <string_view>
#include <unordered_set>
#include <utility>

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

namespace {

// What `read` returns; an exception of a plugin's format (`plugin` not empty) that is no
// sdk::UserError becomes a PluginFault naming the file and the plugin (read_checkpoint_with).
template <class Read>
auto guarded(const std::filesystem::path& path, const std::string& plugin, Read read) {
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

const sdk::PartialReadFacet* partial_read_of(const sdk::CheckpointFormat& format) {
  const auto* partial = dynamic_cast<const sdk::PartialReadFacet*>(&format);
  return sdk::facet_serves<sdk::PartialReadFacet>(partial, 0) ? partial : nullptr;
}

}  // namespace

sdk::TrainingState read_checkpoint_with(const sdk::CheckpointFormat& format,
                                        const std::filesystem::path& path, bool weights_only,
                                        const std::string& plugin) {
  return guarded(path, plugin, [&] {
    return weights_only ? read_checkpoint_weights(format, path) : format.read(path);
  });
}

sdk::TrainingState read_checkpoint_deferring_slots(const sdk::CheckpointFormat& format,
                                                   const std::filesystem::path& path,
                                                   const std::string& plugin,
                                                   std::vector<std::string>& slots) {
  slots.clear();
  const auto* partial = partial_read_of(format);
  if (partial == nullptr) return read_checkpoint_with(format, path, false, plugin);
  return guarded(path, plugin, [&] {
    return partial->read_only(path, [&](std::string_view name) {
      if (!name.starts_with("optimizer/")) return true;
      slots.emplace_back(name);
      return false;
    });
  });
}

sdk::HostTensor read_checkpoint_tensor(const sdk::CheckpointFormat& format,
                                       const std::filesystem::path& path, const std::string& plugin,
                                       const std::string& name) {
  const auto* partial = partial_read_of(format);
  if (partial == nullptr)
    throw std::logic_error("read_checkpoint_tensor: the format offers no partial_read");
  auto st = guarded(path, plugin, [&] {
    return partial->read_only(path, [&](std::string_view n) { return n == name; });
  });
  if (st.tensors.size() != 1 || st.tensors.front().name != name)
    throw sdk::CheckpointError(path.string() + ": the file no longer holds tensor '" + name + "'",
                               "it changed while it was read: resume again");
  return std::move(st.tensors.front());
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
