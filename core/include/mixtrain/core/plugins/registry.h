// PluginRegistry: finds, loads and indexes plugin libraries; creates their components.
//
// Contract
// - scan() loads every `libmixtrain_*.so` in the given folders (in order; a later library that
//   provides an already-known (kind, name) is reported as a duplicate and ignored). A library that
//   fails to load — a truncated or corrupt file (its ELF headers are checked before dlopen, see
//   sdk/support/elf_file_check.h), not a plugin, unresolved symbol, a core ABI (its descriptor's
//   abi_version: facets are versioned apart, at plan time) or fingerprint mismatch, a throwing
//   components() — is recorded with its reason and never prevents the others from loading. A
//   component without a factory, or whose option schema its own rules refuse (an empty or twice
//   declared name, a name its config section keeps for mixtrain (host_owned_keys(),
//   config/section_catalog.h), a default outside its range or choices, NaN), is ignored with a
//   warning. An entry that does not exist is recorded in missing_paths() (a typo in
//   MIXTRAIN_PLUGIN_PATH or [plugins] paths would otherwise only show as a missing component).
//   One failure cannot be recorded: a library whose static initializers throw while dlopen runs
//   them (GCC's initializers then call std::terminate; clang's let it unwind through dlopen, which
//   is left half done), so the process aborts either way, after one error line naming the
//   library, what it threw and the fix.
// - require() returns the component or throws sdk::PluginError listing what exists, a "did you
//   mean", every library that failed to load and every search path entry that does not exist.
// - create<T>() calls the factory; any exception is rethrown as sdk::PluginError carrying the
//   component and library names. A checkpoint format whose file_extension() is not a dot and then
//   letters, digits, '_' or '-' (checkpoint_extension_problem()) is refused there too, as a
//   PluginError naming the format and the extension. The returned shared_ptr's deleter keeps the
//   library loaded, and libraries are never unloaded while the process runs.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::core {

struct LoadedComponent {
  sdk::ComponentInfo info;
  std::string plugin_name;
  std::string plugin_version;
  std::filesystem::path library;
  std::shared_ptr<void> library_handle;  // keeps the shared library loaded
};

struct LibraryRecord {
  std::filesystem::path path;
  bool loaded = false;
  std::string plugin_name;
  std::string plugin_version;
  std::string error;  // why it failed to load, when !loaded
  std::vector<std::string> warnings;
};

// Why `extension` cannot be a checkpoint format's file extension (a dot, then one or more letters,
// digits, '_' or '-'), as the end of a sentence ("does not start with a dot"); empty when it can.
std::string checkpoint_extension_problem(const std::string& extension);

class PluginRegistry {
 public:
  explicit PluginRegistry(sdk::LogSink* sink = nullptr);

  // The default search path: the folder next to the executable where the install puts plugins
  // (../<libdir>/mixtrain/plugins, <libdir> being CMake's CMAKE_INSTALL_LIBDIR: lib, lib64 or
  // lib/<multiarch>), or ../lib/mixtrain/plugins (the build tree's) when only that one exists
  // (neither when none does: a program that embeds the core has none beside it), then
  // every entry of MIXTRAIN_PLUGIN_PATH (':'-separated folders or library files).
  static std::vector<std::filesystem::path> default_search_path();
  // Where an install puts the plugins, beside the running program (it may not exist; empty when
  // the program's location is unknown): what `mixtrain plugins` names when it finds none there.
  static std::filesystem::path installed_plugin_folder();
  // default_search_path()'s built-in part: builtin_folders() beside the running program.
  static std::vector<std::filesystem::path> builtin_search_path();
  // Whether scan() loads `file` from a folder: a libmixtrain_*.so.
  static bool is_plugin_file(const std::filesystem::path& file);
  // Its built-in part for an install `prefix` whose libraries are in `libdir` (relative).
  static std::vector<std::filesystem::path> builtin_folders(const std::filesystem::path& prefix,
                                                            const std::filesystem::path& libdir);

  void scan(const std::vector<std::filesystem::path>& folders_or_files);
  void load_library(const std::filesystem::path& path);

  const std::vector<LibraryRecord>& libraries() const { return libraries_; }
  const std::vector<LoadedComponent>& components() const { return components_; }
  // Scanned entries that are neither a folder nor a file, in scan order.
  const std::vector<std::filesystem::path>& missing_paths() const { return missing_paths_; }
  std::vector<std::string> names(sdk::ComponentKind kind) const;
  const LoadedComponent* find(sdk::ComponentKind kind, const std::string& name) const;
  // What may explain a missing component: libraries that failed to load and search path entries
  // that do not exist, as sentences; empty when there is neither.
  std::string load_problems() const;
  const LoadedComponent& require(sdk::ComponentKind kind, const std::string& name,
                                 const std::string& where = {}) const;

  template <class T>
  std::shared_ptr<T> create(const LoadedComponent& c, const sdk::Options& options) const {
    auto raw = create_component(c, options);
    auto* typed = dynamic_cast<T*>(raw.get());
    if (typed == nullptr) throw_wrong_type(c);
    raw.release();
    auto handle = c.library_handle;
    return std::shared_ptr<T>(typed, [handle](T* p) { delete p; });
  }

 private:
  // Indexes a loaded library's components (a duplicate or factory-less one is a warning).
  void register_components(LibraryRecord& rec, std::shared_ptr<void> handle,
                           std::vector<sdk::ComponentInfo> infos);
  std::unique_ptr<sdk::Component> create_component(const LoadedComponent& c,
                                                   const sdk::Options& options) const;
  [[noreturn]] void throw_wrong_type(const LoadedComponent& c) const;
  static void check_file_extension(const sdk::CheckpointFormat& format, const std::string& who,
                                   const std::string& name);

  sdk::LogSink* sink_;
  std::vector<LibraryRecord> libraries_;
  std::vector<LoadedComponent> components_;
  std::vector<std::filesystem::path> missing_paths_;
};

}  // namespace mixtrain::core
