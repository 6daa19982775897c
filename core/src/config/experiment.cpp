#include "mixtrain/core/config/experiment.h"

#include <algorithm>
#include <map>
#include <set>

#include "config/data_section.h"
#include "config/model_section.h"
#include "config/reading.h"
#include "graph/ops/op_registry.h"
#include "mixtrain/core/config/component_section.h"
#include "mixtrain/core/config/host_schemas.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using sdk::ComponentKind;

namespace {

const std::vector<std::string> kTopLevelTables = {"run",       "backend", "precision", "scaler",
                                                  "optimizer", "model",   "data",      "checkpoint",
                                                  "ema",       "eval",    "plugins"};

// Every component of `kind` the registry knows, with its schema.
std::vector<ComponentSchema> registered(const PluginRegistry& registry, ComponentKind kind) {
  std::vector<ComponentSchema> out;
  for (const auto& c : registry.components())
    if (c.info.kind == kind) out.push_back({c.info.name, c.info.options});
  return out;
}

}  // namespace

std::vector<fs::path> config_plugin_paths(const Config& config) {
  std::vector<fs::path> out;
  if (config.has_table("plugins")) {
    auto raw = config.table_options("plugins", {"paths"});
    for (const auto& r : raw)
      throw sdk::ConfigError(r.where, "plugins." + r.key, "unknown key",
                             "[plugins] takes only paths = [\"folder\", ...]");
    for (const auto& p : config.string_array("plugins.paths"))
      out.push_back(config_path(config, "plugins.paths", p));
  }
  return out;
}

Experiment parse_experiment(const Config& config, const PluginRegistry& registry) {
  Experiment e;
  e.source_name = config.source_name();
  for (const auto& key : config.top_level_keys()) {
    if (std::find(kTopLevelTables.begin(), kTopLevelTables.end(), key) == kTopLevelTables.end()) {
      auto near = sdk::closest_match(key, kTopLevelTables);
      std::string list;
      for (const auto& t : kTopLevelTables) list += (list.empty() ? "" : ", ") + t;
      throw sdk::ConfigError(
          config.location(key), key, "unknown table",
          (near.empty() ? "" : "did you mean [" + near + "]? ") + "known tables: " + list);
    }
  }
  e.plugin_paths = config_plugin_paths(config);
  for (const auto& t : {"run", "plugins", "ema", "eval"}) reject_nested(config, t);
  const auto overrides = config.table_array("precision.override");
  for (std::size_t i = 0; i < overrides.size(); ++i)
    reject_nested(config, "precision.override." + std::to_string(i));

  // [run]
  auto run = sdk::Options::resolve("run", run_schema(), config.table_options("run"),
                                   config.location("run"), {});
  e.run.name = run.get_string("name");
  e.run.seed = static_cast<std::uint64_t>(run.get_int("seed"));
  e.run.steps = run.get_int("steps");
  e.run.log_every = run.get_int("log_every");
  e.run.eval_every = run.get_int("eval_every");
  e.run.on_nonfinite = run.get_string("on_nonfinite");
  e.run.dir = run.get_string("dir");
  if (!e.run.dir.empty()) e.run.dir = config_path(config, "run.dir", e.run.dir).string();
  e.run.underflow_every = run.get_int("underflow_every");
  e.run.accumulate = run.get_int("accumulate");
  e.run.step_graphs = run.get_bool("step_graphs");
  e.run.stretch_schedule = run.get_bool("stretch_schedule");
  ResolvedSection run_section = section_of("run", {}, run);
  show_resolved(run_section, "dir", e.run.dir);
  e.core_sections.push_back(run_section);

  read_data_config(config, e);
  read_model_config(config, e);

  // [backend], [precision], [scaler], [optimizer], [checkpoint]: plugin-backed sections.
  auto plugin_section = [&](const std::string& table, const std::string& selector,
                            const std::string& fallback, ComponentKind kind,
                            const std::string& noun, sdk::OptionSchema host, std::string& name_out,
                            sdk::Options& plugin_out, std::vector<std::string> host_tables = {}) {
    name_out = section_selector(config, table, selector, fallback);
    registry.require(
        kind, name_out,
        config.location(table + "." + selector).to_string() + ": " + table + "." + selector);
    ComponentSection section{table,
                             selector,
                             noun,
                             name_out,
                             std::move(host),
                             registered(registry, kind),
                             std::move(host_tables)};
    auto r = resolve_component_section(config, section);
    plugin_out = r.component;
    return r.host;
  };
  auto backend_host = plugin_section("backend", "type", "cpu", ComponentKind::backend, "backend",
                                     {}, e.backend_type, e.backend_options);
  push_component(e.core_sections, "backend", "type", e.backend_type, backend_host,
                 e.backend_options);
  auto precision_host = plugin_section("precision", "policy", "fp32", ComponentKind::policy,
                                       "policy", {}, e.policy_name, e.policy_options, {"override"});
  push_component(e.core_sections, "precision", "policy", e.policy_name, precision_host,
                 e.policy_options);
  for (const auto& entry : overrides) {
    auto o = sdk::Options::resolve("precision.override", precision_override_schema(), entry.options,
                                   entry.where, {});
    PrecisionOverride po;
    po.pattern = o.get_string("layers");
    po.where = entry.where;
    auto compute = o.get_string("compute");
    auto dt = [&](const std::string& key) -> std::optional<sdk::DType> {
      auto v = o.get_string(key);
      if (v.empty()) v = compute;
      if (v.empty()) return std::nullopt;
      return sdk::parse_dtype(v);
    };
    po.weight = dt("weight");
    po.gemm_input = dt("gemm_input");
    po.activation = dt("activation");
    po.activation_grad = dt("activation_grad");
    e.overrides.push_back(po);
    ResolvedSection s = section_of("precision.override", {}, o);
    s.array = true;
    e.core_sections.push_back(s);
  }
  auto scaler_host = plugin_section("scaler", "type", "none", ComponentKind::scaler, "scaler", {},
                                    e.scaler_type, e.scaler_options);
  push_component(e.core_sections, "scaler", "type", e.scaler_type, scaler_host, e.scaler_options);
  auto sched = plugin_section("optimizer", "type", "adamw", ComponentKind::optimizer, "optimizer",
                              schedule_schema(), e.optimizer_type, e.optimizer_options);
  e.schedule.schedule = sched.get_string("schedule");
  e.schedule.warmup_steps = sched.get_int("warmup_steps");
  e.schedule.min_lr = sched.get_double("min_lr");
  e.schedule.clip_grad_norm = sched.get_double("clip_grad_norm");
  push_component(e.core_sections, "optimizer", "type", e.optimizer_type, sched,
                 e.optimizer_options);
  auto ck = plugin_section("checkpoint", "format", "native", ComponentKind::checkpoint_format,
                           "checkpoint format", checkpoint_core_schema(), e.checkpoint.format,
                           e.checkpoint_options);
  e.checkpoint.every = ck.get_int("every");
  e.checkpoint.keep = ck.get_int("keep");
  e.checkpoint.init_from = ck.get_string("init_from");
  e.checkpoint.init_layout = parse_weight_layout(ck.get_string("init_layout"));
  if (e.checkpoint.init_layout != WeightLayout::native && e.checkpoint.init_from.empty())
    throw sdk::ConfigError(ck.where("init_layout"), "checkpoint.init_layout",
                           "checkpoint.init_layout = \"" + ck.get_string("init_layout") +
                               "\" but there is no checkpoint.init_from to read in it",
                           "set checkpoint.init_from to the weights file, or remove init_layout");
  if (!e.checkpoint.init_from.empty())
    e.checkpoint.init_from =
        config_path(config, "checkpoint.init_from", e.checkpoint.init_from).string();
  ResolvedSection ck_section = section_of("checkpoint", {{"format", e.checkpoint.format}}, ck);
  show_resolved(ck_section, "init_from", e.checkpoint.init_from);
  e.core_sections.push_back(ck_section);
  if (!e.checkpoint_options.effective().empty())
    e.core_sections.push_back(
        section_of("checkpoint." + e.checkpoint.format, {}, e.checkpoint_options));

  // [ema], [eval]
  auto ema = sdk::Options::resolve("ema", ema_schema(), config.table_options("ema"),
                                   config.location("ema"), {});
  e.ema.decay = ema.get_double("decay");
  e.core_sections.push_back(section_of("ema", {}, ema));
  auto eval = sdk::Options::resolve("eval", eval_schema(), config.table_options("eval"),
                                    config.location("eval"), {});
  e.eval.weights = eval.get_string("weights");
  if (e.eval.weights == "ema" && !e.ema.enabled())
    throw sdk::ConfigError(eval.where("weights"), "eval.weights",
                           "eval.weights = \"ema\" but the run keeps no EMA of the weights",
                           "set [ema] decay = 0.999 (any value in (0, 1]) to keep one, or "
                           "eval.weights = \"master\"");
  e.core_sections.push_back(section_of("eval", {}, eval));
  return e;
}

