#include "mixtrain/core/config/experiment.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <map>
#include <set>
#include <string_view>

#include "config/data_section.h"
#include "config/lora_section.h"
#include "config/misplaced_key.h"
#include "config/model_section.h"
#include "config/reading.h"
#include "config/schedule_section.h"
#include "distributed/launch.h"
#include "graph/ops/op_registry.h"
#include "mixtrain/core/config/component_section.h"
#include "mixtrain/core/config/config_errors.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/config/section_catalog.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/graph/quantized_weight.h"
#include "mixtrain/core/runs/summary.h"
#include "mixtrain/core/train/lr_schedule.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using sdk::ComponentKind;

namespace {

// Every component of `kind` the registry knows, with its schema.
std::vector<ComponentSchema> registered(const PluginRegistry& registry, ComponentKind kind) {
  std::vector<ComponentSchema> out;
  for (const auto& c : registry.components())
    if (c.info.kind == kind) out.push_back({c.info.name, c.info.options});
  return out;
}

// [precision.escalate]: present (from the file, a --merge or a --set) means on.
void read_escalation(const Config& config, Experiment& e) {
  if (!config.has_table("precision.escalate")) {
    if (config.is_array("precision.escalate"))
      throw sdk::ConfigError(config.location("precision.escalate"), "precision.escalate",
                             "expected a table", "write [precision.escalate] (present means on)");
    return;
  }
  reject_nested(config, "precision.escalate");
  auto o = sdk::Options::resolve("precision.escalate", escalate_schema(),
                                 config.table_options("precision.escalate"),
                                 config.location("precision.escalate"), {});
  e.escalate.enabled = true;
  e.escalate.after = o.get_int("after");
  e.escalate.window = o.get_int("window");
  e.escalate.deescalate_after = o.get_int("deescalate_after");
  if (e.escalate.window < e.escalate.after)
    o.fail("window",
           "is " + std::to_string(e.escalate.window) +
               ", shorter than after = " + std::to_string(e.escalate.after) +
               ": a step is blamed at most once, so no op could ever be promoted",
           "set window to at least `after` steps (200 is usual)");
  e.core_sections.push_back(section_of("precision.escalate", {}, o));
}

// An evaluation number a run can watch: eval_loss, eval_accuracy, or the top-k accuracy that
// [eval] top_k computes. `o` and `key` locate the error.
void check_metric(const sdk::Options& o, const std::string& key, const std::string& metric,
                  const Experiment& e) {
  std::vector<std::string> known = {"eval_loss", "eval_accuracy"};
  if (e.eval.top_k > 0) known.push_back(top_k_accuracy_key(e.eval.top_k));
  if (std::find(known.begin(), known.end(), metric) != known.end()) return;
  const bool top_k = metric.rfind("eval_top", 0) == 0;
  auto near = sdk::closest_match(metric, known);
  if (std::find(known.begin(), known.end(), "eval_" + metric) != known.end())
    near = "eval_" + metric;  // "loss", "accuracy": the evaluation's names carry the prefix
  o.fail(key, "'" + metric + "' is not an evaluation number of this run",
         (top_k ? "top-k accuracy needs [eval] top_k = k (eval_top5_accuracy: top_k = 5); "
                : std::string()) +
             (near.empty() ? "" : "did you mean '" + near + "'? ") +
             "one of: " + join_names(known));
}

// run.metrics: a list of sink names (a single string is a list of one). Each entry is checked
// against the schema's choices at its own location; jsonl comes first and always, since compare
// and resume read metrics.jsonl.
std::vector<MetricsSinkKind> read_metrics_sinks(const Config& config) {
  sdk::OptionSchema spec;
  for (const auto& s : run_schema())
    if (s.name == "metrics") spec.push_back(s);
  std::vector<MetricsSinkKind> out = {MetricsSinkKind::jsonl};
  const auto names = config.string_array("run.metrics");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto where = config.is_array("run.metrics")
                           ? config.location("run.metrics." + std::to_string(i))
                           : config.location("run.metrics");
    const auto entry =
        sdk::Options::resolve("run", spec, {{"metrics", names[i], where}}, where, {});
    const MetricsSinkKind sink = parse_choice(entry, "metrics", kMetricsSinks);
    if (std::find(out.begin(), out.end(), sink) == out.end()) out.push_back(sink);
  }
  return out;
}

