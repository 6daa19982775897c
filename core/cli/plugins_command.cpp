// `mixtrain plugins`: the components found, the libraries that failed to load, the search path;
// with --describe, one component's option schema, a data source's, or the host's keys of a table
// (host/optimizer: the schedule's).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cli_registry.h"
#include "commands.h"
#include "mixtrain/core/config/component_section.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::cli {

namespace {

using core::LoadedComponent;
using core::PluginRegistry;

constexpr sdk::ComponentKind kKinds[] = {sdk::ComponentKind::backend, sdk::ComponentKind::policy,
                                         sdk::ComponentKind::scaler, sdk::ComponentKind::optimizer,
                                         sdk::ComponentKind::checkpoint_format};

std::string kind_name(sdk::ComponentKind k) {
  return std::string(sdk::component_kind_name(k));
}
std::string dt(sdk::DType t) {
  return std::string(sdk::dtype_name(t));
}

// "integer", not option_type_name()'s "an integer" (written for sentences).
std::string type_column(sdk::OptionType t) {
  std::string s(sdk::option_type_name(t));
  for (const char* article : {"a ", "an "})
    if (s.rfind(article, 0) == 0) return s.substr(std::string(article).size());
  return s;
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

// `lists`: options declared as strings that hold a list of integers ([optimizer] milestones).
void print_schema(const sdk::OptionSchema& options, const std::vector<std::string>& lists = {}) {
  if (options.empty()) {
    std::printf("no options\n");
    return;
  }
  struct Row {
    std::string name, type, def, range, doc;
  };
  std::vector<Row> rows{{"OPTION", "TYPE", "DEFAULT", "RANGE", "DOC"}};
  for (const auto& o : options) {
    const bool required = std::holds_alternative<std::monostate>(o.default_value);
    const bool list = std::find(lists.begin(), lists.end(), o.name) != lists.end();
    rows.push_back({o.name, list ? "integer list" : type_column(o.type),
                    required ? "(required)"
                    : list   ? "[]"
                             : sdk::option_value_to_string(o.default_value),
                    o.range_text(), o.doc});
  }
  std::size_t w[4] = {};
  for (const auto& r : rows) {
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.type.size());
    w[2] = std::max(w[2], r.def.size());
    w[3] = std::max(w[3], r.range.size());
  }
  for (const auto& r : rows)
    std::printf("  %-*s  %-*s  %-*s  %-*s  %s\n", static_cast<int>(w[0]), r.name.c_str(),
                static_cast<int>(w[1]), r.type.c_str(), static_cast<int>(w[2]), r.def.c_str(),
                static_cast<int>(w[3]), r.range.c_str(), r.doc.c_str());
}

void describe(const LoadedComponent& c) {
  std::printf("%s/%s: %s\n", kind_name(c.info.kind).c_str(), c.info.name.c_str(),
              c.info.description.c_str());
  std::printf("plugin '%s' %s, %s\n", c.plugin_name.c_str(), c.plugin_version.c_str(),
              c.library.string().c_str());
  std::printf("options go in [%s.%s] (or flat in [%s] while it is selected)\n",
              core::config_section_of(c.info.kind).c_str(), c.info.name.c_str(),
              core::config_section_of(c.info.kind).c_str());
  print_schema(c.info.options);
}

// The data sources are the host's own components: data/NAME, or a bare NAME no plugin uses.
bool describe_data_source(const std::string& spec, bool plugin_matches) {
  std::string name = spec;
  if (spec.rfind("data/", 0) == 0)
    name = spec.substr(5);
  else if (plugin_matches || spec.find('/') != std::string::npos)
    return false;
  const auto& sources = core::data_sources();
  if (std::find(sources.begin(), sources.end(), name) == sources.end()) {
    if (spec.rfind("data/", 0) != 0) return false;
    auto near = sdk::closest_match(name, sources);
    throw sdk::UserError("--describe " + spec + ": no data source named '" + name + "'",
                         (near.empty() ? "" : "did you mean 'data/" + near + "'? ") +
                             "data sources: " + join(sources));
  }
  std::printf("data/%s: a data source of the host ([data] source = \"%s\")\n", name.c_str(),
              name.c_str());
  std::printf(
      "options go in [data.%s] (or flat in [data] while it is selected); [data]'s own "
      "keys: ",
      name.c_str());
  std::vector<std::string> common;
  for (const auto& o : core::data_common_schema()) common.push_back(o.name);
  std::printf("%s\n", join(common).c_str());
  print_schema(core::data_source_schema(name));
  return true;
}

// The host's own keys of a table: host/TABLE (run, optimizer, checkpoint, model, ema, eval).
bool describe_host_table(const std::string& spec) {
  if (spec.rfind("host/", 0) != 0) return false;
  const std::string table = spec.substr(5);
  struct HostTable {
    const char* name;
    sdk::OptionSchema (*schema)();
    const char* where;
    std::vector<std::string> lists;
  };
  const HostTable tables[] = {
      {"run", core::run_schema, "[run]", {}},
      {"optimizer",
       core::schedule_schema,
       "[optimizer], beside type (the optimizer's own options: --describe optimizer/NAME)",
       {"milestones"}},
      {"checkpoint",
       core::checkpoint_core_schema,
       "[checkpoint], beside format (the format's own options: --describe "
       "checkpoint_format/NAME)",
       {}},
      {"model",
       core::model_schema,
       "[model], beside its layers, nodes or blocks (docs/model-graph.md)",
       {}},
      {"ema", core::ema_schema, "[ema]", {}},
      {"eval", core::eval_schema, "[eval]", {}},
  };
  std::vector<std::string> names;
  for (const auto& t : tables) {
    names.push_back(t.name);
    if (table != t.name) continue;
    std::printf("host/%s: keys the host reads in %s\n", t.name, t.where);
    print_schema(t.schema(), t.lists);
    return true;
  }
  const auto near = sdk::closest_match(table, names);
  throw sdk::UserError("--describe " + spec + ": the host has no table '" + table + "'",
                       (near.empty() ? "" : "did you mean 'host/" + near + "'? ") +
                           "host tables: " + join(names) + "; data sources: data/NAME");
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
    if (describe_host_table(describe_spec)) return 0;
    if (describe_data_source(describe_spec, plugin_matches)) return 0;
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
  for (const auto& p : PluginRegistry::default_search_path()) {
    const bool absent = std::find(missing.begin(), missing.end(), p) != missing.end();
    std::printf(" %s%s", p.string().c_str(), absent ? " (does not exist)" : "");
  }
  std::printf("\n");
  return 0;
}

}  // namespace mixtrain::cli
