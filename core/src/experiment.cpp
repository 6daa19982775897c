#include "mixtrain/core/experiment.h"

#include <fnmatch.h>

#include <algorithm>
#include <set>

namespace mixtrain::core {

namespace fs = std::filesystem;
using sdk::ComponentKind;
using sdk::OptionSpec;
using sdk::OptionType;

namespace {

const std::vector<std::string> kTopLevelTables = {"run",     "backend",   "precision",
                                                  "scaler",  "optimizer", "model",
                                                  "data",    "checkpoint", "plugins"};

sdk::OptionSchema run_schema() {
  return {
      OptionSpec::string("name", "mixtrain", "run name, used in logs and the default run folder"),
      OptionSpec::integer("seed", 0, "seed for data, initialisation and shuffling").at_least(0),
      OptionSpec::integer("steps", 1000, "optimizer steps to run (skipped steps count)").at_least(1),
      OptionSpec::integer("log_every", 10, "steps between metric records").at_least(1),
      OptionSpec::integer("eval_every", 0, "steps between evaluations; 0 = at the end only")
          .at_least(0),
      OptionSpec::string("on_nonfinite", "skip",
                         "non-finite loss with no scaler to absorb it: skip the step or stop")
          .one_of({"skip", "stop"}),
      OptionSpec::string("dir", "", "run folder when --run-dir is not given; default runs/<name>"),
      OptionSpec::integer("underflow_every", 100,
                          "steps between per-layer gradient-underflow reports (16/8-bit "
                          "gradient policies); 0 = never")
          .at_least(0),
  };
}

sdk::OptionSchema data_common_schema() {
  return {
      OptionSpec::integer("batch_size", 128, "training rows per step").at_least(1),
      OptionSpec::integer("eval_batch_size", 0, "rows per evaluation batch; 0 = batch_size")
          .at_least(0),
      OptionSpec::boolean("shuffle", true, "reshuffle the training rows every epoch (seeded)"),
      OptionSpec::number("eval_fraction", 0.1, "share of rows held out for evaluation")
          .at_least(0.0)
          .at_most(0.9),
      OptionSpec::integer("classes", 0, "number of classes; 0 = max label + 1").at_least(0),
  };
}

sdk::OptionSchema data_source_schema(const std::string& source) {
  if (source == "synthetic")
    return {
        OptionSpec::string("kind", "clusters", "synthetic task").one_of({"clusters", "teacher"}),
        OptionSpec::integer("rows", 8192, "rows generated (train + eval)").at_least(2),
        OptionSpec::integer("features", 32, "input features").at_least(1),
        OptionSpec::integer("num_classes", 10, "classes generated").at_least(2),
        OptionSpec::number("noise", 1.0, "noise standard deviation").at_least(0.0),
    };
  if (source == "npy")
    return {
        OptionSpec::required("features", OptionType::string, ".npy of float32 [N, D] features"),
        OptionSpec::required("labels", OptionType::string, ".npy of integer [N] labels"),
    };
  return {
      OptionSpec::required("images", OptionType::string, "IDX u8 image file (MNIST format)"),
      OptionSpec::required("labels", OptionType::string, "IDX u8 label file (MNIST format)"),
  };
}

sdk::OptionSchema schedule_schema() {
  return {
      OptionSpec::string("schedule", "constant", "learning-rate schedule")
          .one_of({"constant", "warmup_cosine"}),
      OptionSpec::integer("warmup_steps", 0, "linear warm-up steps (warmup_cosine)").at_least(0),
      OptionSpec::number("min_lr", 0.0, "learning rate at the end of the cosine").at_least(0.0),
      OptionSpec::number("clip_grad_norm", 0.0,
                         "clip the global L2 norm of unscaled gradients; 0 = off")
          .at_least(0.0),
  };
}

sdk::OptionSchema checkpoint_core_schema() {
  return {
      OptionSpec::integer("every", 0, "steps between checkpoints; 0 = only the final one")
          .at_least(0),
      OptionSpec::integer("keep", 3, "how many recent checkpoints to keep").at_least(1),
      OptionSpec::string("init_from", "", "checkpoint whose weights initialise the model"),
  };
}

sdk::OptionSchema layer_schema(const std::string& type) {
  sdk::OptionSchema s = {OptionSpec::string("name", "", "unique layer name")};
  if (type == "linear") {
    s.push_back(OptionSpec::required("out", OptionType::integer, "output features").at_least(1));
    s.push_back(OptionSpec::boolean("bias", true, "add a learned bias"));
  } else if (type == "layernorm") {
    s.push_back(OptionSpec::number("eps", 1e-5, "added to the variance").greater_than(0.0));
  }
  return s;
}

// "" means "not overridden"; the resolved config writes it back, so it must parse again.
sdk::OptionSchema with_empty_choice(sdk::OptionSchema s) {
  for (auto& spec : s)
    if (!spec.choices.empty()) spec.choices.insert(spec.choices.begin(), "");
  return s;
}

sdk::OptionSchema override_schema() {
  std::vector<std::string> dtypes = {"fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"};
  return {
      OptionSpec::required("layers", OptionType::string, "layer name or glob (\"fc*\")"),
      OptionSpec::string("compute", "", "sets weight, gemm_input, activation and activation_grad")
          .one_of(dtypes),
      OptionSpec::string("weight", "", "working weight dtype").one_of(dtypes),
      OptionSpec::string("gemm_input", "", "GEMM operand dtype").one_of(dtypes),
      OptionSpec::string("activation", "", "activation storage dtype").one_of(dtypes),
      OptionSpec::string("activation_grad", "", "activation-gradient dtype").one_of(dtypes),
  };
}

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

// A table shared by the host and a plugin: keys go to whichever declares them; a key neither
// declares is an error with a suggestion from both.
std::pair<sdk::Options, sdk::Options> split_resolve(const std::string& table,
                                                    const std::vector<sdk::RawOption>& raw,
                                                    const sdk::SourceLocation& where,
                                                    const sdk::OptionSchema& host,
                                                    const sdk::OptionSchema& plugin,
                                                    const std::string& type_key) {
  std::vector<std::string> host_names = {type_key}, plugin_names = {type_key}, all;
  for (const auto& s : host) host_names.push_back(s.name), all.push_back(s.name);
  for (const auto& s : plugin) plugin_names.push_back(s.name), all.push_back(s.name);
  sdk::OptionSchema merged = host;
  merged.insert(merged.end(), plugin.begin(), plugin.end());
  // Unknown-key detection against the union, with the right suggestions.
  for (const auto& r : raw) {
    if (r.key == type_key) continue;
    if (std::find(all.begin(), all.end(), r.key) == all.end())
      sdk::Options::resolve(table, merged, {r}, where, {type_key});
  }
  auto h = sdk::Options::resolve(table, host, raw, where, plugin_names);
  auto p = sdk::Options::resolve(table, plugin, raw, where, host_names);
  return {h, p};
}

ResolvedSection section_of(const std::string& name, const std::vector<std::pair<std::string, sdk::OptionValue>>& head,
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
                               (allowed.empty() ? std::string()
                                                : " and " + allowed.front()) +
                               "; write the value directly (no dotted keys or { } tables)");
  }
}

}  // namespace