void read_early_stopping(const sdk::Options& run, Experiment& e) {
  const auto& r = e.run;
  if (r.early_stopping_patience == 0) {
    const auto schema = run_schema();
    for (const auto& key : {"early_stopping_metric", "early_stopping_min_delta"})
      if (set_away_from_default(run, schema, key))
        e.unused_keys.push_back("run." + std::string(key) + " (" + run.where(key).to_string() +
                                ") is not read: early_stopping_patience = 0 (off)");
    return;
  }
  check_metric(run, "early_stopping_metric", r.early_stopping_metric, e);
  if (r.eval_every == 0)
    run.fail("early_stopping_patience",
             "is " + std::to_string(r.early_stopping_patience) +
                 " but run.eval_every = 0 evaluates only at the end",
             "set run.eval_every to the steps between the evaluations patience counts");
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

namespace {

void check_top_level_tables(const Config& config) {
  const auto& known = config_top_level_tables();
  for (const auto& key : config.top_level_keys()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    // `steps = 10` above the first [table] header (or `--set steps=10`) is a key, not a table:
    // parse_experiment names the table it belongs in (misplaced_key.h).
    if (!config.has_table(key) && !config.is_array(key))
      throw sdk::ConfigError(config.location(key), key, "unknown key",
                             "it is outside any table (written above the file's first [table] "
                             "header, or --set without a table); every key lives in a table");
    // An array named like a section's list (`layers = [...]` pasted above [model]) is that key
    // outside its table, not a misspelt table: named as a key, the owner hint says where it goes.
    const bool a_known_table = !sdk::closest_match(key, known).empty() || config.has_table(key);
    if (config.is_array(key) && !a_known_table)
      throw sdk::ConfigError(config.location(key), key, "unknown key",
                             "it is outside any table (written above the file's first [table] "
                             "header, as [[" +
                                 key +
                                 "]], or --set without a table); every key "
                                 "lives in a table");
    auto near = sdk::closest_match(key, known);
    throw sdk::ConfigError(config.location(key), key, "unknown table",
                           (near.empty() ? "" : "did you mean [" + near + "]? ") +
                               "known tables: " + join_names(known));
  }
}

// [run]; the options come back for the checks that need later tables (early stopping).
sdk::Options read_run(const Config& config, Experiment& e) {
  auto run = sdk::Options::resolve("run", run_schema(), config.table_options("run", {"metrics"}),
                                   config.location("run"), {});
  e.run.name = run.get_string("name");
  // The default folder is runs/<name>: a name must stay below runs/ ("sweep/lr1" groups runs; "",
  // "..", "../x" or "/x" would put the run elsewhere or make runs/ itself the run).
  const auto plain_parts = [](const std::string& name) {
    if (name.empty() || name.front() == '/' || name.find('\0') != std::string::npos) return false;
    for (std::size_t at = 0; at <= name.size();) {
      const std::size_t end = std::min(name.find('/', at), name.size());
      const std::string_view part(name.data() + at, end - at);
      if (part.empty() || part == "." || part == "..") return false;
      at = end + 1;
    }
    return true;
  };
  if (!plain_parts(e.run.name))
    run.fail("name",
             "is \"" + e.run.name +
                 "\": the run's name becomes its folder under runs/, so it must be a relative "
                 "path of plain folder names (not empty, no \".\" or \"..\" parts, no leading "
                 "\"/\")",
             "put the run elsewhere with run.dir or --run-dir, and give name plain words");
  e.run.seed = static_cast<std::uint64_t>(run.get_int("seed"));
  e.run.steps = run.get_int("steps");
  e.run.log_every = run.get_int("log_every");
  e.run.eval_every = run.get_int("eval_every");
  e.run.on_nonfinite = parse_choice(run, "on_nonfinite", kNonfiniteActions);
  e.run.dir = run.get_string("dir");
  if (!e.run.dir.empty()) e.run.dir = config_path(config, "run.dir", e.run.dir).string();
  e.run.underflow_every = run.get_int("underflow_every");
  e.run.accumulate = run.get_int("accumulate");
  if (run.was_set("step_graphs")) e.run.step_graphs = run.get_bool("step_graphs");
  e.run.gated_update = run.get_bool("gated_update");
  e.run.stretch_schedule = run.get_bool("stretch_schedule");
  e.run.early_stopping_patience = run.get_int("early_stopping_patience");
  e.run.early_stopping_metric = run.get_string("early_stopping_metric");
  e.run.early_stopping_min_delta = run.get_double("early_stopping_min_delta");
  e.run.metrics = read_metrics_sinks(config);
  ResolvedSection run_section = section_of("run", {}, run);
  show_resolved(run_section, "dir", e.run.dir);
  // step_graphs unset means "where the backend records them": a resume on another backend decides
  // again, so the resolved config leaves it unset.
  if (!run.was_set("step_graphs")) {
    std::erase_if(run_section.values, [](const auto& v) { return v.first == "step_graphs"; });
    run_section.comments.push_back(
        "step_graphs unset: on where the backend records step graphs (CUDA) and the step is "
        "static, else off");
  }
  // metrics is a list: the resolved config writes it as one.
  std::erase_if(run_section.values, [](const auto& v) { return v.first == "metrics"; });
  std::string sinks = "[";
  for (std::size_t i = 0; i < e.run.metrics.size(); ++i)
    sinks += (i ? ", " : "") +
             sdk::option_value_to_string(std::string(choice_name(e.run.metrics[i], kMetricsSinks)));
  run_section.raw_values.emplace_back("metrics", sinks + "]");
  e.core_sections.push_back(run_section);
  return run;
}

// What a plugin-backed section ([backend], [precision], ...) declares beside its plugin's keys.
struct PluginSectionSpec {
  std::string table, selector, fallback;
  ComponentKind kind;
  std::string noun;
  sdk::OptionSchema host = {};
  std::vector<std::string> host_tables = {}, host_lists = {};
  // Read only for training: a model-only command passes over a table of an unknown component.
  bool training_only = false;
};

// Reads plugin-backed sections: the plugin named by the selector must be registered, and its
// options are validated against its schema, the host's keys against `host`.
struct PluginSections {
  const Config& config;
  const PluginRegistry& registry;
  ExperimentUse use;
  std::vector<std::string>& warnings;  // Experiment::config_warnings
  std::vector<std::string>& unused;    // Experiment::unused_keys

  // The host's options; the plugin's name and options go to name_out and plugin_out.
  sdk::Options read(PluginSectionSpec spec, std::string& name_out, sdk::Options& plugin_out) const {
    auto read_elsewhere = spec.host_lists;
    for (auto& sub : host_tables_given_as_arrays(config, spec.table, spec.host_tables))
      read_elsewhere.push_back(std::move(sub));
    name_out = section_selector(config, spec.table, spec.selector, spec.fallback, read_elsewhere);
    try {
      registry.require(spec.kind, name_out,
                       config.location(spec.table + "." + spec.selector).to_string() + ": " +
                           spec.table + "." + spec.selector);
    } catch (const sdk::PluginError& e) {
      if (!spec.training_only || use != ExperimentUse::model_only) throw;
      // The run trained with a plugin this command does not load. The command never uses the
      // section, so a built-in choice does as well, and is simpler than finding the plugin.
      throw sdk::PluginError(
          e.what(), "this command does not use [" + spec.table + "]: `--set " + spec.table + "." +
                        spec.selector + "=" + spec.fallback +
                        "` (built in) works here. To load the plugin instead: " + e.hint());
    }
    ComponentSection section{spec.table,
                             spec.selector,
                             spec.noun,
                             name_out,
                             std::move(spec.host),
                             registered(registry, spec.kind),
                             std::move(spec.host_tables),
                             std::move(spec.host_lists),
                             spec.training_only && use == ExperimentUse::model_only};
    auto r = resolve_component_section(config, section);
    warnings.insert(warnings.end(), r.warnings.begin(), r.warnings.end());
    // A command that never uses the section has no use for what its other tables leave unread.
    if (!section.unknown_tables_are_warnings)
      unused.insert(unused.end(), r.unused.begin(), r.unused.end());
    plugin_out = r.component;
    return r.host;
  }
};

void read_backend(const PluginSections& plugins, Experiment& e) {
  auto host = plugins.read({"backend", "type", "cpu", ComponentKind::backend, "backend"},
                           e.backend_type, e.backend_options);
  push_component(e.core_sections, "backend", "type", e.backend_type, host, e.backend_options);
  e.backend_where = plugins.config.location("backend.type");
}

PrecisionOverride read_override(const TableEntry& entry, std::vector<ResolvedSection>& sections) {
  auto o = sdk::Options::resolve("precision.override", precision_override_schema(), entry.options,
                                 entry.where, {});
  PrecisionOverride po;
  po.pattern = o.get_string("layers");
  po.where = entry.where;
  po.layers_where = o.where("layers");
  const auto compute = o.get_string("compute");
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
  ResolvedSection s = section_of("precision.override", {}, o);
  s.array = true;
  sections.push_back(s);
  return po;
}

// [precision], its [[precision.override]] entries and [precision.escalate].
void read_precision(const PluginSections& plugins, const std::vector<TableEntry>& overrides,
                    Experiment& e) {
  auto host = plugins.read({"precision",
                            "policy",
                            "fp32",
                            ComponentKind::policy,
                            "policy",
                            {},
                            {"override", "escalate"}},
                           e.policy_name, e.policy_options);
  push_component(e.core_sections, "precision", "policy", e.policy_name, host, e.policy_options);
  e.policy_where = plugins.config.location("precision.policy");
  for (const auto& entry : overrides) e.overrides.push_back(read_override(entry, e.core_sections));
  read_escalation(plugins.config, e);
}

void read_scaler(const PluginSections& plugins, Experiment& e) {
  PluginSectionSpec spec{"scaler", "type", "none", ComponentKind::scaler, "scaler"};
  spec.training_only = true;
  auto host = plugins.read(std::move(spec), e.scaler_type, e.scaler_options);
  push_component(e.core_sections, "scaler", "type", e.scaler_type, host, e.scaler_options);
  e.scaler_where = plugins.config.location("scaler.type");
}

// [optimizer]: the plugin's keys and the host's schedule keys.
void read_optimizer(const PluginSections& plugins, Experiment& e) {
  auto sched = plugins.read({"optimizer",
                             "type",
                             "adamw",
                             ComponentKind::optimizer,
                             "optimizer",
                             schedule_schema(),
                             {},
                             {"milestones"},
                             /*training_only=*/true},
                            e.optimizer_type, e.optimizer_options);
  read_schedule(plugins.config, sched, e);
  e.optimizer_where = plugins.config.location("optimizer.type");
  push_component(e.core_sections, "optimizer", "type", e.optimizer_type, sched,
                 e.optimizer_options);
  // milestones is a list: the resolved config writes it as one, never as its text in quotes.
  for (auto& section : e.core_sections)
    if (section.name == "optimizer") {
      std::erase_if(section.values, [](const auto& v) { return v.first == "milestones"; });
      std::string list = "[";
      for (std::size_t i = 0; i < e.schedule.milestones.size(); ++i)
        list += (i ? ", " : "") + std::to_string(e.schedule.milestones[i]);
      section.raw_values.emplace_back("milestones", list + "]");
    }
}

// [model] from_pretrained's weights are the run's initial ones: checkpoint.init_from in the gpt2
// layout, so neither key may say otherwise.
void take_pretrained_weights(const sdk::Options& ck, Experiment& e) {
  const auto& pretrained = e.from_pretrained;
  const std::string folder =
      "model.from_pretrained = " + sdk::option_value_to_string(pretrained.folder.string()) + " (" +
      pretrained.where.to_string() + ")";
  if (!e.checkpoint.init_from.empty())
    ck.fail("init_from",
            "init_from = " + sdk::option_value_to_string(e.checkpoint.init_from) + " and " +
                folder + " both name the initial weights",
            "keep one: from_pretrained starts from " + pretrained.weights.string());
  if (e.checkpoint.init_layout != WeightLayout::gpt2 && ck.was_set("init_layout"))
    ck.fail("init_layout",
            "init_layout = " + sdk::option_value_to_string(ck.get_string("init_layout")) +
                " contradicts " + folder + ", whose weights are in the gpt2 layout",
            "remove init_layout: from_pretrained reads " + pretrained.weights.string() +
                " in the gpt2 layout");
  e.checkpoint.init_from = pretrained.weights.string();
  e.checkpoint.init_layout = WeightLayout::gpt2;
}

// [checkpoint]; the host's options come back for keep_best, checked once [eval] is read.
sdk::Options read_checkpoint(const PluginSections& plugins, Experiment& e) {
  const Config& config = plugins.config;
  auto ck = plugins.read({"checkpoint", "format", "native", ComponentKind::checkpoint_format,
                          "checkpoint format", checkpoint_core_schema()},
                         e.checkpoint.format, e.checkpoint_options);
  e.checkpoint.every = ck.get_int("every");
  e.checkpoint.write_final = ck.get_bool("final");
  e.checkpoint.keep = ck.get_int("keep");
  e.checkpoint.init_from = ck.get_string("init_from");
  e.checkpoint.init_from_where = ck.where("init_from");
  e.checkpoint.init_layout = parse_weight_layout(ck.get_string("init_layout"));
  e.checkpoint.keep_best = ck.get_string("keep_best");
  if (e.from_pretrained.enabled()) take_pretrained_weights(ck, e);
  if (e.checkpoint.init_layout != WeightLayout::native && e.checkpoint.init_from.empty())
    throw sdk::ConfigError(ck.where("init_layout"), "checkpoint.init_layout",
                           "checkpoint.init_layout = \"" + ck.get_string("init_layout") +
                               "\" but there is no checkpoint.init_from to read in it",
                           "set checkpoint.init_from to the weights file, or remove init_layout");
  if (!e.checkpoint.init_from.empty() && !e.from_pretrained.enabled())
    e.checkpoint.init_from =
        config_path(config, "checkpoint.init_from", e.checkpoint.init_from).string();
  ResolvedSection ck_section = section_of("checkpoint", {{"format", e.checkpoint.format}}, ck);
  show_resolved(ck_section, "init_from", e.checkpoint.init_from);
  if (e.from_pretrained.enabled()) {
    show_resolved(ck_section, "init_layout", "gpt2");
    ck_section.comments.push_back("init_from: the weights of model.from_pretrained (" +
                                  e.from_pretrained.where.to_string() + ")");
  }
  e.core_sections.push_back(ck_section);
  if (!e.checkpoint_options.effective().empty())
    e.core_sections.push_back(
        section_of("checkpoint." + e.checkpoint.format, {}, e.checkpoint_options));
  return ck;
}

// No [distributed] table but an MPI launch: the communicator the backend goes with, at its
// defaults (the resolved config then names it, so DIR/config.toml relaunches the same way).
sdk::Options distributed_from_launch(const PluginRegistry& registry, const MpiLaunch& launch,
                                     Experiment& e) {
  e.distributed.type = e.backend_type == "cuda" ? "nccl" : "mpi";
  e.distributed.from_launch = true;
  const auto& c = registry.require(
      ComponentKind::communicator, e.distributed.type,
      "an MPI launch of " + std::to_string(launch.world_size) + " ranks (no [distributed])");
  e.communicator_options =
      sdk::Options::resolve("distributed." + e.distributed.type, c.info.options, {}, {});
  return sdk::Options::resolve("distributed", distributed_schema(), {}, {});
}

// [distributed]: from the table, or from an MPI launch of a config without one.
void read_distributed(const PluginSections& plugins, Experiment& e) {
  const Config& config = plugins.config;
  const MpiLaunch launch = detect_mpi_launch();
  const bool table = config.has_table("distributed");
  if (!table && !(launch.detected && launch.world_size > 1)) return;
  sdk::Options host;
  if (table) {
    host = plugins.read({"distributed", "type", "mpi", ComponentKind::communicator, "communicator",
                         distributed_schema()},
                        e.distributed.type, e.communicator_options);
    e.distributed.where = config.location("distributed.type");
    // A --set's location has no line; only a type given nowhere falls back to the table's.
    if (e.distributed.where.line == 0 && !config.is_override("distributed.type"))
      e.distributed.where = config.location("distributed");
  } else {
    host = distributed_from_launch(plugins.registry, launch, e);
  }
  e.distributed.shard_optimizer = host.get_bool("shard_optimizer");
  e.distributed.bucket_mb = host.get_double("bucket_mb");
  e.distributed.overlap = host.get_bool("overlap");
  e.distributed.batch_norm = parse_choice(host, "batch_norm", kBatchNormStats);
  if (e.distributed.from_launch) {
    // Chosen by this launch, not by the config: the resolved config records it as a comment, so
    // that a resume of the run follows its own launch (one process, or mpirun with any N).
    if (!e.core_sections.empty())
      e.core_sections.front().comments.push_back(
          "[distributed] type = \"" + e.distributed.type + "\" came from the launch (" +
          std::to_string(launch.world_size) +
          " ranks), not from the config: not written, so a resume follows its own launch");
    return;
  }
  push_component(e.core_sections, "distributed", "type", e.distributed.type, host,
                 e.communicator_options);
}

void read_ema(const Config& config, Experiment& e) {
  auto ema = sdk::Options::resolve("ema", ema_schema(), config.table_options("ema"),
                                   config.location("ema"), {});
  e.ema.decay = ema.get_double("decay");
  e.core_sections.push_back(section_of("ema", {}, ema));
}

// [train]: which parameters train (graph/freezing.h), lists of patterns that the model's plan
// resolves against its parameters. Each pattern keeps its own location, which a pattern that
// matches nothing is reported at.
void read_train(const Config& config, Experiment& e) {
  const std::vector<std::string> lists = {"trainable", "frozen"};
  const auto train = sdk::Options::resolve(
      "train", train_schema(), config.table_options("train", lists), config.location("train"), {});
  const std::string format = train.get_string("frozen_format");
  e.model.freeze.format = format == "nf4"         ? FrozenFormat::nf4
                          : format == "fp8-block" ? FrozenFormat::fp8_block
                          : format == "mxfp8"     ? FrozenFormat::mxfp8
                                                  : FrozenFormat::compute;
  e.model.freeze.block = train.get_int("frozen_block_size");
  e.model.freeze.format_where = train.where("frozen_format");
  // A block size given for a format whose blocks are fixed would be silently ignored. (The default
  // is let through: a run's resolved config.toml writes every [train] value.)
  if (train.was_set("frozen_block_size") && e.model.freeze.block != sdk::kNf4BlockSize &&
      e.model.freeze.format != FrozenFormat::nf4)
    throw sdk::ConfigError(
        train.where("frozen_block_size"), "train.frozen_block_size",
        "sets NF4's block size, but train.frozen_format = \"" + format + "\"" +
            (format == "compute"
                 ? std::string(" stores no block format")
                 : " has fixed blocks (" + sdk::describe(base_layout(e.model.freeze.format)) + ")"),
        "remove frozen_block_size, or set frozen_format = \"nf4\"");
  ResolvedSection section = section_of("train", {}, train);
  std::erase_if(section.values, [&](const auto& kv) {
    return std::find(lists.begin(), lists.end(), kv.first) != lists.end();
  });
  for (const auto& list : lists) {
    const std::string key = "train." + list;
    const auto patterns = config.string_array(key);
    auto& out = list == "trainable" ? e.model.freeze.trainable : e.model.freeze.frozen;
    std::string text = "[";
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      const bool array = config.is_array(key);
      const auto where =
          array ? config.location(key + "." + std::to_string(i)) : config.location(key);
      if (patterns[i].empty())
        throw sdk::ConfigError(where, key, "an empty pattern names no parameter",
                               "write a parameter name (\"fc1.weight\"), a node name (\"fc1\") "
                               "or a glob (\"h.*.attn.*\")");
      out.push_back({patterns[i], where, array ? key + "[" + std::to_string(i) + "]" : key});
      text += (i ? ", " : "") + sdk::option_value_to_string(patterns[i]);
    }
    section.raw_values.emplace_back(list, text + "]");
  }
  e.core_sections.push_back(section);
}

// [eval], after [ema]: EMA weights need an EMA.
void read_eval(const Config& config, Experiment& e) {
  auto eval = sdk::Options::resolve("eval", eval_schema(), config.table_options("eval"),
                                    config.location("eval"), {});
  e.eval.weights = parse_choice(eval, "weights", kEvalWeights);
  e.eval.top_k = eval.get_int("top_k");
  e.eval.top_k_where = eval.where("top_k");
  if (e.eval.top_k == 1)
    eval.fail("top_k", "is 1: top-1 accuracy is eval_accuracy, reported always",
              "set top_k = 5 (or any k >= 2) for top-k accuracy, or 0 for none");
  if (e.eval.weights == EvalWeights::ema && !e.ema.enabled())
    throw sdk::ConfigError(eval.where("weights"), "eval.weights",
                           "eval.weights = \"ema\" but the run keeps no EMA of the weights",
                           "set [ema] decay = 0.999 (any value in (0, 1]) to keep one, or "
                           "eval.weights = \"master\"");
  e.core_sections.push_back(section_of("eval", {}, eval));
}

// checkpoint.keep_best names an evaluation number of this run, and evaluations to compare.
void check_keep_best(const sdk::Options& ck, const Experiment& e) {
  if (e.checkpoint.keep_best.empty()) return;
  check_metric(ck, "keep_best", e.checkpoint.keep_best, e);
  if (e.run.eval_every == 0)
    ck.fail(
        "keep_best",
        "is \"" + e.checkpoint.keep_best + "\" but run.eval_every = 0 evaluates only at the end",
        "set run.eval_every to the steps between the evaluations it compares");
}

// Reads a config's sections one after another, each even when an earlier one was refused unless
// it reads what that one sets (its `needs`): the config's independent mistakes are all reported,
// and none that only follows from another (config/config_errors.h).
class SectionReads {
 public:
  template <class Read>
  void read(const char* section, std::initializer_list<const char*> needs, Read&& read) {
    for (const char* need : needs)
      if (failed_.contains(need)) {
        failed_.insert(section);
        return;
      }
    try {
      read();
    } catch (const sdk::ConfigError& e) {
      errors_.push_back(e);
      failed_.insert(section);
    } catch (const sdk::UserError& e) {
      // A component named that no plugin offers (a PluginError): a mistake of the section too.
      others_.push_back(std::current_exception());
      other_texts_.push_back(e.full_message());
      failed_.insert(section);
    }
  }
  void throw_errors() const {
    if (errors_.size() + others_.size() == 1) {
      if (!errors_.empty()) throw errors_.front();
      std::rethrow_exception(others_.front());
    }
    if (!errors_.empty()) throw ConfigErrors(errors_, other_texts_);
    if (!others_.empty()) std::rethrow_exception(others_.front());
  }

 private:
  std::vector<sdk::ConfigError> errors_;
  std::vector<std::exception_ptr> others_;
  std::vector<std::string> other_texts_;  // their full messages, after the config errors
  std::set<std::string> failed_;
};

Experiment read_experiment(const Config& config, const PluginRegistry& registry,
                           ExperimentUse use) {
  Experiment e;
  e.source_name = config.source_name();
  check_top_level_tables(config);
  e.plugin_paths = config_plugin_paths(config);
  for (const auto& t : {"run", "plugins", "ema", "eval", "train"}) reject_nested(config, t);
  const auto overrides = config.table_array("precision.override");
  for (std::size_t i = 0; i < overrides.size(); ++i)
    reject_nested(config, "precision.override." + std::to_string(i));

  SectionReads reads;
  sdk::Options run, checkpoint;
  reads.read("run", {}, [&] { run = read_run(config, e); });
  reads.read("data", {}, [&] { read_data_config(config, e); });
  reads.read("model", {"data"}, [&] { read_model_config(config, e); });  // vocab and block size
  const PluginSections plugins{config, registry, use, e.config_warnings, e.unused_keys};
  reads.read("backend", {}, [&] { read_backend(plugins, e); });
  reads.read("precision", {}, [&] { read_precision(plugins, overrides, e); });
  reads.read("scaler", {}, [&] { read_scaler(plugins, e); });
  reads.read("optimizer", {"run"}, [&] { read_optimizer(plugins, e); });  // the schedule's steps
  reads.read("checkpoint", {"model"}, [&] { checkpoint = read_checkpoint(plugins, e); });
  reads.read("distributed", {}, [&] { read_distributed(plugins, e); });
  reads.read("ema", {}, [&] { read_ema(config, e); });
  reads.read("eval", {"ema"}, [&] { read_eval(config, e); });
  reads.read("train", {}, [&] { read_train(config, e); });  // sets model.freeze alone
  reads.read("lora", {"model", "checkpoint"}, [&] { read_lora(config, e); });
  // Both check their metric against [eval] top_k.
  reads.read("early_stopping", {"run", "eval"}, [&] { read_early_stopping(run, e); });
  reads.read("keep_best", {"run", "checkpoint", "eval"}, [&] { check_keep_best(checkpoint, e); });
  reads.throw_errors();
  return e;
}

// An unknown key's error points at the key, not at its value: the key is what to mend. The
// schemas report every option at its value (sdk::RawOption has one location, and a wrong type
// or range is the value's fault); a location placed elsewhere on purpose is kept.
sdk::ConfigError at_the_key(const sdk::ConfigError& e, const Config& config) {
  if (!std::string_view(e.what()).ends_with(": unknown key")) return e;
  const auto value_at = config.location(e.key());
  if (e.where().file != value_at.file || e.where().line != value_at.line ||
      e.where().column != value_at.column)
    return e;
  return sdk::ConfigError(config.key_location(e.key()), e.key(), "unknown key", e.hint());
}

}  // namespace

