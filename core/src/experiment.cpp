#include "mixtrain/core/experiment.h"

#include <algorithm>
#include <map>
#include <set>

#include "mixtrain/core/component_section.h"
#include "mixtrain/core/host_schemas.h"
#include "ops/op_registry.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using sdk::ComponentKind;

namespace {

const std::vector<std::string> kTopLevelTables = {
    "run", "backend", "precision", "scaler", "optimizer", "model", "data", "checkpoint", "plugins"};

std::string string_key(const std::vector<sdk::RawOption>& raw, const std::string& key,
                       const std::string& def, const std::string& table) {
  for (const auto& r : raw)
    if (r.key == key) {
      if (auto* s = std::get_if<std::string>(&r.value)) return *s;
      throw sdk::ConfigError(r.where, table + "." + key, "expected a string");
    }
  return def;
}

sdk::SourceLocation key_location(const std::vector<sdk::RawOption>& raw, const std::string& key,
                                 const sdk::SourceLocation& fallback) {
  for (const auto& r : raw)
    if (r.key == key) return r.where;
  return fallback;
}

ResolvedSection section_of(const std::string& name,
                           const std::vector<std::pair<std::string, sdk::OptionValue>>& head,
                           const sdk::Options& o1, const sdk::Options* o2 = nullptr) {
  ResolvedSection s;
  s.name = name;
  s.values = head;
  for (const auto& v : o1.effective()) s.values.push_back(v);
  if (o2 != nullptr)
    for (const auto& v : o2->effective()) s.values.push_back(v);
  return s;
}

// Sub-tables the host does not read would otherwise be dropped without a word.
void reject_nested(const Config& config, const std::string& table,
                   const std::vector<std::string>& allowed = {}) {
  for (const auto& key : config.nested_keys(table)) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    throw sdk::ConfigError(config.location(table + "." + key), table + "." + key,
                           "unexpected sub-table",
                           "[" + table + "] takes plain key = value entries" +
                               (allowed.empty() ? std::string() : " and " + allowed.front()) +
                               "; write the value directly (no dotted keys or { } tables)");
  }
}

// The selected component's options as a resolved-config section of their own:
// [scaler] type = "dynamic" is followed by [scaler.dynamic] growth_interval = ...
void push_component(std::vector<ResolvedSection>& sections, const std::string& table,
                    const std::string& selector, const std::string& name, const sdk::Options& host,
                    const sdk::Options& component) {
  sections.push_back(section_of(table, {{selector, name}}, host));
  if (!component.effective().empty())
    sections.push_back(section_of(table + "." + name, {}, component));
}

// Every component of `kind` the registry knows, with its schema.
std::vector<ComponentSchema> registered(const PluginRegistry& registry, ComponentKind kind) {
  std::vector<ComponentSchema> out;
  for (const auto& c : registry.components())
    if (c.info.kind == kind) out.push_back({c.info.name, c.info.options});
  return out;
}

// A path the config gives at `key`: relative to the config file's folder when written there, to
// the current folder when given with --set (as every command line does). Absolute in the
// resolved config, so DIR/config.toml reproduces the run from anywhere.
fs::path config_path(const Config& config, const std::string& key, const fs::path& p) {
  if (p.is_absolute()) return p;
  const fs::path base = config.is_override(key) ? fs::current_path() : config.base_dir();
  return fs::absolute(base / p).lexically_normal();
}

// A component's file path option, read from whichever spelling gave it ([data.npy] or flat).
fs::path resolve_path(const Config& config, const ResolvedComponentSection& r,
                      const std::string& key) {
  auto origin = r.origin.find(key);
  return config_path(config, origin == r.origin.end() ? std::string() : origin->second,
                     r.component.get_string(key));
}

