#include "mixtrain/core/plugins/registry.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <set>
#include <string_view>
#include <variant>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "mixtrain/core/config/component_section.h"
#include "mixtrain/core/config/section_catalog.h"
#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/support/elf_file_check.h"
#include "mixtrain/sdk/version.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
namespace dll = boost::dll;

namespace {

// Libraries are never unloaded while the process runs: unloading from static destructors, or
// while a plugin-created object or exception still points into the library, crashes.
void keep_loaded_forever(const std::shared_ptr<dll::shared_library>& lib) {
  static auto* keep = new std::vector<std::shared_ptr<dll::shared_library>>();
  static auto* mutex = new std::mutex();
  std::lock_guard<std::mutex> lock(*mutex);
  keep->push_back(lib);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

// What the loader said: Boost wraps dlerror()'s text as "boost::dll::shared_library::load()
// failed (dlerror system message: TEXT): STRERROR", and its errno part is whatever errno held
// then (often unrelated: "Bad file descriptor"), so only TEXT is the loader's.
std::string loader_message(const std::exception& e) {
  const std::string what = e.what();
  const std::string marker = "(dlerror system message: ";
  const auto from = what.find(marker);
  const auto to = what.rfind(')');
  if (from == std::string::npos || to == std::string::npos || to < from + marker.size())
    return what;
  return what.substr(from + marker.size(), to - from - marker.size());
}

// A static initializer that throws while dlopen runs it cannot be caught: the exception meets
// the loader's C frames, and the runtime calls std::terminate, whose default message names
// neither the library nor the fix. Catching it there would not help either: dlopen would be left
// half done, holding its lock. So, only while one library loads, the terminate handler names the
// library, what it threw and the fix, then aborts as before. Loads are serialised (dlopen is
// anyway), so one handler and one library name serve.
std::mutex& loading_mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}
// Per thread: a terminate in another thread while a library loads is not this library's.
thread_local const fs::path* t_loading = nullptr;
std::atomic<std::terminate_handler> g_previous_terminate = nullptr;

// What the library's static initializers threw: "'text'" for a std::exception.
std::string thrown_text(const std::exception_ptr& thrown) {
  if (!thrown) return "no exception (std::terminate was called directly)";
  try {
    std::rethrow_exception(thrown);
  } catch (const std::exception& e) {
    return std::string("'") + e.what() + "'";
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

[[noreturn]] void abort_for_throwing_initializer(const fs::path& library, const std::string& what) {
  std::fprintf(stderr,
               "\nerror: the plugin library %s threw while it was being loaded (its static "
               "initializers threw %s); mixtrain cannot continue past it\n  HINT: fix or remove "
               "the plugin, or drop its folder from MIXTRAIN_PLUGIN_PATH (or [plugins] paths)\n",
               library.c_str(), what.c_str());
  std::fflush(stderr);
  std::abort();
}

[[noreturn]] void report_throwing_initializer() {
  if (t_loading == nullptr) {
    if (const auto previous = g_previous_terminate.load()) previous();
    std::abort();
  }
  abort_for_throwing_initializer(*t_loading, thrown_text(std::current_exception()));
}

// Boost.DLL's own report of a failed load (loader_message reads it); any other exception out of
// load() is the library's static initializers', unwound through dlopen.
bool is_loader_failure(const std::exception& e) {
  return std::string_view(e.what()).find("boost::dll::shared_library::load() failed") !=
         std::string_view::npos;
}

class ThrowingInitializerReport {
 public:
  explicit ThrowingInitializerReport(const fs::path& path) : lock_(loading_mutex()) {
    t_loading = &path;
    g_previous_terminate = std::set_terminate(&report_throwing_initializer);
  }
  ~ThrowingInitializerReport() {
    std::set_terminate(g_previous_terminate.load());
    t_loading = nullptr;
  }
  ThrowingInitializerReport(const ThrowingInitializerReport&) = delete;
  ThrowingInitializerReport& operator=(const ThrowingInitializerReport&) = delete;

 private:
  std::lock_guard<std::mutex> lock_;
};

// The library at `path`, mapped and kept loaded, or the reason it cannot be.
std::shared_ptr<dll::shared_library> open_library(const fs::path& path, std::string& error) {
  // dlopen maps the file's segments as they are: a truncated file (a half-copied plugin) makes
  // it touch pages past the end and die of SIGBUS, so the headers are checked first. The file can
  // still change between this check and dlopen; that race is accepted.
  try {
    sdk::check_elf_file(path);
  } catch (const std::exception& e) {
    error = std::string("cannot load the library: ") + e.what();
    return nullptr;
  }
  auto lib = std::make_shared<dll::shared_library>();
  try {
    const ThrowingInitializerReport report(path);
    // rtld_now: an unresolved symbol is reported here, with the loader's message, instead of
    // killing the process at first call.
    lib->load(path, dll::load_mode::rtld_now | dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    // A compiler whose static initializers do not call std::terminate on an escaping exception
    // (clang's) lets it unwind through dlopen, whose state is then not to be trusted (its lock,
    // half-run initializers): the same end as the terminate handler's, whichever compiler built
    // the plugin.
    if (!is_loader_failure(e))
      abort_for_throwing_initializer(path, thrown_text(std::current_exception()));
    error = "cannot load the library: " + loader_message(e);
    // The descriptor's ABI check comes after loading; a symbol of the SDK that this build lacks
    // stops the loader first: the plugin was built against another SDK, or without the support
    // library it must carry (the core exports none of its helpers).
    const auto at = error.find("undefined symbol: _Z");
    if (at != std::string::npos && error.find("8mixtrain3sdk", at) != std::string::npos)
      error +=
          " (a mixtrain::sdk symbol this mixtrain does not export: rebuild the plugin "
          "against this SDK, mixtrain " MIXTRAIN_VERSION
          ", with mixtrain_add_plugin() or linking mixtrain::sdk_support, whose helpers "
          "each plugin carries)";
    return nullptr;
  } catch (...) {
    abort_for_throwing_initializer(path, thrown_text(std::current_exception()));
  }
  keep_loaded_forever(lib);
  return lib;
}

// The library's descriptor, or the reason there is none.
const sdk::PluginDescriptor* read_descriptor(dll::shared_library& lib, std::string& error) {
  if (!lib.has("mixtrain_plugin_descriptor")) {
    error =
        "not a mixtrain plugin: it exports no 'mixtrain_plugin_descriptor' "
        "(build it with MIXTRAIN_PLUGIN(...) from mixtrain/sdk/plugin.h)";
    return nullptr;
  }
  const sdk::PluginDescriptor* d = nullptr;
  try {
    auto& get = lib.get_alias<const sdk::PluginDescriptor*()>("mixtrain_plugin_descriptor");
    d = get();
  } catch (const std::exception& e) {
    error = std::string("its descriptor could not be read: ") + e.what();
    return nullptr;
  }
  if (d == nullptr) error = "its descriptor function returned null";
  return d;
}

// Why the descriptor's core ABI or build fingerprint rules the library out, or "". Only the first
// two members are read: their layout never changes.
std::string boundary_mismatch(const fs::path& path, const sdk::PluginDescriptor& d) {
  if (d.abi_version != sdk::kSdkAbiVersion)
    return "SDK ABI mismatch: " + path.filename().string() +
           " was built against core ABI version " + std::to_string(d.abi_version) +
           ", this mixtrain's core ABI is version " + std::to_string(sdk::kSdkAbiVersion) +
           " (the component interfaces every plugin depends on; facets are versioned apart); "
           "rebuild the plugin against the installed mixtrain SDK";
  const std::string fp = d.build_fingerprint != nullptr ? d.build_fingerprint : "";
  if (fp != sdk::kBuildFingerprint)
    return "build fingerprint mismatch: plugin '" + fp + "', host '" + sdk::kBuildFingerprint +
           "'; C++ objects cross this boundary, so rebuild the plugin with the same compiler and "
           "standard library as mixtrain";
  return {};
}

// The descriptor's components, or the reason they cannot be had.
std::vector<sdk::ComponentInfo> read_components(const sdk::PluginDescriptor& d,
                                                std::string& error) {
  if (d.components == nullptr) {
    error = "its descriptor has no components() function (build it with MIXTRAIN_PLUGIN(...))";
    return {};
  }
  try {
    return d.components();
  } catch (const std::exception& e) {
    error = "its components() threw: " + std::string(e.what());
  } catch (...) {
    error = "its components() threw a non-standard exception";
  }
  return {};
}

// What is wrong with a component's option schema, or "" when nothing is: a name empty, declared
// twice or one its section keeps for mixtrain (host_owned_keys: a flat key of that name goes to
// the host, so the option could never be set flat), or a default its own rules refuse (outside
// the range, not a choice, NaN). Such a default would reach the factory unchecked and fail only
// deep in a run; the host's own check of a given value is the test, so a default means exactly
// what a user's value would.
std::string schema_problem(sdk::ComponentKind kind, const sdk::OptionSchema& schema) {
  std::set<std::string> names;
  const auto host_owned = host_owned_keys(kind);
  for (const auto& o : schema) {
    if (o.name.empty()) return "an option has no name";
    if (!names.insert(o.name).second) return "option '" + o.name + "' is declared twice";
    if (std::find(host_owned.begin(), host_owned.end(), o.name) != host_owned.end())
      return "it declares option '" + o.name + "', which [" + config_section_of(kind) +
             "] keeps for mixtrain itself (keys of its own: " + join(host_owned) + ")";
    if (std::holds_alternative<std::monostate>(o.default_value)) continue;  // required
    try {
      sdk::Options::resolve("default", {o}, {{o.name, o.default_value, {}}}, {}, {});
    } catch (const sdk::ConfigError& e) {
      // The host's own words for a user's value, without the config location it has none of.
      std::string why = e.what();
      const std::string tag = "'" + e.key() + "': ";
      if (const auto at = why.find(tag); at != std::string::npos) why = why.substr(at + tag.size());
      return "option '" + o.name + "' has a default its own rules refuse: " + why +
             (e.hint().empty() ? std::string() : " (" + e.hint() + ")");
    }
  }
  return {};
}

}  // namespace

PluginRegistry::PluginRegistry(sdk::LogSink* sink) : sink_(sink) {}

bool PluginRegistry::is_plugin_file(const fs::path& p) {
  auto name = p.filename().string();
  return name.rfind("libmixtrain_", 0) == 0 && p.extension() == ".so";
}

std::vector<fs::path> PluginRegistry::builtin_folders(const fs::path& prefix,
                                                      const fs::path& libdir) {
  // One folder: the install's where it exists, else the build tree's. Never both: a stale install
  // under lib beside a lib64 one would be scanned on every run. Neither: none, for a program that
  // embeds the core has no plugin folder beside it, and a missing entry would be warned about in
  // every error it reports.
  const fs::path installed = prefix / libdir / "mixtrain" / "plugins";
  const fs::path built = prefix / "lib" / "mixtrain" / "plugins";
  std::error_code ec;
  if (fs::is_directory(installed, ec)) return {installed};
  if (fs::is_directory(built, ec)) return {built};
  return {};
}

fs::path PluginRegistry::installed_plugin_folder() {
  std::error_code ec;
  const auto exe = dll::program_location(ec);
  if (ec) return {};
  return exe.parent_path().parent_path() / MIXTRAIN_INSTALL_LIBDIR / "mixtrain" / "plugins";
}

std::vector<fs::path> PluginRegistry::builtin_search_path() {
  std::error_code ec;
  const auto exe = dll::program_location(ec);
  if (ec) return {};
  return builtin_folders(exe.parent_path().parent_path(), MIXTRAIN_INSTALL_LIBDIR);
}

std::vector<fs::path> PluginRegistry::default_search_path() {
  std::vector<fs::path> out = builtin_search_path();
  if (const char* env = std::getenv("MIXTRAIN_PLUGIN_PATH")) {
    std::string s = env;
    std::size_t start = 0;
    while (start <= s.size()) {
      auto end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) out.emplace_back(s.substr(start, end - start));
      start = end + 1;
    }
  }
  return out;
}

void PluginRegistry::scan(const std::vector<fs::path>& folders_or_files) {
  std::set<fs::path> seen;
  for (const auto& l : libraries_) seen.insert(fs::weakly_canonical(l.path));
  for (const auto& entry : folders_or_files) {
    std::error_code ec;
    if (fs::is_directory(entry, ec)) {
      std::vector<fs::path> files;
      for (const auto& f : fs::directory_iterator(entry, ec))
        if (f.is_regular_file() && is_plugin_file(f.path())) files.push_back(f.path());
      std::sort(files.begin(), files.end());  // deterministic order: first one wins
      for (const auto& f : files)
        if (seen.insert(fs::weakly_canonical(f)).second) load_library(f);
    } else if (fs::is_regular_file(entry, ec)) {
      if (seen.insert(fs::weakly_canonical(entry)).second) load_library(entry);
    } else {
      if (std::find(missing_paths_.begin(), missing_paths_.end(), entry) == missing_paths_.end())
        missing_paths_.push_back(entry);
      // Debug only: an embedding program may have no plugin folder next to it. Commands that
      // list plugins or fail to find one report missing_paths() as a warning.
      if (sink_ != nullptr)
        sink_->write(sdk::LogLevel::debug, "plugins",
                     "plugin search path entry " + entry.string() + " does not exist");
    }
  }
}

void PluginRegistry::load_library(const fs::path& path) {
  LibraryRecord rec;
  rec.path = path;
  std::vector<sdk::ComponentInfo> infos;
  auto lib = open_library(path, rec.error);
  const sdk::PluginDescriptor* d = lib != nullptr ? read_descriptor(*lib, rec.error) : nullptr;
  if (d != nullptr) rec.error = boundary_mismatch(path, *d);
  if (d != nullptr && rec.error.empty()) {
    rec.plugin_name = d->name != nullptr ? d->name : "";
    rec.plugin_version = d->version != nullptr ? d->version : "";
    infos = read_components(*d, rec.error);
  }
  if (rec.error.empty()) {
    rec.loaded = true;
    register_components(rec, std::move(lib), std::move(infos));
  }
  libraries_.push_back(std::move(rec));
}

namespace {

// A component is named in configs as `type = "NAME"` and `[kind.NAME]`: a TOML bare key, so
// letters, digits, '_' and '-' only (a dot would open another table, a space needs quotes).
bool addressable_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

}  // namespace

void PluginRegistry::register_components(LibraryRecord& rec, std::shared_ptr<void> handle,
                                         std::vector<sdk::ComponentInfo> infos) {
  for (auto& info : infos) {
    // Each warning names the component as the library registers it: kind, name, library.
    const std::string kind(sdk::component_kind_name(info.kind));
    const std::string who = (kind == "?" ? "component" : kind) + " '" + info.name + "' of " +
                            rec.path.filename().string();
    if (kind == "?") {
      rec.warnings.push_back(who + " ignored: its kind (" +
                             std::to_string(static_cast<int>(info.kind)) +
                             ") is none of backend, policy, scaler, optimizer, checkpoint_format, "
                             "communicator; fix components() and rebuild the plugin");
      continue;
    }
    if (!addressable_name(info.name)) {
      rec.warnings.push_back(who + " ignored: a config cannot name it (a name is letters, digits, "
                                   "'_' and '-', as a TOML bare key); rename it and rebuild the "
                                   "plugin");
      continue;
    }
    if (const auto* prev = find(info.kind, info.name)) {
      rec.warnings.push_back(
          who + " ignored: " +
          (prev->library == rec.path
               ? "the library registers that name twice; rename one and rebuild the plugin"
               : prev->library.string() +
                     " provides it first (the first library the search finds wins; the order is "
                     "`mixtrain plugins`'s)"));
      continue;
    }
    if (info.create == nullptr) {
      rec.warnings.push_back(who + " ignored: it has no factory; give it one in components() and "
                                   "rebuild the plugin");
      continue;
    }
    if (auto problem = schema_problem(info.kind, info.options); !problem.empty()) {
      rec.warnings.push_back(who + " ignored: " + problem +
                             "; fix its option_schema() and rebuild the plugin");
      continue;
    }
    components_.push_back({std::move(info), rec.plugin_name, rec.plugin_version, rec.path, handle});
  }
  if (sink_ != nullptr)
    for (const auto& w : rec.warnings) sink_->write(sdk::LogLevel::warn, "plugins", w);
}

std::vector<std::string> PluginRegistry::names(sdk::ComponentKind kind) const {
  std::vector<std::string> out;
  for (const auto& c : components_)
    if (c.info.kind == kind) out.push_back(c.info.name);
  return out;
}

const LoadedComponent* PluginRegistry::find(sdk::ComponentKind kind,
                                            const std::string& name) const {
  for (const auto& c : components_)
    if (c.info.kind == kind && c.info.name == name) return &c;
  return nullptr;
}

const LoadedComponent& PluginRegistry::require(sdk::ComponentKind kind, const std::string& name,
                                               const std::string& where) const {
  if (const auto* c = find(kind, name)) return *c;
  auto kind_name = std::string(sdk::component_kind_name(kind));
  auto available = names(kind);
  std::string msg = (where.empty() ? "" : where + ": ") + "no " + kind_name + " named '" + name +
                    "'; " +
                    (available.empty() ? std::string("no ") + kind_name + " is available"
                                       : "available: " + join(available));
  std::string hint;
  auto near = sdk::closest_match(name, available);
  if (!near.empty()) hint = "did you mean '" + near + "'? ";
  if (auto problems = load_problems(); !problems.empty()) hint += problems + " ";
  hint +=
      "Run `mixtrain plugins` to list what was found; add folders with MIXTRAIN_PLUGIN_PATH "
      "or [plugins] paths.";
  throw sdk::PluginError(msg, hint);
}

std::string PluginRegistry::load_problems() const {
  std::string out;
  std::vector<std::string> failed;
  for (const auto& l : libraries_)
    if (!l.loaded) failed.push_back(l.path.string() + " (" + l.error + ")");
  if (!failed.empty()) out += "libraries that failed to load: " + join(failed) + ".";
  std::vector<std::string> missing;
  for (const auto& p : missing_paths_) missing.push_back(p.string());
  if (!missing.empty())
    out += std::string(out.empty() ? "" : " ") +
           "warning: plugin search path entries that do not exist: " + join(missing) + ".";
  return out;
}

std::unique_ptr<sdk::Component> PluginRegistry::create_component(
    const LoadedComponent& c, const sdk::Options& options) const {
  sdk::PluginContext ctx;
  ctx.plugin_name = c.plugin_name;
  ctx.component_name = c.info.name;
  ctx.logger =
      sdk::Logger(sink_, std::string(sdk::component_kind_name(c.info.kind)) + "." + c.info.name);
  const std::string who = std::string(sdk::component_kind_name(c.info.kind)) + " '" + c.info.name +
                          "' (plugin '" + c.plugin_name + "', " + c.library.filename().string() +
                          ")";
  std::unique_ptr<sdk::Component> obj;
  try {
    obj = c.info.create(options, ctx);
  } catch (const sdk::ConfigError&) {
    throw;  // already names the file, line and key the user must fix
  } catch (const sdk::UserError& e) {
    throw sdk::PluginError(who + ": " + e.what(), e.hint());
  } catch (const std::exception& e) {
    throw sdk::PluginError(who + " failed to start: " + e.what(),
                           "this is an error inside the plugin; report it to its authors");
  } catch (...) {
    throw sdk::PluginError(who + " failed to start with a non-standard exception",
                           "this is an error inside the plugin; report it to its authors");
  }
  if (!obj) throw sdk::PluginError(who + ": factory returned nothing");
  if (const auto* format = dynamic_cast<const sdk::CheckpointFormat*>(obj.get()))
    check_file_extension(*format, who, c.info.name);
  return obj;
}

// A format's extension names its files (step-N<ext>) and picks the format that reads a file, so
// one that is not a plain suffix would write elsewhere than the run's checkpoints/ ("../x"), or
// files no folder search finds ("tbck" without its dot: step-00000010tbck).
void PluginRegistry::check_file_extension(const sdk::CheckpointFormat& format,
                                          const std::string& who, const std::string& name) {
  std::string ext;
  try {
    ext = format.file_extension();
  } catch (const std::exception& e) {
    throw sdk::PluginError(who + ": file_extension() threw: " + e.what(),
                           "this is an error inside the plugin; report it to its authors");
  }
  if (const auto problem = checkpoint_extension_problem(ext); !problem.empty())
    throw sdk::PluginError(
        who + ": its file extension '" + ext + "' " + problem,
        "a checkpoint format's extension is a dot and then letters, digits, '_' or '-' (\".mxt\"); "
        "if the plugin takes its extension as an option (`mixtrain plugins --describe " +
            name + "`), give it one such, else report it to the plugin's authors");
}

std::string checkpoint_extension_problem(const std::string& ext) {
  if (ext.empty()) return "is empty";
  if (ext.front() != '.') return "does not start with a dot";
  if (ext.size() == 1) return "is a dot alone";
  for (std::size_t i = 1; i < ext.size(); ++i) {
    const auto c = static_cast<unsigned char>(ext[i]);
    if (!std::isalnum(c) && c != '_' && c != '-')
      return std::string("holds '") + ext[i] + "' (only one dot, then letters, digits, '_' or '-')";
  }
  return {};
}

void PluginRegistry::throw_wrong_type(const LoadedComponent& c) const {
  throw sdk::PluginError(
      "component '" + c.info.name + "' of " + c.library.string() + " is registered as kind " +
          std::string(sdk::component_kind_name(c.info.kind)) +
          " but its factory built an object of another interface",
      "this is an error inside the plugin (its components() entry names the wrong kind, or the "
      "factory builds the wrong class); report it to its authors");
}

}  // namespace mixtrain::core