Experiment parse_experiment(const Config& config, const PluginRegistry& registry,
                            ExperimentUse use) {
  const auto pointed = [&](const sdk::ConfigError& e) {
    return at_the_key(with_owner_hint(e, registry, config).value_or(e), config);
  };
  try {
    return read_experiment(config, registry, use);
  } catch (const ConfigErrors& all) {
    std::vector<sdk::ConfigError> errors;
    for (const auto& e : all.errors()) errors.push_back(pointed(e));
    throw ConfigErrors(std::move(errors), all.others());
  } catch (const sdk::ConfigError& e) {
    throw pointed(e);
  }
}

Components create_components(const Experiment& e, const PluginRegistry& registry) {
  Components c;
  c.origins = "[loaded]\n";
  auto require = [&](ComponentKind kind, const std::string& name) -> const LoadedComponent& {
    const LoadedComponent& comp = registry.require(kind, name);
    c.origins += std::string(sdk::component_kind_name(kind)) + " = " +
                 sdk::option_value_to_string(name + " from plugin " + comp.plugin_name + " " +
                                             comp.plugin_version + " (" +
                                             comp.library.filename().string() + ")") +
                 "\n";
    return comp;
  };
  try {
    c.backend = registry.create<sdk::DeviceBackend>(require(ComponentKind::backend, e.backend_type),
                                                    e.backend_options);
  } catch (const sdk::PluginError& err) {
    // A backend that cannot start (no usable GPU) is the config's choice: said where it was made.
    if (e.backend_where.line == 0 && !e.backend_where.file.starts_with("--set")) throw;
    throw sdk::PluginError(
        e.backend_where.to_string() + ": 'backend.type': " + std::string(err.what()), err.hint());
  }
  c.policy = registry.create<sdk::PrecisionPolicy>(require(ComponentKind::policy, e.policy_name),
                                                   e.policy_options);
  c.scaler = registry.create<sdk::LossScaler>(require(ComponentKind::scaler, e.scaler_type),
                                              e.scaler_options);
  c.optimizer = registry.create<sdk::Optimizer>(require(ComponentKind::optimizer, e.optimizer_type),
                                                e.optimizer_options);
  const LoadedComponent& configured =
      require(ComponentKind::checkpoint_format, e.checkpoint.format);
  c.checkpoint_format = registry.create<sdk::CheckpointFormat>(configured, e.checkpoint_options);
  std::vector<NamedFormat> others;
  for (const auto& comp : registry.components()) {
    if (comp.info.kind != ComponentKind::checkpoint_format || comp.info.name == e.checkpoint.format)
      continue;
    // A format that cannot be built with its defaults (an extension refused among them) just
    // cannot be read from; the configured format still works.
    try {
      auto defaults = sdk::Options::resolve("checkpoint", comp.info.options, {}, {});
      others.push_back(named_format(comp, registry.create<sdk::CheckpointFormat>(comp, defaults)));
    } catch (const std::exception& ex) {
      core_logger("plugins").debug("checkpoint format '" + comp.info.name +
                                   "' is not used to read files: " + ex.what());
    }
  }
  std::vector<std::string> warnings;
  c.weight_formats = formats_by_extension(named_format(configured, c.checkpoint_format),
                                          std::move(others), "checkpoint.format", warnings);
  for (const auto& w : warnings) core_logger("plugins").warn(w);
  return c;
}

