// `mixtrain plugins`: the components found, the libraries that failed to load, the search path;
// with --describe, one component's option schema, or (data/NAME, host/TABLE) one of the host's
// sections as `mixtrain describe` prints it.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli_registry.h"
#include "commands.h"
#include "mixtrain/core/config/component_section.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/config/section_catalog.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/sdk/device_backend.h"
#include "section_description.h"

namespace mixtrain::cli {

namespace {

using core::LoadedComponent;
using core::PluginRegistry;

constexpr sdk::ComponentKind kKinds[] = {sdk::ComponentKind::backend,
                                         sdk::ComponentKind::policy,
                                         sdk::ComponentKind::scaler,
                                         sdk::ComponentKind::optimizer,
                                         sdk::ComponentKind::checkpoint_format,
                                         sdk::ComponentKind::communicator};

std::string kind_name(sdk::ComponentKind k) {
  return std::string(sdk::component_kind_name(k));
}
std::string dt(sdk::DType t) {
  return std::string(sdk::dtype_name(t));
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void print_backend_capabilities(const PluginRegistry& registry, const LoadedComponent& c) {
  try {
    auto opts = sdk::Options::resolve("backend", c.info.options, {}, {});
    auto backend = registry.create<sdk::DeviceBackend>(c, opts);
    auto caps = backend->capabilities();
    std::printf("%-18s   device: %s, %d threads\n", "", caps.device_name.c_str(), caps.threads);
    for (const auto& d : caps.gemm_inputs)
      std::printf("%-18s   gemm %-9s %-9s %s\n", "", dt(d.dtype).c_str(),
                  d.native ? "native" : "emulated", d.how.c_str());
    if (!caps.features.empty())
      std::printf("%-18s   cpu features: %s\n", "", join(caps.features).c_str());
  } catch (const std::exception& e) {
    std::printf("%-18s   unavailable: %s\n", "", e.what());
  }
}

// NAME or KIND/NAME; every component that matches (a bare NAME may name one of several kinds).
std::vector<const LoadedComponent*> lookup(const PluginRegistry& registry,
                                           const std::string& spec) {
  std::string name = spec;
  std::optional<sdk::ComponentKind> kind;
  if (auto slash = spec.find('/'); slash != std::string::npos) {
    const std::string k = spec.substr(0, slash);
    name = spec.substr(slash + 1);
    std::vector<std::string> kinds;
    for (auto candidate : kKinds) {
      kinds.push_back(kind_name(candidate));
      if (kinds.back() == k) kind = candidate;
    }
    if (!kind) {
      auto near = sdk::closest_match(k, kinds);
      throw sdk::UserError("--describe " + spec + ": no component kind '" + k + "'",
                           (near.empty() ? "" : "did you mean '" + near + "/" + name + "'? ") +
                               "kinds: " + join(kinds));
    }
  }
  std::vector<const LoadedComponent*> out;
  for (const auto& c : registry.components())
    if (c.info.name == name && (!kind || c.info.kind == *kind)) out.push_back(&c);
  if (!out.empty()) return out;

  std::vector<std::string> known, candidates;
  for (const auto& c : registry.components()) {
    known.push_back(kind_name(c.info.kind) + "/" + c.info.name);
    if (!kind || c.info.kind == *kind) candidates.push_back(kind ? known.back() : c.info.name);
  }
  const auto near = sdk::closest_match(kind ? spec : name, candidates);
  const auto problems = registry.load_problems();
  throw sdk::UserError("--describe " + spec + ": no component named '" + name + "'" +
                           (kind ? " among the " + kind_name(*kind) + " components" : ""),
                       (near.empty() ? "" : "did you mean '" + near + "'? ") +
                           "known components: " + (known.empty() ? "none" : join(known)) + "." +
                           (problems.empty() ? "" : " " + problems));
}

void describe(const LoadedComponent& c) {
  std::printf("%s/%s: %s\n", kind_name(c.info.kind).c_str(), c.info.name.c_str(),
              c.info.description.c_str());
  std::printf("plugin '%s' %s, %s\n", c.plugin_name.c_str(), c.plugin_version.c_str(),
              c.library.string().c_str());
  std::printf("options go in [%s.%s] (or flat in [%s] while it is selected)\n",
              core::config_section_of(c.info.kind).c_str(), c.info.name.c_str(),
              core::config_section_of(c.info.kind).c_str());
  print_section_keys(core::section_keys(c.info.options));
}

// The host's own sections, spelled as before `mixtrain describe` existed: data/NAME (or a bare
// NAME no plugin uses) for a data source, host/TABLE for the host's keys of a table. Both print
// what `mixtrain describe data.NAME` / `describe TABLE` prints.
bool describe_host_section(const PluginRegistry& registry, const std::string& spec,
                           bool plugin_matches) {
  std::string name;
  if (spec.rfind("host/", 0) == 0)
    name = spec.substr(5);
  else if (spec.rfind("data/", 0) == 0)
    name = "data." + spec.substr(5);
  else if (!plugin_matches && spec.find('/') == std::string::npos &&
           std::find(core::data_sources().begin(), core::data_sources().end(), spec) !=
               core::data_sources().end())
    name = "data." + spec;
  else
    return false;
  const auto sections = core::config_sections(registry);
  const auto found = std::find_if(sections.begin(), sections.end(),
                                  [&](const core::ConfigSection& s) { return s.name == name; });
  if (found != sections.end()) {
    print_section(sections, *found);
    return true;
  }
  // Not found: the suggestion in this command's own spelling (host/TABLE, data/NAME).
  const bool data = spec.rfind("data/", 0) == 0;
  std::vector<std::string> candidates;
  for (const auto& s : sections) {
    const bool top = s.name.find('.') == std::string::npos;
    if (data && s.name.rfind("data.", 0) == 0 && s.name != "data.normalize" &&
        s.name != "data.augment")
      candidates.push_back("data/" + s.name.substr(5));
    else if (!data && top)
      candidates.push_back("host/" + s.name);
  }
  const auto near = sdk::closest_match(spec, candidates);
  throw sdk::UserError("--describe " + spec + ": " +
                           (data ? "no data source named '" + spec.substr(5) + "'"
                                 : "the host has no table '" + spec.substr(5) + "'"),
                       (near.empty() ? "" : "did you mean '" + near + "'? ") + "known: " +
                           join(candidates) + "; mixtrain describe lists every config section");
  return true;
}

}  // namespace

int run_plugins(const std::string& describe_spec) {
  auto registry = make_registry(nullptr);
  auto log = core::core_logger("plugins");
  for (const auto& p : registry->missing_paths())
    log.warn("plugin search path entry " + p.string() +
             " does not exist; check MIXTRAIN_PLUGIN_PATH and [plugins] paths");

  if (!describe_spec.empty()) {
    const bool plugin_matches =
        std::any_of(registry->components().begin(), registry->components().end(),
                    [&](const LoadedComponent& c) { return c.info.name == describe_spec; });
    if (describe_host_section(*registry, describe_spec, plugin_matches)) return 0;
    const auto matches = lookup(*registry, describe_spec);
    if (matches.size() > 1) {
      std::vector<std::string> names;
      for (const auto* c : matches) names.push_back(kind_name(c->info.kind) + "/" + c->info.name);
      std::printf("'%s' names %zu components (%s); describe one with KIND/NAME\n\n",
                  describe_spec.c_str(), matches.size(), join(names).c_str());
    }
    for (std::size_t i = 0; i < matches.size(); ++i) {
      if (i > 0) std::printf("\n");
      describe(*matches[i]);
    }
    return 0;
  }

  std::printf("%-18s %-14s %-8s %-34s %s\n", "KIND", "NAME", "VERSION", "LIBRARY", "DESCRIPTION");
  for (const auto& c : registry->components()) {
    std::printf("%-18s %-14s %-8s %-34s %s\n", kind_name(c.info.kind).c_str(), c.info.name.c_str(),
                c.plugin_version.c_str(), c.library.filename().string().c_str(),
                c.info.description.c_str());
    if (c.info.kind == sdk::ComponentKind::backend) print_backend_capabilities(*registry, c);
  }
  bool any_failed = false;
  for (const auto& l : registry->libraries()) {
    if (l.loaded) continue;
    if (!any_failed) std::printf("\nlibraries that failed to load:\n");
    any_failed = true;
    std::printf("  %s\n    %s\n", l.path.string().c_str(), l.error.c_str());
  }
  const auto& missing = registry->missing_paths();
  std::printf("\nsearch path:");
  const auto path = PluginRegistry::default_search_path();
  for (const auto& p : path) {
    const bool absent = std::find(missing.begin(), missing.end(), p) != missing.end();
    std::printf(" %s%s", p.string().c_str(), absent ? " (does not exist)" : "");
  }
  std::printf("\n");
  // No built-in folder beside this executable: a broken install, said where it should be.
  if (PluginRegistry::builtin_search_path().empty())
    std::printf("no plugin folder beside this executable: %s does not exist\n",
                PluginRegistry::installed_plugin_folder().string().c_str());
  return 0;
}

}  // namespace mixtrain::cli