Components create_components(const Experiment& e, const PluginRegistry& registry) {
  Components c;
  c.backend = registry.create<sdk::DeviceBackend>(
      registry.require(ComponentKind::backend, e.backend_type), e.backend_options);
  c.policy = registry.create<sdk::PrecisionPolicy>(
      registry.require(ComponentKind::policy, e.policy_name), e.policy_options);
  c.scaler = registry.create<sdk::LossScaler>(
      registry.require(ComponentKind::scaler, e.scaler_type), e.scaler_options);
  c.optimizer = registry.create<sdk::Optimizer>(
      registry.require(ComponentKind::optimizer, e.optimizer_type), e.optimizer_options);
  c.checkpoint_format = registry.create<sdk::CheckpointFormat>(
      registry.require(ComponentKind::checkpoint_format, e.checkpoint.format),
      e.checkpoint_options);
  for (const auto& comp : registry.components()) {
    if (comp.info.kind != ComponentKind::checkpoint_format) continue;
    if (comp.info.name == e.checkpoint.format) {
      c.weight_formats.push_back(c.checkpoint_format);
      continue;
    }
    // A format that cannot be built with its defaults just cannot be read from; the configured
    // format still works.
    try {
      auto defaults = sdk::Options::resolve("checkpoint", comp.info.options, {}, {});
      c.weight_formats.push_back(registry.create<sdk::CheckpointFormat>(comp, defaults));
    } catch (const std::exception&) {
    }
  }
  return c;
}

std::string resolved_toml(const Experiment& e) {
  std::vector<ResolvedSection> sections = e.core_sections;
  if (!sections.empty())
    sections.front().comments = {
        "mixtrain resolved config: every effective value, defaults "
        "included. Source: " +
        e.source_name};
  std::string out = render_toml(sections);
  if (!e.plugin_paths.empty()) {
    out += "\n[plugins]\npaths = [";
    for (std::size_t i = 0; i < e.plugin_paths.size(); ++i)
      out += (i ? ", " : "") + sdk::option_value_to_string(e.plugin_paths[i].string());
    out += "]\n";
  }
  return out;
}

}  // namespace mixtrain::core