// The resolved config shows `key` as the value the run uses (an absolute path, say).
void show_resolved(ResolvedSection& section, const std::string& key, const std::string& value) {
  for (auto& [k, v] : section.values)
    if (k == key) v = value;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
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
  for (const auto& t : {"run", "plugins"}) reject_nested(config, t);
  reject_nested(config, "model", {"layers", "nodes"});
  // The sequential form (`layers`, each reads the one before) or the graph form (`nodes`, each
  // names its inputs); a node's inputs and a reshape's shape are arrays, read below.
  const std::vector<std::string> array_keys = {"inputs", "shape"};
  auto nodes = config.table_array("model.nodes", array_keys);
  auto sequential = config.table_array("model.layers", array_keys);
  const bool graph_form = !nodes.empty();
  if (graph_form && !sequential.empty())
    throw sdk::ConfigError(config.location("model.nodes"), "model.nodes",
                           "the model has both layers and nodes",
                           "write the model as one list: layers (each reads the one before) or "
                           "nodes (each names its inputs)");
  const std::string layer_list = graph_form ? "model.nodes" : "model.layers";
  const auto layers = graph_form ? std::move(nodes) : std::move(sequential);
  for (std::size_t i = 0; i < layers.size(); ++i)
    reject_nested(config, layer_list + "." + std::to_string(i));
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
  ResolvedSection run_section = section_of("run", {}, run);
  show_resolved(run_section, "dir", e.run.dir);
  e.core_sections.push_back(run_section);

  // [data]: the source is a component of the host's own.
  {
    e.data.source = section_selector(config, "data", "source", "synthetic");
    const auto& sources = data_sources();
    if (std::find(sources.begin(), sources.end(), e.data.source) == sources.end()) {
      auto near = sdk::closest_match(e.data.source, sources);
      throw sdk::ConfigError(
          config.location("data.source"), "data.source",
          "unknown data source '" + e.data.source + "'",
          (near.empty() ? "" : "did you mean '" + near + "'? ") + "one of: synthetic, npy, idx");
    }
    ComponentSection section{"data", "source", "data source", e.data.source, data_common_schema(),
                             {},     {}};
    for (const auto& s : sources) section.components.push_back({s, data_source_schema(s)});
    auto r = resolve_component_section(config, section);
    const auto& common = r.host;
    const auto& src = r.component;
    e.data.batch_size = common.get_int("batch_size");
    e.data.eval_batch_size = common.get_int("eval_batch_size");
    if (e.data.eval_batch_size == 0) e.data.eval_batch_size = e.data.batch_size;
    e.data.shuffle = common.get_bool("shuffle");
    e.data.eval_fraction = common.get_double("eval_fraction");
    e.data.classes = static_cast<std::int32_t>(common.get_int("classes"));
    if (e.data.source == "synthetic") {
      e.data.synthetic.kind = src.get_string("kind");
      e.data.synthetic.rows = src.get_int("rows");
      e.data.synthetic.features = src.get_int("features");
      e.data.synthetic.classes = static_cast<std::int32_t>(src.get_int("num_classes"));
      e.data.synthetic.noise = src.get_double("noise");
      e.data.synthetic.seed = e.run.seed;
    } else if (e.data.source == "npy") {
      e.data.features_path = resolve_path(config, r, "features");
      e.data.labels_path = resolve_path(config, r, "labels");
    } else {
      e.data.images_path = resolve_path(config, r, "images");
      e.data.labels_path = resolve_path(config, r, "labels");
    }
    e.core_sections.push_back(section_of("data", {{"source", e.data.source}}, common));
    ResolvedSection s = section_of("data." + e.data.source, {}, src);
    for (auto& [k, v] : s.values)
      if (is_path_option(e.data.source, k)) v = resolve_path(config, r, k).string();
    e.core_sections.push_back(s);
  }

  // [model]
  {
    // layers is read above as an array of tables; an empty one (layers = []) is no table array
    // to TOML, so it is skipped here and reported below as a model without layers.
    auto raw = config.table_options("model", {"layers", "nodes"});
    e.model.where = config.location("model");
    auto model = sdk::Options::resolve("model", model_schema(), raw, e.model.where, {});
    e.model.loss = model.get_string("loss");
    e.model.fuse_epilogues = model.get_bool("fuse_epilogues");
    e.model.graph = graph_form;
    if (layers.empty())
      throw sdk::ConfigError(e.model.where, layer_list, "the model has no layers",
                             "add layers = [ { type = \"linear\", out = 64 }, { type = \"relu\" }, "
                             "{ type = \"linear\", out = 10 } ]");
    e.core_sections.push_back(section_of("model", {}, model));
    const auto& types = layer_types();
    // Unnamed layers are numbered per type, in order (relu1, relu2, ...), skipping names the
    // config gives explicitly, so the names in logs and checkpoints read as a sequence.
    std::set<std::string> explicit_names;
    for (const auto& entry : layers)
      for (const auto& r : entry.options)
        if (r.key == "name")
          if (const auto* n = std::get_if<std::string>(&r.value)) explicit_names.insert(*n);
    std::map<std::string, int> unnamed_count;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const auto& entry = layers[i];
      const std::string table = layer_list + "[" + std::to_string(i) + "]";
      const std::string dotted = layer_list + "." + std::to_string(i);
      std::string type = string_key(entry.options, "type", "", table);
      if (std::find(types.begin(), types.end(), type) == types.end()) {
        auto near = sdk::closest_match(type, types);
        throw sdk::ConfigError(
            key_location(entry.options, "type", entry.where), table + ".type",
            type.empty() ? "missing layer type" : "unknown layer type '" + type + "'",
            (near.empty() ? "" : "did you mean '" + near + "'? ") + "one of: " + join_names(types));
      }
      auto o = sdk::Options::resolve(table, layer_schema(type), entry.options, entry.where);
      LayerSpec l;
      l.type = type;
      l.where = entry.where;
      l.name = o.get_string("name");
      l.options = entry.options;
      l.inputs = config.string_array(dotted + ".inputs");
      l.shape = config.integer_array(dotted + ".shape");
      if (!find_op(type)->takes_shape && !l.shape.empty())
        throw sdk::ConfigError(config.location(dotted + ".shape"), table + ".shape",
                               "unknown key 'shape' for a " + type + " node",
                               "shape belongs to reshape nodes");
      if (!graph_form && !l.inputs.empty())
        throw sdk::ConfigError(config.location(dotted + ".inputs"), table + ".inputs",
                               "a layer of model.layers reads the layer before it",
                               "write the model as [[model.nodes]] to name each node's inputs");
      if (graph_form && l.inputs.empty())
        throw sdk::ConfigError(entry.where, table + ".inputs", "a node needs its inputs",
                               "inputs = [\"input\"] reads the batch; inputs = [\"fc1\"] a node");
      if (graph_form && l.name.empty())
        throw sdk::ConfigError(entry.where, table + ".name", "a node needs a name",
                               "other nodes name it in their inputs: name = \"fc1\"");
      if (type == "reshape" && l.shape.empty())
        throw sdk::ConfigError(entry.where, table + ".shape", "a reshape needs a shape",
                               "shape is per sample, without the batch: shape = [4, 16]");
      while (l.name.empty()) {
        auto candidate = type + std::to_string(++unnamed_count[type]);
        if (explicit_names.count(candidate) == 0) l.name = std::move(candidate);
      }
      e.model.layers.push_back(l);
      ResolvedSection s = section_of(layer_list, {{"type", type}}, o);
      for (auto& [k, v] : s.values)
        if (k == "name") v = l.name;
      auto toml_list = [](const auto& items, auto render) {
        std::string text = "[";
        for (std::size_t k = 0; k < items.size(); ++k) text += (k ? ", " : "") + render(items[k]);
        return text + "]";
      };
      if (graph_form)
        s.raw_values.emplace_back("inputs", toml_list(l.inputs, [](const std::string& v) {
                                    return sdk::option_value_to_string(v);
                                  }));
      if (type == "reshape")
        s.raw_values.emplace_back(
            "shape", toml_list(l.shape, [](std::int64_t v) { return std::to_string(v); }));
      s.array = true;
      e.core_sections.push_back(s);
    }
  }

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
  if (!e.checkpoint.init_from.empty())
    e.checkpoint.init_from =
        config_path(config, "checkpoint.init_from", e.checkpoint.init_from).string();
  ResolvedSection ck_section = section_of("checkpoint", {{"format", e.checkpoint.format}}, ck);
  show_resolved(ck_section, "init_from", e.checkpoint.init_from);
  e.core_sections.push_back(ck_section);
  if (!e.checkpoint_options.effective().empty())
    e.core_sections.push_back(
        section_of("checkpoint." + e.checkpoint.format, {}, e.checkpoint_options));
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