std::string follow_the_launch_on_resume(Experiment& e) {
  if (!e.distributed.enabled() || detect_mpi_launch().detected) return {};
  const std::string type = e.distributed.type;
  // The table stays in the resolved config (core_sections), so the run's config.toml keeps what
  // the run was configured with: a later launch on several ranks resumes with its sharding and
  // batch-norm mode, not the defaults.
  e.distributed = DistributedSettings{};
  return "the run trained under [distributed] type = \"" + type +
         "\"; this process was not started by an MPI launcher, so it continues in one process (a "
         "checkpoint resumes on any number of ranks; launch with mpirun to continue on several)";
}

namespace {

std::string launch_line(const std::string& train_command) {
  return "launch it with `" +
         mpirun_line(2, train_command.empty() ? "mixtrain train CONFIG" : train_command) +
         "` (-np: the number of ranks), or remove [distributed] to train in one process";
}

std::string outside_a_launch(const Experiment& e) {
  return "[distributed] type = \"" + e.distributed.type +
         "\" runs one process per rank, but this process was not started by an MPI launcher";
}

}  // namespace

std::string launch_requirement(const Experiment& e, const std::string& train_command) {
  if (!e.distributed.enabled() || detect_mpi_launch().detected) return {};
  return outside_a_launch(e) + ": " + launch_line(train_command);
}