std::vector<fs::path> config_plugin_paths(const Config& config) {
  std::vector<fs::path> out;
  if (config.has_table("plugins")) {
    auto raw = config.table_options("plugins", {"paths"});
    for (const auto& r : raw)
      throw sdk::ConfigError(r.where, "plugins." + r.key, "unknown key",
                             "[plugins] takes only paths = [\"folder\", ...]");
    for (const auto& p : config.string_array("plugins.paths")) {
      fs::path path(p);
      out.push_back(path.is_absolute() ? path : config.base_dir() / path);
    }
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
      throw sdk::ConfigError(config.location(key), key, "unknown table",
                             (near.empty() ? "" : "did you mean [" + near + "]? ") +
                                 "known tables: " + list);
    }
  }
  e.plugin_paths = config_plugin_paths(config);
  for (const auto& t : {"run", "backend", "scaler", "optimizer", "data", "checkpoint", "plugins"})
    reject_nested(config, t);
  reject_nested(config, "precision", {"override"});
  reject_nested(config, "model", {"layers"});
  for (std::size_t i = 0; i < config.table_array("model.layers").size(); ++i)
    reject_nested(config, "model.layers." + std::to_string(i));
  for (std::size_t i = 0; i < config.table_array("precision.override").size(); ++i)
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
  e.run.underflow_every = run.get_int("underflow_every");
  e.core_sections.push_back(section_of("run", {}, run));

  // [data]
  {
    auto raw = config.table_options("data");
    auto where = config.location("data");
    e.data.source = string_key(raw, "source", "synthetic", "data");
    const std::vector<std::string> sources = {"synthetic", "npy", "idx"};
    if (std::find(sources.begin(), sources.end(), e.data.source) == sources.end()) {
      auto near = sdk::closest_match(e.data.source, sources);
      throw sdk::ConfigError(key_location(raw, "source", where), "data.source",
                             "unknown data source '" + e.data.source + "'",
                             (near.empty() ? "" : "did you mean '" + near + "'? ") +
                                 "one of: synthetic, npy, idx");
    }
    auto [common, src] = split_resolve("data", raw, where, data_common_schema(),
                                       data_source_schema(e.data.source), "source");
    e.data.batch_size = common.get_int("batch_size");
    e.data.eval_batch_size = common.get_int("eval_batch_size");
    if (e.data.eval_batch_size == 0) e.data.eval_batch_size = e.data.batch_size;
    e.data.shuffle = common.get_bool("shuffle");
    e.data.eval_fraction = common.get_double("eval_fraction");
    e.data.classes = static_cast<std::int32_t>(common.get_int("classes"));
    auto resolve_path = [&](const std::string& key) {
      fs::path p(src.get_string(key));
      return p.is_absolute() ? p : config.base_dir() / p;
    };
    if (e.data.source == "synthetic") {
      e.data.synthetic.kind = src.get_string("kind");
      e.data.synthetic.rows = src.get_int("rows");
      e.data.synthetic.features = src.get_int("features");
      e.data.synthetic.classes = static_cast<std::int32_t>(src.get_int("num_classes"));
      e.data.synthetic.noise = src.get_double("noise");
      e.data.synthetic.seed = e.run.seed;
    } else if (e.data.source == "npy") {
      e.data.features_path = resolve_path("features");
      e.data.labels_path = resolve_path("labels");
    } else {
      e.data.images_path = resolve_path("images");
      e.data.labels_path = resolve_path("labels");
    }
    e.core_sections.push_back(section_of("data", {{"source", e.data.source}}, common, &src));
  }

  // [model]
  {
    auto raw = config.table_options("model");
    e.model.where = config.location("model");
    auto model = sdk::Options::resolve(
        "model",
        {OptionSpec::string("loss", "softmax_cross_entropy", "training loss")
             .one_of({"softmax_cross_entropy"}),
         OptionSpec::boolean("fuse_epilogues", true,
                             "run each relu/gelu that follows a linear layer as that GEMM's "
                             "epilogue (one rounding, one pass less)")},
        raw, e.model.where, {});
    e.model.loss = model.get_string("loss");
    e.model.fuse_epilogues = model.get_bool("fuse_epilogues");
    auto layers = config.table_array("model.layers");
    if (layers.empty())
      throw sdk::ConfigError(e.model.where, "model.layers", "the model has no layers",
                             "add layers = [ { type = \"linear\", out = 64 }, { type = \"relu\" }, "
                             "{ type = \"linear\", out = 10 } ]");
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const auto& entry = layers[i];
      const std::string table = "model.layers[" + std::to_string(i) + "]";
      std::string type = string_key(entry.options, "type", "", table);
      const std::vector<std::string> types = {"linear", "relu", "gelu", "layernorm"};
      if (std::find(types.begin(), types.end(), type) == types.end()) {
        auto near = sdk::closest_match(type, types);
        throw sdk::ConfigError(key_location(entry.options, "type", entry.where), table + ".type",
                               type.empty() ? "missing layer type"
                                            : "unknown layer type '" + type + "'",
                               (near.empty() ? "" : "did you mean '" + near + "'? ") +
                                   "one of: linear, relu, gelu, layernorm");
      }
      auto o = sdk::Options::resolve(table, layer_schema(type), entry.options, entry.where);
      LayerSpec l;
      l.type = type;
      l.where = entry.where;
      l.name = o.get_string("name");
      if (type == "linear") {
        l.out = o.get_int("out");
        l.bias = o.get_bool("bias");
      }
      if (type == "layernorm") l.eps = o.get_double("eps");
      if (l.name.empty()) l.name = type + std::to_string(i);
      e.model.layers.push_back(l);
      ResolvedSection s = section_of("model.layers", {{"type", type}}, o);
      for (auto& [k, v] : s.values)
        if (k == "name") v = l.name;
      s.array = true;
      e.core_sections.push_back(s);
    }
    e.core_sections.insert(e.core_sections.end() - static_cast<std::ptrdiff_t>(layers.size()),
                           section_of("model", {}, model));
  }

  // [backend], [precision], [scaler], [optimizer], [checkpoint]: plugin-backed tables.
  auto plugin_table = [&](const std::string& table, const std::string& type_key,
                          const std::string& def, ComponentKind kind,
                          const sdk::OptionSchema& host_schema, std::string& name_out,
                          sdk::Options& plugin_out, std::vector<std::string> skip = {}) {
    auto raw = config.table_options(table, skip);
    auto where = config.location(table);
    name_out = string_key(raw, type_key, def, table);
    const auto& comp =
        registry.require(kind, name_out, key_location(raw, type_key, where).to_string() + ": " +
                                             table + "." + type_key);
    auto [host, plugin] =
        split_resolve(table, raw, where, host_schema, comp.info.options, type_key);
    plugin_out = plugin;
    return host;
  };
  plugin_table("backend", "type", "cpu", ComponentKind::backend, {},
                                   e.backend_type, e.backend_options);
  e.core_sections.push_back(section_of("backend", {{"type", e.backend_type}}, e.backend_options));
  plugin_table("precision", "policy", "fp32", ComponentKind::policy, {},
                                     e.policy_name, e.policy_options, {"override"});
  e.core_sections.push_back(
      section_of("precision", {{"policy", e.policy_name}}, e.policy_options));
  for (const auto& entry : config.table_array("precision.override")) {
    auto o = sdk::Options::resolve("precision.override", with_empty_choice(override_schema()),
                                   entry.options, entry.where, {});
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
  plugin_table("scaler", "type", "none", ComponentKind::scaler, {},
                                  e.scaler_type, e.scaler_options);
  e.core_sections.push_back(section_of("scaler", {{"type", e.scaler_type}}, e.scaler_options));
  auto sched = plugin_table("optimizer", "type", "adamw", ComponentKind::optimizer,
                            schedule_schema(), e.optimizer_type, e.optimizer_options);
  e.schedule.schedule = sched.get_string("schedule");
  e.schedule.warmup_steps = sched.get_int("warmup_steps");
  e.schedule.min_lr = sched.get_double("min_lr");
  e.schedule.clip_grad_norm = sched.get_double("clip_grad_norm");
  e.core_sections.push_back(
      section_of("optimizer", {{"type", e.optimizer_type}}, e.optimizer_options, &sched));
  auto ck = plugin_table("checkpoint", "format", "native", ComponentKind::checkpoint_format,
                         checkpoint_core_schema(), e.checkpoint.format, e.checkpoint_options);
  e.checkpoint.every = ck.get_int("every");
  e.checkpoint.keep = ck.get_int("keep");
  e.checkpoint.init_from = ck.get_string("init_from");
  if (!e.checkpoint.init_from.empty()) {
    fs::path p(e.checkpoint.init_from);
    e.checkpoint.init_from = (p.is_absolute() ? p : config.base_dir() / p).string();
  }
  e.core_sections.push_back(
      section_of("checkpoint", {{"format", e.checkpoint.format}}, ck, &e.checkpoint_options));
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
    sections.front().comments = {"mixtrain resolved config: every effective value, defaults "
                                 "included. Source: " + e.source_name};
  std::string out = render_toml(sections);
  if (!e.plugin_paths.empty()) {
    out += "\n[plugins]\npaths = [";
    for (std::size_t i = 0; i < e.plugin_paths.size(); ++i)
      out += (i ? ", " : "") + sdk::option_value_to_string(e.plugin_paths[i].string());
    out += "]\n";
  }
  return out;
}

