#include "cli_registry.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"

namespace mixtrain::cli {

namespace {

namespace fs = std::filesystem;

// What is wrong with a [plugins] paths entry the user wrote that scan() found (a missing one is
// in missing_paths()): a folder whose shared libraries are none of them plugin files, or that
// holds none. Empty when the entry is fine. Such an entry is a typo or a misnamed library; without
// this line it would only show as a missing component, or not at all when the run needs none.
std::string unusable_plugin_folder(const fs::path& entry) {
  std::error_code ec;
  if (!fs::is_directory(entry, ec)) return {};  // a file is loaded (or its failure reported)
  std::vector<std::string> other_libraries;
  for (const auto& f : fs::directory_iterator(entry, ec)) {
    if (f.path().extension() != ".so") continue;
    if (core::PluginRegistry::is_plugin_file(f.path())) return {};
    other_libraries.push_back(f.path().filename().string());
  }
  if (other_libraries.empty()) return "holds no plugin library (libmixtrain_*.so)";
  std::string names;
  for (std::size_t i = 0; i < other_libraries.size() && i < 3; ++i)
    names += (i ? ", " : "") + other_libraries[i];
  return "holds no libmixtrain_*.so, only " + names + (other_libraries.size() > 3 ? ", ..." : "") +
         "; the registry loads a folder's libraries only when their names start with "
         "libmixtrain_ (or name the file itself in paths)";
}

std::vector<std::string>& outside_plugin_list() {
  static std::vector<std::string> list;
  return list;
}

// Whether `library` lies in one of mixtrain's own plugin folders.
bool builtin_library(const fs::path& library) {
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(library.parent_path(), ec);
  for (const auto& own : core::PluginRegistry::builtin_search_path())
    if (fs::weakly_canonical(own, ec) == folder) return true;
  return false;
}

}  // namespace

const std::vector<std::string>& outside_plugins() {
  return outside_plugin_list();
}

std::unique_ptr<core::PluginRegistry> make_registry(const core::Config* config) {
  auto reg = std::make_unique<core::PluginRegistry>(&core::host_log_sink());
  auto paths = core::PluginRegistry::default_search_path();
  std::vector<fs::path> config_paths;
  if (config != nullptr) config_paths = core::config_plugin_paths(*config);
  for (const auto& p : config_paths) paths.push_back(p);
  reg->scan(paths);
  for (const auto& l : reg->libraries()) {
    if (!l.loaded || builtin_library(l.path)) continue;
    const std::string text =
        l.path.string() + " (plugin " + l.plugin_name + " " + l.plugin_version + ")";
    auto& list = outside_plugin_list();
    if (std::find(list.begin(), list.end(), text) == list.end()) list.push_back(text);
  }
  // `plugins` lists failures itself; a run says so once, so a half-copied plugin whose
  // components go missing is not a silent surprise.
  if (config != nullptr) {
    auto log = core::core_logger("plugins");
    const auto& missing = reg->missing_paths();
    for (const auto& p : config_paths) {
      const std::string problem = std::find(missing.begin(), missing.end(), p) != missing.end()
                                      ? "does not exist"
                                      : unusable_plugin_folder(p);
      if (!problem.empty())
        log.warn(config->location("plugins.paths").to_string() + ": [plugins] paths entry " +
                 p.string() + " " + problem);
    }
    for (const auto& l : reg->libraries())
      if (!l.loaded)
        log.warn("plugin library " + l.path.string() + " was skipped: " + l.error +
                 " (`mixtrain plugins` lists every library)");
  }
  return reg;
}

}  // namespace mixtrain::cli