std::string one_process_requirement(const std::string& command, bool writes) {
  const MpiLaunch launch = detect_mpi_launch();
  if (!launch.detected || launch.world_size < 2) return {};
  return "`mixtrain " + command +
         "` runs in one process, but an MPI launcher started this one as "
         "rank " +
         std::to_string(launch.rank) + " of " + std::to_string(launch.world_size) +
         (writes ? ": every rank would write the same outputs"
                 : ": every rank would do the same work and print the same output, once per "
                   "rank (only train shares its work among ranks)");
}

std::shared_ptr<sdk::Communicator> create_communicator(const Experiment& e,
                                                       const PluginRegistry& registry,
                                                       sdk::DeviceBackend& backend,
                                                       const std::string& train_command) {
  if (!e.distributed.enabled()) return nullptr;
  if (!detect_mpi_launch().detected)
    throw sdk::ConfigError(e.distributed.where, "distributed.type", outside_a_launch(e),
                           launch_line(train_command));
  auto comm = registry.create<sdk::Communicator>(
      registry.require(ComponentKind::communicator, e.distributed.type), e.communicator_options);
  comm->bind(backend);
  return comm;
}

std::string resolved_toml(const Experiment& e) {
  std::vector<ResolvedSection> sections = e.core_sections;
  if (!sections.empty())  // the header first, then what the sections noted themselves
    sections.front().comments.insert(sections.front().comments.begin(),
                                     "mixtrain resolved config: every effective value, defaults "
                                     "included. Source: " +
                                         e.source_name);
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