void plan_precision(Model& model, sdk::PrecisionPolicy& policy,
                    const sdk::BackendCapabilities& capabilities,
                    const std::vector<PrecisionOverride>& overrides) {
  policy.adapt_to(capabilities);
  for (auto& layer : model.layers()) layer->set_precision(policy.plan(layer->description()));
  for (const auto& o : overrides) {
    bool matched = false;
    for (auto& layer : model.layers()) {
      if (fnmatch(o.pattern.c_str(), layer->name().c_str(), 0) != 0) continue;
      matched = true;
      auto p = layer->precision();
      if (o.weight) p.weight = *o.weight;
      if (o.gemm_input) p.gemm_input = *o.gemm_input;
      if (o.activation) p.activation = *o.activation;
      if (o.activation_grad) p.activation_grad = *o.activation_grad;
      layer->set_precision(p);
    }
    if (!matched) {
      std::string names;
      for (const auto& l : model.layers()) names += (names.empty() ? "" : ", ") + l->name();
      throw sdk::ConfigError(o.where, "precision.override.layers",
                             "'" + o.pattern + "' matches no layer",
                             "layers in this model: " + names);
    }
  }
  // Scaled (FP8) operands only where the final plan still computes in FP8: an override that
  // keeps a layer in bf16 takes it out of the policy's scaling.
  if (policy.uses_scaled_operands())
    for (auto& layer : model.layers())
      if (layer->has_gemm() && sdk::is_fp8(layer->precision().gemm_input))
        layer->set_operand_scaling(&policy);
}

}  // namespace mixtrain::core
