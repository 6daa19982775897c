#include "mixtrain/core/checkpoint/format_set.h"

#include <system_error>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

namespace {

bool from_builtin_folder(const fs::path& library) {
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(library.parent_path(), ec);
  for (const auto& own : PluginRegistry::builtin_search_path())
    if (fs::weakly_canonical(own, ec) == folder) return true;
  return false;
}

}  // namespace

std::string NamedFormat::label() const {
  return "checkpoint format '" + name + "'" + (origin.empty() ? "" : " (" + origin + ")");
}

NamedFormat named_format(const LoadedComponent& c, std::shared_ptr<sdk::CheckpointFormat> format) {
  NamedFormat n;
  n.name = c.info.name;
  n.origin =
      "plugin " + c.plugin_name + " " + c.plugin_version + ", " + c.library.filename().string();
  n.builtin = from_builtin_folder(c.library);
  n.format = std::move(format);
  return n;
}

std::vector<NamedFormat> formats_by_extension(const NamedFormat& configured,
                                              std::vector<NamedFormat> others,
                                              const std::string& key,
                                              std::vector<std::string>& warnings) {
  std::vector<NamedFormat> kept;
  if (configured.format) kept.push_back(configured);
  for (auto& f : others) {
    const std::string ext = f.format->file_extension();
    const NamedFormat* earlier = nullptr;
    for (const auto& k : kept)
      if (k.format->file_extension() == ext) earlier = &k;
    if (earlier == nullptr) {
      kept.push_back(std::move(f));
      continue;
    }
    if (configured.format && earlier->format == configured.format && !configured.builtin)
      throw sdk::PluginError(
          key + " = \"" + configured.name + "\": its files would be named '*" + ext + "', which " +
              f.label() +
              " claims too, so a file of either could be read as the "
              "other's",
          "give " + configured.label() +
              " an extension of its own (if it takes one as an option: `mixtrain plugins "
              "--describe " +
              configured.name + "`)" +
              (f.builtin ? std::string("; '") + ext + "' is mixtrain's own"
                         : ", or drop the plugin of '" + f.name +
                               "' from the search path (MIXTRAIN_PLUGIN_PATH, [plugins] "
                               "paths)"));
    warnings.push_back(f.label() + " is not used to read files: its extension '" + ext + "' is " +
                       earlier->label() + "'s, which reads them; give one of them " +
                       "another extension, or drop one plugin from the search path");
  }
  return kept;
}

}  // namespace mixtrain::core
