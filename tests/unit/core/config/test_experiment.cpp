// parse_experiment and resolved_toml over full configs, against the real plugins of this build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <unistd.h>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/config_errors.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/plugins/registry.h"

namespace sdk = mixtrain::sdk;
using mixtrain::core::Config;
using mixtrain::core::Experiment;
using mixtrain::core::PluginRegistry;

namespace {

const PluginRegistry& registry() {
  static const auto* r = [] {
    auto* reg = new PluginRegistry();
    reg->scan({MIXTRAIN_REAL_PLUGIN_DIR});
    return reg;
  }();
  return *r;
}

// Line numbers matter: tests below point at them.
const char* const kFull =
    "[run]\n"                                                            // 1
    "name = \"exp\"\n"                                                   // 2
    "seed = 3\n"                                                         // 3
    "steps = 50\n"                                                       // 4
    "log_every = 5\n"                                                    // 5
    "on_nonfinite = \"stop\"\n"                                          // 6
    "\n"                                                                 // 7
    "[backend]\n"                                                        // 8
    "type = \"cpu\"\n"                                                   // 9
    "threads = 2\n"                                                      // 10
    "\n"                                                                 // 11
    "[precision]\n"                                                      // 12
    "policy = \"fp32\"\n"                                                // 13
    "\n"                                                                 // 14
    "[[precision.override]]\n"                                           // 15
    "layers = \"fc*\"\n"                                                 // 16
    "compute = \"fp32\"\n"                                               // 17
    "\n"                                                                 // 18
    "[scaler]\n"                                                         // 19
    "type = \"dynamic\"\n"                                               // 20
    "init_scale = 1024\n"                                                // 21
    "growth_interval = 100\n"                                            // 22
    "\n"                                                                 // 23
    "[optimizer]\n"                                                      // 24
    "type = \"adamw\"\n"                                                 // 25
    "lr = 0.1\n"                                                         // 26
    "eps = 1e-8\n"                                                       // 27
    "weight_decay = 0.0\n"                                               // 28
    "schedule = \"warmup_cosine\"\n"                                     // 29
    "warmup_steps = 5\n"                                                 // 30
    "\n"                                                                 // 31
    "[model]\n"                                                          // 32
    "layers = [\n"                                                       // 33
    "  { type = \"linear\", name = \"fc1\", out = 16 },\n"               // 34
    "  { type = \"gelu\" },\n"                                           // 35
    "  { type = \"layernorm\", eps = 1e-6 },\n"                          // 36
    "  { type = \"linear\", name = \"fc2\", out = 4, bias = false },\n"  // 37
    "]\n"                                                                // 38
    "\n"                                                                 // 39
    "[data]\n"                                                           // 40
    "source = \"synthetic\"\n"                                           // 41
    "kind = \"teacher\"\n"                                               // 42
    "rows = 256\n"                                                       // 43
    "features = 8\n"                                                     // 44
    "num_classes = 4\n"                                                  // 45
    "noise = 0.25\n"                                                     // 46
    "batch_size = 32\n"                                                  // 47
    "\n"                                                                 // 48
    "[checkpoint]\n"                                                     // 49
    "format = \"native\"\n"                                              // 50
    "every = 10\n"                                                       // 51
    "fsync = false\n";                                                   // 52

Experiment parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return mixtrain::core::parse_experiment(Config::from_string(text, "exp.toml", overrides),
                                          registry());
}

template <class E>
std::optional<E> error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const E& e) {
    return e;
  }
  return std::nullopt;
}

std::string resolved_toml_of(const Experiment& e) {
  return mixtrain::core::resolved_toml(e);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(sdk_Experiment, RealPluginsAreLoaded) {
  for (const auto& l : registry().libraries()) EXPECT_TRUE(l.loaded) << l.path << ": " << l.error;
  EXPECT_NE(registry().find(sdk::ComponentKind::scaler, "dynamic"), nullptr);
  EXPECT_NE(registry().find(sdk::ComponentKind::optimizer, "adamw"), nullptr);
  EXPECT_NE(registry().find(sdk::ComponentKind::backend, "cpu"), nullptr);
  EXPECT_NE(registry().find(sdk::ComponentKind::policy, "fp32"), nullptr);
  EXPECT_NE(registry().find(sdk::ComponentKind::checkpoint_format, "native"), nullptr);
}

TEST(sdk_Experiment, FullConfigResolves) {
  auto e = parse(kFull);
  EXPECT_EQ(e.run.name, "exp");
  EXPECT_EQ(e.run.seed, 3u);
  EXPECT_EQ(e.run.steps, 50);
  EXPECT_EQ(e.run.on_nonfinite, mixtrain::core::NonfiniteAction::stop);
  EXPECT_EQ(e.backend_type, "cpu");
  EXPECT_EQ(e.backend_options.get_int("threads"), 2);
  EXPECT_EQ(e.policy_name, "fp32");
  ASSERT_EQ(e.overrides.size(), 1u);
  EXPECT_EQ(e.overrides[0].pattern, "fc*");
  EXPECT_EQ(e.scaler_type, "dynamic");
  EXPECT_EQ(e.scaler_options.get_double("init_scale"), 1024.0);
  EXPECT_EQ(e.scaler_options.get_int("growth_interval"), 100);
  EXPECT_EQ(e.optimizer_type, "adamw");
  EXPECT_EQ(e.optimizer_options.get_double("lr"), 0.1);
  EXPECT_EQ(e.optimizer_options.get_double("eps"), 1e-8);
  EXPECT_EQ(e.schedule.schedule, mixtrain::core::LrScheduleKind::warmup_cosine);
  EXPECT_EQ(e.schedule.warmup_steps, 5);
  ASSERT_EQ(e.model.layers.size(), 4u);
  EXPECT_EQ(e.model.layers[0].name, "fc1");
  EXPECT_EQ(e.model.layers[1].name, "gelu1");
  EXPECT_EQ(e.model.layers[2].name, "layernorm1");  // numbered per type, not by position
  EXPECT_EQ(layer_options(e.model.layers[2]).get_double("eps"), 1e-6);
  EXPECT_FALSE(layer_options(e.model.layers[3]).get_bool("bias"));
  EXPECT_EQ(e.data.synthetic.kind, "teacher");
  EXPECT_EQ(e.data.synthetic.noise, 0.25);
  EXPECT_EQ(e.data.eval_batch_size, 32);  // defaults to batch_size
  EXPECT_EQ(e.checkpoint.format, "native");
  EXPECT_EQ(e.checkpoint.every, 10);
  EXPECT_FALSE(e.checkpoint_options.get_bool("fsync"));
}

TEST(sdk_Experiment, UnknownTopLevelTableWithDidYouMean) {
  std::string text = std::string(kFull) + "\n[optimiser]\nlr = 0.1\n";  // line 54
  auto e = error_of<sdk::ConfigError>(text);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "exp.toml:54:1: 'optimiser': unknown table")) << e->what();
  EXPECT_TRUE(contains(e->hint(), "did you mean [optimizer]?")) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "known tables: run, data, model, precision")) << e->hint();
}

// [model.gpt] or [model.resnet] under another preset (here the layer list) is checked as an
// unselected plugin's table is: a typo or a wrong type there is an error, not dropped.
TEST(sdk_Experiment, APresetTableUnderAnotherPresetIsStillChecked) {
  auto e = error_of<sdk::ConfigError>(kFull, {"model.gpt.n_layr=2"});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->key(), "model.gpt.n_layr");
  EXPECT_TRUE(contains(e->hint(), "did you mean 'n_layer'?")) << e->hint();
  e = error_of<sdk::ConfigError>(kFull, {"model.resnet.stem_width=wide"});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->key(), "model.resnet.stem_width");
  EXPECT_NO_THROW(parse(kFull, {"model.gpt.n_layer=2"}));  // valid and unused
  // Without layers, the table is named with the preset it needs.
  e = error_of<sdk::ConfigError>(kFull, {"model.layers=[]", "model.gpt.n_layer=2"});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "[model.gpt] is given but [model] selects no preset"))
      << e->what();
  EXPECT_TRUE(contains(e->hint(), "add preset = \"gpt\" to [model]")) << e->hint();
}

// A key above the first table header is a key outside any table, not an "unknown table": the
// error says so and names the table it belongs in.
TEST(sdk_Experiment, AKeyOutsideAnyTableNamesItsTable) {
  auto e = error_of<sdk::ConfigError>("steps = 10\n" + std::string(kFull));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->key(), "steps");
  EXPECT_TRUE(contains(e->what(), "exp.toml:1:")) << e->what();
  EXPECT_TRUE(contains(e->what(), "'steps': unknown key")) << e->what();
  EXPECT_TRUE(contains(e->hint(), "did you mean run.steps?")) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "outside any table")) << e->hint();
}

// data.classes below the synthetic data's classes is refused (it was widened without a word), and
// a key the chosen kind leaves unread is listed for the run's warning.
TEST(sdk_Experiment, DataKeysTheSourceCannotHonourAreRefusedOrListedAsUnused) {
  auto e = error_of<sdk::ConfigError>(kFull, {"data.classes=1"});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->key(), "data.classes");
  EXPECT_TRUE(contains(e->what(), "below the")) << e->what();
  const auto parsed = parse(kFull, {"data.synthetic.height=8"});
  ASSERT_EQ(parsed.unused_keys.size(), 1u);
  EXPECT_TRUE(contains(parsed.unused_keys[0], "data.synthetic.height (--set"))
      << parsed.unused_keys[0];
  EXPECT_TRUE(parse(kFull).unused_keys.empty());
}

TEST(sdk_Experiment, UnknownKeyInOptimizerWithDidYouMean) {
  auto e = error_of<sdk::ConfigError>(kFull, {"optimizer.weight_decy=0.1"});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->key(), "optimizer.weight_decy");
  EXPECT_TRUE(contains(e->what(), "unknown key")) << e->what();
  EXPECT_TRUE(contains(e->hint(), "did you mean 'weight_decay'?")) << e->hint();
  // The known keys cover both the plugin's and the host's part of [optimizer].
  EXPECT_TRUE(contains(e->hint(), "beta1")) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "warmup_steps")) << e->hint();

  // A near miss of a host key in the same table.
  std::string text = kFull;
  text.replace(text.find("warmup_steps = 5"), 16, "warmup_step = 5");
  e = error_of<sdk::ConfigError>(text);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "exp.toml:30:1: 'optimizer.warmup_step': unknown key"))
      << e->what();
  EXPECT_TRUE(contains(e->hint(), "did you mean 'warmup_steps'?")) << e->hint();
}

TEST(sdk_Experiment, UnknownScalerTypeListsTheAvailableOnes) {
  std::string text = kFull;
  text.replace(text.find("type = \"dynamic\""), 16, "type = \"dynamc\"");
  auto e = error_of<sdk::PluginError>(text);
  ASSERT_TRUE(e.has_value());
  const std::string what = e->what();
  EXPECT_TRUE(contains(what, "exp.toml:20:8: scaler.type")) << what;
  EXPECT_TRUE(contains(what, "no scaler named 'dynamc'")) << what;
  EXPECT_TRUE(contains(what, "available: ")) << what;
  for (const char* name : {"none", "static", "dynamic"}) EXPECT_TRUE(contains(what, name)) << what;
  EXPECT_TRUE(contains(e->hint(), "did you mean 'dynamic'?")) << e->hint();
}

TEST(sdk_Experiment, PluginOptionOfTheWrongTypeNamesFileLineColumn) {
  std::string text = kFull;
  text.replace(text.find("lr = 0.1"), 8, "lr = \"fast\"");
  auto e = error_of<sdk::ConfigError>(text);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->where().to_string(), "exp.toml:26:6");
  EXPECT_EQ(e->key(), "optimizer.lr");
  EXPECT_TRUE(contains(e->what(), "exp.toml:26:6: 'optimizer.lr': expected a number, got a string"))
      << e->what();

  // And a --set value of the wrong type names the override.
  e = error_of<sdk::ConfigError>(kFull, {"scaler.growth_interval=1.5"});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "--set scaler.growth_interval=1.5")) << e->what();
  EXPECT_TRUE(contains(e->what(), "expected an integer, got a number 1.5")) << e->what();

  // The host's own run options too: run.gated_update takes a boolean only.
  e = error_of<sdk::ConfigError>(kFull, {"run.gated_update=1"});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->key(), "run.gated_update");
  EXPECT_TRUE(contains(e->what(), "expected a boolean")) << e->what();
}

TEST(sdk_Experiment, OverridesChangeTheExperiment) {
  auto e = parse(kFull, {"optimizer.lr=0.05", "optimizer.beta1=0.8", "model.layers.3.out=7",
                         "scaler.growth_interval=7"});
  EXPECT_EQ(e.optimizer_options.get_double("lr"), 0.05);
  EXPECT_EQ(e.optimizer_options.get_double("beta1"), 0.8);
  EXPECT_EQ(layer_options(e.model.layers[3]).get_int("out"), 7);
  EXPECT_EQ(e.scaler_options.get_int("growth_interval"), 7);
  // Flat keys of the previous type (the old layout) are not the new one's: the error says
  // which table to move them into so that the swap needs no edit next time.
  auto err = error_of<sdk::ConfigError>(kFull, {"scaler.type=static"});
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(err->key() == "scaler.init_scale" || err->key() == "scaler.growth_interval")
      << err->key();
  EXPECT_TRUE(contains(err->hint(), "move it into [scaler.dynamic]")) << err->hint();
}

// [precision.escalate]: present (even empty, or from a --set) means on; nonsense is refused at
// its key; the resolved config carries it, so a resume without a config escalates the same.
TEST(sdk_Experiment, PrecisionEscalateIsReadCheckedAndResolved) {
  EXPECT_FALSE(parse(kFull).escalate.enabled);
  auto e = parse(kFull + std::string("\n[precision.escalate]\n"));
  EXPECT_TRUE(e.escalate.enabled);
  EXPECT_EQ(e.escalate.after, 3);
  EXPECT_EQ(e.escalate.window, 200);
  EXPECT_EQ(e.escalate.deescalate_after, 0);
  e = parse(kFull, {"precision.escalate.after=2", "precision.escalate.deescalate_after=500"});
  EXPECT_TRUE(e.escalate.enabled);
  EXPECT_EQ(e.escalate.after, 2);
  EXPECT_EQ(e.escalate.deescalate_after, 500);
  const auto back = parse(resolved_toml_of(e));
  EXPECT_TRUE(back.escalate.enabled);
  EXPECT_EQ(back.escalate.after, 2);
  EXPECT_EQ(back.escalate.deescalate_after, 500);
  EXPECT_FALSE(contains(resolved_toml_of(parse(kFull)), "escalate"));

  struct Case {
    std::vector<std::string> sets;
    std::string key, message;
  };
  const std::vector<Case> cases = {
      {{"precision.escalate.after=0"}, "precision.escalate.after", "allowed: [1, "},
      {{"precision.escalate.window=-5"}, "precision.escalate.window", "allowed: [1, "},
      {{"precision.escalate.after=10", "precision.escalate.window=4"},
       "precision.escalate.window",
       "shorter than after = 10"},
      {{"precision.escalate.deescalate_after=-1"},
       "precision.escalate.deescalate_after",
       "allowed: [0, "},
      {{"precision.escalate.after=\"often\""}, "precision.escalate.after", "integer"},
      {{"precision.escalate.aftr=3"}, "precision.escalate.aftr", "after"},
      {{"precision.escalate.rules.x=1"}, "precision.escalate.rules", ""},
  };
  for (const auto& c : cases) {
    auto err = error_of<sdk::ConfigError>(kFull, c.sets);
    ASSERT_TRUE(err.has_value()) << c.sets.back();
    EXPECT_EQ(err->key(), c.key) << err->what();
    const std::string text = std::string(err->what()) + " " + err->hint();
    EXPECT_TRUE(contains(text, c.message)) << text;
  }
}

void expect_same_options(const sdk::Options& a, const sdk::Options& b, const std::string& what) {
  ASSERT_EQ(a.effective().size(), b.effective().size()) << what;
  for (std::size_t i = 0; i < a.effective().size(); ++i) {
    EXPECT_EQ(a.effective()[i].first, b.effective()[i].first) << what;
    EXPECT_EQ(a.effective()[i].second, b.effective()[i].second)
        << what << "." << a.effective()[i].first << ": "
        << sdk::option_value_to_string(a.effective()[i].second) << " vs "
        << sdk::option_value_to_string(b.effective()[i].second);
  }
}

void expect_same_experiment(const Experiment& a, const Experiment& b) {
  EXPECT_EQ(a.run.name, b.run.name);
  EXPECT_EQ(a.run.seed, b.run.seed);
  EXPECT_EQ(a.run.steps, b.run.steps);
  EXPECT_EQ(a.run.log_every, b.run.log_every);
  EXPECT_EQ(a.run.eval_every, b.run.eval_every);
  EXPECT_EQ(a.run.on_nonfinite, b.run.on_nonfinite);
  EXPECT_EQ(a.run.dir, b.run.dir);
  EXPECT_EQ(a.data.source, b.data.source);
  EXPECT_EQ(a.data.batch_size, b.data.batch_size);
  EXPECT_EQ(a.data.eval_batch_size, b.data.eval_batch_size);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.data.eval_fraction, b.data.eval_fraction);
  EXPECT_EQ(a.data.classes, b.data.classes);
  EXPECT_EQ(a.data.synthetic.kind, b.data.synthetic.kind);
  EXPECT_EQ(a.data.synthetic.rows, b.data.synthetic.rows);
  EXPECT_EQ(a.data.synthetic.features, b.data.synthetic.features);
  EXPECT_EQ(a.data.synthetic.classes, b.data.synthetic.classes);
  EXPECT_EQ(a.data.synthetic.noise, b.data.synthetic.noise);
  EXPECT_EQ(a.data.token_paths, b.data.token_paths);
  EXPECT_EQ(a.data.eval_token_paths, b.data.eval_token_paths);
  EXPECT_EQ(a.data.block_size, b.data.block_size);
  EXPECT_EQ(a.data.vocab_size, b.data.vocab_size);
  EXPECT_EQ(a.schedule.schedule, b.schedule.schedule);
  EXPECT_EQ(a.schedule.warmup_steps, b.schedule.warmup_steps);
  EXPECT_EQ(a.schedule.min_lr, b.schedule.min_lr);
  EXPECT_EQ(a.schedule.clip_grad_norm, b.schedule.clip_grad_norm);
  EXPECT_EQ(a.checkpoint.format, b.checkpoint.format);
  EXPECT_EQ(a.checkpoint.every, b.checkpoint.every);
  EXPECT_EQ(a.checkpoint.keep, b.checkpoint.keep);
  EXPECT_EQ(a.checkpoint.init_from, b.checkpoint.init_from);
  EXPECT_EQ(a.model.loss, b.model.loss);
  ASSERT_EQ(a.model.layers.size(), b.model.layers.size());
  for (std::size_t i = 0; i < a.model.layers.size(); ++i) {
    EXPECT_EQ(a.model.layers[i].type, b.model.layers[i].type) << i;
    EXPECT_EQ(a.model.layers[i].name, b.model.layers[i].name) << i;
    EXPECT_EQ(layer_options(a.model.layers[i]).effective(),
              layer_options(b.model.layers[i]).effective())
        << i;
  }
  ASSERT_EQ(a.overrides.size(), b.overrides.size());
  for (std::size_t i = 0; i < a.overrides.size(); ++i) {
    EXPECT_EQ(a.overrides[i].pattern, b.overrides[i].pattern);
    EXPECT_EQ(a.overrides[i].weight, b.overrides[i].weight);
    EXPECT_EQ(a.overrides[i].gemm_input, b.overrides[i].gemm_input);
    EXPECT_EQ(a.overrides[i].activation, b.overrides[i].activation);
    EXPECT_EQ(a.overrides[i].activation_grad, b.overrides[i].activation_grad);
  }
  EXPECT_EQ(a.backend_type, b.backend_type);
  EXPECT_EQ(a.policy_name, b.policy_name);
  EXPECT_EQ(a.scaler_type, b.scaler_type);
  EXPECT_EQ(a.optimizer_type, b.optimizer_type);
  expect_same_options(a.backend_options, b.backend_options, "backend");
  expect_same_options(a.policy_options, b.policy_options, "precision");
  expect_same_options(a.scaler_options, b.scaler_options, "scaler");
  expect_same_options(a.optimizer_options, b.optimizer_options, "optimizer");
  expect_same_options(a.checkpoint_options, b.checkpoint_options, "checkpoint");
}

TEST(sdk_Experiment, ResolvedTomlParsesBackToTheSameExperiment) {
  std::string static_scaler = kFull;
  const std::string dynamic_lines =
      "type = \"dynamic\"\ninit_scale = 1024\ngrowth_interval = 100\n";
  static_scaler.replace(static_scaler.find(dynamic_lines), dynamic_lines.size(),
                        "type = \"static\"\nscale = 65536.0\n");
  static_scaler.erase(static_scaler.find("eps = 1e-8\n"), 11);  // sgd has no eps
  std::string no_scaler = kFull;
  no_scaler.replace(no_scaler.find(dynamic_lines), dynamic_lines.size(), "type = \"none\"\n");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {kFull, {}},
      {kFull, {"scaler.hysteresis=2", "scaler.min_scale=1.0", "scaler.backoff_factor=0.25"}},
      // Control characters must come back escaped, or the resolved file is not TOML.
      {kFull, {"run.name=\"tab\\there\\nnew line \\u0001 \\\"q\\\" \\\\ end\""}},
      {static_scaler,
       {"optimizer.type=sgd", "optimizer.lr=0.3", "optimizer.nesterov=true",
        "optimizer.momentum=0.9", "run.dir=runs/a \"quoted\" dir"}},
      {no_scaler, {"data.eval_fraction=0.3", "optimizer.clip_grad_norm=1e-3", "backend.threads=0"}},
  };
  for (const auto& [source, overrides] : cases) {
    SCOPED_TRACE(::testing::PrintToString(overrides));
    auto first = parse(source, overrides);
    const auto text = mixtrain::core::resolved_toml(first);
    Experiment second;
    try {
      second =
          mixtrain::core::parse_experiment(Config::from_string(text, "resolved.toml"), registry());
    } catch (const sdk::UserError& e) {
      FAIL() << e.full_message() << "\n--- resolved config ---\n" << text;
    }
    expect_same_experiment(first, second);
    // Read back, the defaults it writes out are no keys a source leaves unread (eval, sample,
    // --resume RUN warned about four of them on every run).
    EXPECT_EQ(second.unused_keys, first.unused_keys);
    // Every default is written out: the resolved form is a fixed point.
    auto again = mixtrain::core::resolved_toml(second);
    EXPECT_EQ(again.substr(again.find('\n')), text.substr(text.find('\n'))) << text;
  }
}

TEST(sdk_Experiment, ResolvedTomlWritesDefaultsInTomlSpelling) {
  auto e = parse(kFull);
  const auto text = mixtrain::core::resolved_toml(e);
  // Defaults the config never mentioned.
  EXPECT_TRUE(contains(text, "beta2 = 0.999\n")) << text;
  EXPECT_TRUE(contains(text, "eps = 1e-08\n")) << text;
  EXPECT_TRUE(contains(text, "max_scale = inf\n")) << text;
  EXPECT_TRUE(contains(text, "init_scale = 1024.0\n")) << text;  // an integer in the source
  EXPECT_TRUE(contains(text, "[[model.layers]]\ntype = \"gelu\"\nname = \"gelu1\"\n")) << text;
  // The dynamic scaler's max_scale survives the round trip as infinity.
  auto back = mixtrain::core::parse_experiment(Config::from_string(text, "r.toml"), registry());
  EXPECT_TRUE(std::isinf(back.scaler_options.get_double("max_scale")));
}

}  // namespace

namespace {

// DISABLED: exposes a bug in core/src/config/experiment.cpp (not this suite's to fix).
// config_plugin_paths() calls config.table_options("plugins") without skipping "paths", and
// table_options raises on any non-table array, so the documented `[plugins] paths = [...]`
// always fails with "'plugins.paths': expected a boolean, integer, number or string" — and so
// does any resolved_toml() output of a run that had plugin paths. The fix is
// table_options("plugins", {"paths"}) in config_plugin_paths(). Enable this test with it.
TEST(sdk_Experiment, PluginPathsAreReadAndSurviveTheResolvedToml) {
  const std::string text =
      std::string(kFull) + "\n[plugins]\npaths = [\"/opt/mixtrain/plugins\", \"rel\"]\n";
  auto e = parse(text);
  ASSERT_EQ(e.plugin_paths.size(), 2u);
  EXPECT_EQ(e.plugin_paths[0], "/opt/mixtrain/plugins");
  // Relative entries resolve against the config's folder (the working directory for a string).
  EXPECT_EQ(e.plugin_paths[1].filename(), "rel");
  EXPECT_TRUE(e.plugin_paths[1].is_absolute());
  auto back = mixtrain::core::parse_experiment(
      Config::from_string(mixtrain::core::resolved_toml(e), "r.toml"), registry());
  EXPECT_EQ(back.plugin_paths, e.plugin_paths);

  // Anything else in [plugins] is still an unknown key.
  auto err = error_of<sdk::ConfigError>(text + "path = \"x\"\n");
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "plugins.path");
}

// DISABLED: exposes a silent default (docs/architecture.md, "Errors and data safety").
// Config::table_options() skips sub-tables and arrays of tables by contract (config/config.h),
// and parse_experiment() never looks at them, so a value written as a table —
// `beta1 = { value = 0.5 }`, `[optimizer.extra]`, a dotted key `beta.one = 0.8` — is dropped and
// the default used without a word. parse_experiment should reject any sub-table it does not read
// (everything but model.layers and precision.override).
TEST(sdk_Experiment, SubTablesInsidePluginTablesAreNotSilentlyIgnored) {
  for (const std::string& extra :
       {std::string("beta1 = { value = 0.5 }\n"), std::string("beta.one = 0.8\n")}) {
    std::string text = kFull;
    text.insert(text.find("schedule = "), extra);
    auto e = error_of<sdk::ConfigError>(text);
    EXPECT_TRUE(e.has_value()) << extra;
  }
  auto e = error_of<sdk::ConfigError>(std::string(kFull) + "\n[optimizer.extra]\nlr = 0.5\n");
  EXPECT_TRUE(e.has_value());
  e = error_of<sdk::ConfigError>(std::string(kFull) + "\n[[scaler.groups]]\nscale = 2.0\n");
  EXPECT_TRUE(e.has_value());
}

}  // namespace

// Component sections (config/component_section.h): each component's options in a table named after
// it.
namespace {

TEST(sdk_Experiment, OnlyTheSelectedComponentsTableIsUsed) {
  // Tuned settings for two scalers and two optimizers side by side.
  std::string text = kFull;
  text += "\n[scaler.static]\nscale = 512.0\n\n[optimizer.sgd]\nmomentum = 0.9\n";
  auto e = parse(text);
  EXPECT_EQ(e.scaler_type, "dynamic");
  EXPECT_EQ(e.scaler_options.get_double("init_scale"), 1024.0);
  // eps is adamw's: flat keys must suit the selected optimizer.
  auto err = error_of<sdk::ConfigError>(text, {"optimizer.type=sgd"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "optimizer.eps");
  EXPECT_TRUE(contains(err->full_message(), "option of adamw, not of the selected optimizer 'sgd'"))
      << err->full_message();
  EXPECT_TRUE(contains(err->full_message(), "move it into [optimizer.adamw]"))
      << err->full_message();
  EXPECT_TRUE(contains(err->full_message(), "exp.toml:27:")) << err->full_message();
}

// A config a run trained with a plugin scaler or optimizer wrote holds that component's table.
// A command that never uses [scaler] or [optimizer] (eval, predict, sample, export) reads the
// config without that plugin: the table is a warning there. Training still refuses it, as it
// refuses a typo next to the selected component; other sections refuse it in both.
TEST(sdk_Experiment, AnUnknownScalerOrOptimizerTableIsAWarningOnlyWhereTheyAreNotUsed) {
  std::string text = kFull;
  text += "\n[scaler.chaos]\nlevel = 3\n\n[optimizer.lion]\nbeta1 = 0.9\n";
  const auto config = [&] { return Config::from_string(text, "exp.toml"); };
  using mixtrain::core::ExperimentUse;
  try {
    mixtrain::core::parse_experiment(config(), registry(), ExperimentUse::training);
    ADD_FAILURE() << "training read the unknown tables";
  } catch (const mixtrain::core::ConfigErrors& all) {
    EXPECT_TRUE(contains(all.what(), "no scaler named 'chaos'")) << all.what();
    EXPECT_TRUE(contains(all.what(), "no optimizer named 'lion'")) << all.what();
  }
  const auto e = mixtrain::core::parse_experiment(config(), registry(), ExperimentUse::model_only);
  EXPECT_EQ(e.scaler_type, "dynamic");
  EXPECT_EQ(e.optimizer_type, "adamw");
  int named = 0;
  for (const auto& w : e.config_warnings) {
    if (contains(w, "[scaler.chaos] (exp.toml:54:") &&
        contains(w, "no scaler named 'chaos' is loaded, and this command does not use the scaler"))
      ++named;
    if (contains(w, "[optimizer.lion] (exp.toml:57:") && contains(w, "does not use the optimizer"))
      ++named;
  }
  EXPECT_EQ(named, 2) << ::testing::PrintToString(e.config_warnings);
  // A known component's table is still checked against its schema, and other sections are not
  // relaxed.
  text = std::string(kFull) + "\n[scaler.static]\nscael = 2.0\n";
  EXPECT_THROW(mixtrain::core::parse_experiment(config(), registry(), ExperimentUse::model_only),
               sdk::ConfigError);
  text = std::string(kFull) + "\n[checkpoint.nativ]\nx = 1\n";
  EXPECT_THROW(mixtrain::core::parse_experiment(config(), registry(), ExperimentUse::model_only),
               sdk::ConfigError);
}

// The selected scaler or optimizer of a plugin such a command does not load is still an error,
// but its hint offers the built-in one first: the command never uses the section.
TEST(sdk_Experiment, AMissingScalerOrOptimizerPluginSuggestsTheBuiltInOneWhereNotUsed) {
  using mixtrain::core::ExperimentUse;
  const auto hint_of = [](const std::string& from, const std::string& to, ExperimentUse use) {
    std::string text = kFull;
    text.replace(text.find(from), from.size(), to);
    try {
      mixtrain::core::parse_experiment(Config::from_string(text, "exp.toml"), registry(), use);
    } catch (const sdk::PluginError& e) {
      return std::string(e.what()) + "\n" + e.hint();
    }
    return std::string("no PluginError");
  };
  const std::string scaler =
      hint_of("type = \"dynamic\"", "type = \"chaos\"", ExperimentUse::model_only);
  EXPECT_TRUE(contains(scaler, "no scaler named 'chaos'")) << scaler;
  EXPECT_TRUE(contains(scaler, "this command does not use [scaler]: `--set scaler.type=none`"))
      << scaler;
  EXPECT_TRUE(contains(scaler, "mixtrain plugins")) << scaler;  // loading the plugin still works
  const std::string optimizer =
      hint_of("type = \"adamw\"", "type = \"lion\"", ExperimentUse::model_only);
  EXPECT_TRUE(contains(optimizer, "no optimizer named 'lion'")) << optimizer;
  EXPECT_TRUE(contains(optimizer, "`--set optimizer.type=adamw`")) << optimizer;
  // Training uses the scaler: no such way out there.
  const std::string training =
      hint_of("type = \"dynamic\"", "type = \"chaos\"", ExperimentUse::training);
  EXPECT_TRUE(contains(training, "no scaler named 'chaos'")) << training;
  EXPECT_FALSE(contains(training, "does not use")) << training;
}

TEST(sdk_Experiment, ComponentTablesSwapWithNoEdit) {
  std::string text = kFull;
  // kFull's flat dynamic-scaler keys move into [scaler.dynamic]; eps into [optimizer.adamw].
  const std::string dynamic_lines = "init_scale = 1024\ngrowth_interval = 100\n";
  text.erase(text.find(dynamic_lines), dynamic_lines.size());
  text.erase(text.find("eps = 1e-8\n"), 11);
  text +=
      "\n[scaler.dynamic]\ninit_scale = 1024\ngrowth_interval = 100\n"
      "\n[scaler.static]\nscale = 512.0\n"
      "\n[optimizer.adamw]\neps = 1e-7\n"
      "\n[optimizer.sgd]\nmomentum = 0.9\nnesterov = true\n";
  auto e = parse(text);
  EXPECT_EQ(e.scaler_options.get_int("growth_interval"), 100);
  EXPECT_EQ(e.optimizer_options.get_double("eps"), 1e-7);
  e = parse(text, {"scaler.type=static", "optimizer.type=sgd"});
  EXPECT_EQ(e.scaler_options.get_double("scale"), 512.0);
  EXPECT_TRUE(e.optimizer_options.get_bool("nesterov"));
  // Flat --set applies to the selected component and beats its table in the file; the table's
  // key can be set too.
  e = parse(text, {"scaler.type=static", "scaler.scale=8.0"});
  EXPECT_TRUE(contains(resolved_toml_of(e), "[scaler.static]\nscale = 8.0\n"));
  e = parse(text, {"scaler.dynamic.growth_interval=7"});
  EXPECT_EQ(e.scaler_options.get_int("growth_interval"), 7);
  // The resolved config writes the nested form and reads back the same.
  const auto resolved = mixtrain::core::resolved_toml(e);
  EXPECT_TRUE(contains(resolved, "[scaler]\ntype = \"dynamic\"\n\n[scaler.dynamic]\n")) << resolved;
  EXPECT_TRUE(contains(resolved, "[optimizer.adamw]\n")) << resolved;
  auto back = mixtrain::core::parse_experiment(Config::from_string(resolved, "r.toml"), registry());
  EXPECT_EQ(back.scaler_options.get_int("growth_interval"), 7);
}

TEST(sdk_Experiment, UnselectedComponentTablesAreStillValidated) {
  auto err = error_of<sdk::ConfigError>(std::string(kFull) + "\n[scaler.static]\nscael = 2.0\n");
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "scaler.static.scael");
  EXPECT_TRUE(contains(err->full_message(), "did you mean 'scale'")) << err->full_message();
  err = error_of<sdk::ConfigError>(std::string(kFull) + "\n[scaler.static]\nscale = \"big\"\n");
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "scaler.static.scale");
  EXPECT_EQ(err->where().line, 55u);
  err = error_of<sdk::ConfigError>(std::string(kFull) + "\n[scaler.dynamc]\ninit_scale = 2.0\n");
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "scaler.dynamc");
  EXPECT_TRUE(contains(err->full_message(), "did you mean [scaler.dynamic]"))
      << err->full_message();
  err = error_of<sdk::ConfigError>(std::string(kFull) + "\n[data.npz]\nfeatures = \"x\"\n");
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->full_message(), "did you mean [data.npy]")) << err->full_message();
}

TEST(sdk_Experiment, AKeyGivenFlatAndInItsTableIsAnError) {
  auto err =
      error_of<sdk::ConfigError>(std::string(kFull) + "\n[scaler.dynamic]\ngrowth_interval = 5\n");
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "scaler.growth_interval");
  EXPECT_TRUE(contains(err->full_message(), "given twice")) << err->full_message();
  EXPECT_TRUE(contains(err->full_message(), "exp.toml:55:")) << err->full_message();
  // A --set of either spelling beats the file's.
  auto e = parse(std::string(kFull) + "\n[scaler.dynamic]\ngrowth_interval = 5\n",
                 {"scaler.growth_interval=9"});
  EXPECT_EQ(e.scaler_options.get_int("growth_interval"), 9);
  e = parse(std::string(kFull) + "\n[scaler.dynamic]\ngrowth_interval = 5\n",
            {"scaler.dynamic.growth_interval=11"});
  EXPECT_EQ(e.scaler_options.get_int("growth_interval"), 11);
}

// A --merge file in the table's spelling (what calibrate writes) beats the config's flat key, as
// a --set does; a --set beats both.
TEST(sdk_Experiment, AMergedTableKeyBeatsTheConfigsFlatOne) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mixtrain-merge-flat-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto merge = dir / "calibrated.toml";
  std::ofstream(merge) << "[scaler.dynamic]\ngrowth_interval = 7\n";
  auto with = [&](const std::vector<std::string>& sets) {
    return mixtrain::core::parse_experiment(Config::from_string(kFull, "exp.toml", sets, {merge}),
                                            registry());
  };
  EXPECT_EQ(with({}).scaler_options.get_int("growth_interval"), 7);
  EXPECT_EQ(with({"scaler.growth_interval=9"}).scaler_options.get_int("growth_interval"), 9);
  std::filesystem::remove_all(dir);
}

TEST(sdk_Experiment, UnknownKeyInAComponentWithoutOptionsSuggestsTheSectionsKeys) {
  std::string text = kFull;
  const std::string dynamic_lines =
      "type = \"dynamic\"\ninit_scale = 1024\ngrowth_interval = 100\n";
  text.replace(text.find(dynamic_lines), dynamic_lines.size(), "type = \"none\"\n");
  auto err = error_of<sdk::ConfigError>(text, {"scaler.typ=static"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "scaler.typ");
  EXPECT_TRUE(contains(err->full_message(), "did you mean 'type'")) << err->full_message();
}

// kFull less its flat synthetic-data keys, so a test can give them another way.
std::string without_flat_synthetic_keys(std::string text) {
  for (const std::string line : {"kind = \"teacher\"\n", "rows = 256\n", "features = 8\n",
                                 "num_classes = 4\n", "noise = 0.25\n"})
    text.erase(text.find(line), line.size());
  return text;
}

TEST(sdk_Experiment, DataSourcesSwapLikeComponents) {
  std::string text = without_flat_synthetic_keys(kFull);
  text += "\n[data.synthetic]\nkind = \"teacher\"\nrows = 256\nfeatures = 8\nnum_classes = 4\n";
  auto e = parse(text);
  EXPECT_EQ(e.data.synthetic.rows, 256);
  // The file's synthetic settings stay; npy's paths come from the command line, relative to the
  // current folder.
  e = parse(text, {"data.source=npy", "data.features=sub/x.npy", "data.labels=/abs/y.npy"});
  EXPECT_EQ(e.data.features_path, std::filesystem::current_path() / "sub/x.npy");
  EXPECT_EQ(e.data.labels_path, "/abs/y.npy");
  // Flat synthetic keys with source = npy name the table they belong in.
  auto err = error_of<sdk::ConfigError>(
      kFull, {"data.source=npy", "data.features=x.npy", "data.labels=y.npy"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.kind");
  EXPECT_TRUE(contains(err->full_message(), "move it into [data.synthetic]"))
      << err->full_message();
}

TEST(sdk_Experiment, PathsInAFileResolveAgainstItsFolderAndFromSetAgainstTheCurrentOne) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mixtrain_paths_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "conf");
  std::string text = kFull;
  for (const std::string line : {"source = \"synthetic\"\n", "kind = \"teacher\"\n", "rows = 256\n",
                                 "features = 8\n", "num_classes = 4\n", "noise = 0.25\n"})
    text.erase(text.find(line), line.size());
  text.insert(text.find("[data]\n") + 7, "source = \"npy\"\n");
  text += "\n[data.npy]\nfeatures = \"d/x.npy\"\nlabels = \"d/y.npy\"\n";
  { std::ofstream(dir / "conf" / "c.toml") << text; }
  auto e = mixtrain::core::parse_experiment(Config::from_file(dir / "conf" / "c.toml"), registry());
  EXPECT_EQ(e.data.features_path, (dir / "conf" / "d" / "x.npy").lexically_normal());
  e = mixtrain::core::parse_experiment(
      Config::from_file(dir / "conf" / "c.toml",
                        {"data.npy.labels=l.npy", "checkpoint.init_from=w.safetensors"}),
      registry());
  EXPECT_EQ(e.data.features_path, (dir / "conf" / "d" / "x.npy").lexically_normal());
  EXPECT_EQ(e.data.labels_path, std::filesystem::current_path() / "l.npy");
  EXPECT_EQ(e.checkpoint.init_from, (std::filesystem::current_path() / "w.safetensors").string());
  // The resolved config holds absolute paths, so it reproduces the run from any folder.
  const auto resolved = mixtrain::core::resolved_toml(e);
  EXPECT_TRUE(contains(resolved, "features = \"" + (dir / "conf" / "d" / "x.npy").string()))
      << resolved;
  std::filesystem::remove_all(dir);
}

TEST(sdk_Experiment, ARequiredOptionMayComeFromTheTableOrFromSetAndSiblingsMayBePartial) {
  std::string text = without_flat_synthetic_keys(kFull);
  // npy's labels in its table, its features from the command line; idx only half filled in.
  text += "\n[data.npy]\nlabels = \"/abs/y.npy\"\n\n[data.idx]\nimages = \"/abs/i.idx\"\n";
  auto e = parse(text, {"data.source=npy", "data.features=x.npy"});
  EXPECT_EQ(e.data.features_path, std::filesystem::current_path() / "x.npy");
  EXPECT_EQ(e.data.labels_path, "/abs/y.npy");
  // The selected component still needs every required option from one of the two.
  auto err = error_of<sdk::ConfigError>(text, {"data.source=npy"});
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->full_message(), "features")) << err->full_message();
  EXPECT_TRUE(contains(err->full_message(), "required key is missing")) << err->full_message();
  // The unselected, half-filled sibling is still checked for what it does hold.
  err = error_of<sdk::ConfigError>(text + "imagez = \"z\"\n",
                                   {"data.source=npy", "data.features=x.npy"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.idx.imagez");
}

TEST(sdk_Experiment, KeysInsideATableGivenWithSetAreTheCommandLines) {
  std::string text = without_flat_synthetic_keys(kFull);
  auto e = parse(text, {"data.source=npy", "data.npy={features=\"a.npy\", labels=\"b.npy\"}"});
  EXPECT_EQ(e.data.features_path, std::filesystem::current_path() / "a.npy");
  EXPECT_EQ(e.data.labels_path, std::filesystem::current_path() / "b.npy");
  // An error inside such a table, or in a table a --set created on its way, names the --set.
  auto err = error_of<sdk::ConfigError>(kFull, {"scaler.dynamc.x=1"});
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->full_message(), "--set")) << err->full_message();
}

// kFull with [data] source = SOURCE and `table` appended (the synthetic keys dropped).
std::string with_data_source(const std::string& source, const std::string& table) {
  std::string text = without_flat_synthetic_keys(kFull);
  const std::string line = "source = \"synthetic\"\n";
  text.replace(text.find(line), line.size(), "source = \"" + source + "\"\n");
  return text + "\n" + table;
}

// The resolved config parses back to the same experiment and is a fixed point.
void expect_resolved_round_trip(const Experiment& first) {
  const auto text = mixtrain::core::resolved_toml(first);
  Experiment second;
  try {
    second =
        mixtrain::core::parse_experiment(Config::from_string(text, "resolved.toml"), registry());
  } catch (const sdk::UserError& e) {
    FAIL() << e.full_message() << "\n--- resolved config ---\n" << text;
  }
  expect_same_experiment(first, second);
  const auto again = mixtrain::core::resolved_toml(second);
  EXPECT_EQ(again.substr(again.find('\n')), text.substr(text.find('\n'))) << text;
}

TEST(data_TokenConfig, TokensSourceReadsItsFileAndSizes) {
  const auto text = with_data_source(
      "tokens", "[data.tokens]\ntrain = \"/abs/train.bin\"\nblock_size = 64\nvocab_size = 50257\n");
  auto e = parse(text);
  EXPECT_EQ(e.data.token_paths, std::vector<std::filesystem::path>{"/abs/train.bin"});
  EXPECT_TRUE(e.data.eval_token_paths.empty());
  EXPECT_EQ(e.data.block_size, 64);
  EXPECT_EQ(e.data.vocab_size, 50257);
  expect_resolved_round_trip(e);
  e = parse(text, {"data.tokens.eval=val.bin"});
  EXPECT_EQ(e.data.eval_token_paths,
            std::vector<std::filesystem::path>{std::filesystem::current_path() / "val.bin"});
  expect_resolved_round_trip(e);

  auto err = error_of<sdk::ConfigError>(
      with_data_source("tokens", "[data.tokens]\ntrain = \"t.bin\"\nvocab_size = 50257\n"));
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->full_message(), "block_size")) << err->full_message();
  // One position would make a classifier of the language model (graph_plan.cpp): refused at the
  // key, not later as a logits shape the loss cannot take.
  err = error_of<sdk::ConfigError>(text, {"data.tokens.block_size=1"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.tokens.block_size");
  EXPECT_TRUE(contains(err->full_message(), "at least 2")) << err->full_message();
  // A vocabulary, not classes: data.classes would go unused, so it is refused where it stands.
  err = error_of<sdk::ConfigError>(text, {"data.classes=10"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.classes");
  EXPECT_TRUE(contains(err->full_message(), "vocab_size")) << err->full_message();
  // Only text takes lists of files.
  err = error_of<sdk::ConfigError>(text, {"data.tokens.eval=[\"a.bin\", \"b.bin\"]"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.tokens.eval");
}

TEST(data_TokenConfig, TextSourceTakesAFileOrAListAndTheResolvedConfigKeepsTheList) {
  const auto text = with_data_source(
      "text", "[data.text]\npath = [\"/abs/a.txt\", \"/abs/b.txt\"]\nblock_size = 32\n");
  auto e = parse(text);
  const std::vector<std::filesystem::path> both = {"/abs/a.txt", "/abs/b.txt"};
  EXPECT_EQ(e.data.token_paths, both);
  EXPECT_EQ(e.data.vocab_size, 256);  // bytes
  EXPECT_EQ(e.data.block_size, 32);
  const auto resolved = mixtrain::core::resolved_toml(e);
  EXPECT_TRUE(contains(resolved, "path = [\"/abs/a.txt\", \"/abs/b.txt\"]")) << resolved;
  expect_resolved_round_trip(e);

  // One file as a string, a list from --set (relative to the current folder), a held-out list.
  e = parse(text, {"data.text.path=/abs/c.txt"});
  EXPECT_EQ(e.data.token_paths, std::vector<std::filesystem::path>{"/abs/c.txt"});
  e = parse(text, {"data.text.path=[\"x.txt\", \"y.txt\"]", "data.text.eval=[\"/abs/v.txt\"]"});
  const auto cwd = std::filesystem::current_path();
  EXPECT_EQ(e.data.token_paths, (std::vector<std::filesystem::path>{cwd / "x.txt", cwd / "y.txt"}));
  EXPECT_EQ(e.data.eval_token_paths, std::vector<std::filesystem::path>{"/abs/v.txt"});
  expect_resolved_round_trip(e);

  // Flat in [data], as a file without [data.text] writes it.
  std::string flat = with_data_source("text", "");
  flat.insert(flat.find("[data]\n") + 7, "path = [\"/abs/a.txt\"]\nblock_size = 8\n");
  e = parse(flat);
  EXPECT_EQ(e.data.token_paths, std::vector<std::filesystem::path>{"/abs/a.txt"});
  EXPECT_EQ(e.data.block_size, 8);
  expect_resolved_round_trip(e);

  auto err = error_of<sdk::ConfigError>(text, {"data.text.vocab_size=100"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.text.vocab_size");
  err = error_of<sdk::ConfigError>(text, {"data.text.path=[]"});
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->full_message(), "names no file")) << err->full_message();
  err = error_of<sdk::ConfigError>(text, {"data.text.path=[\"a.txt\", 3]"});
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->full_message(), "entry 1 is not a string")) << err->full_message();
  // A list flat in [data] while another source is selected names the table it belongs in.
  err = error_of<sdk::ConfigError>(
      text, {"data.source=npy", "data.features=x.npy", "data.labels=y.npy", "data.path=[\"a\"]"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.path");
  // cifar10 and text both take a path: the hint names both tables.
  EXPECT_TRUE(contains(err->full_message(), "move it into [data.cifar10] or [data.text]"))
      << err->full_message();
}

TEST(sdk_Experiment, RunDirAndPluginPathsResolveLikeEveryOtherPath) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mixtrain_run_dir_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "conf");
  std::string text = kFull;
  text.insert(text.find("[run]\n") + 6, "dir = \"o\"\n");
  { std::ofstream(dir / "conf" / "c.toml") << text << "\n[plugins]\npaths = [\"p\"]\n"; }
  auto from_file = [&](std::vector<std::string> sets) {
    return mixtrain::core::parse_experiment(Config::from_file(dir / "conf" / "c.toml", sets),
                                            registry());
  };
  auto e = from_file({});
  EXPECT_EQ(e.run.dir, (dir / "conf" / "o").lexically_normal().string());
  EXPECT_EQ(e.plugin_paths.at(0), (dir / "conf" / "p").lexically_normal());
  e = from_file({"run.dir=out"});
  EXPECT_EQ(e.run.dir, (std::filesystem::current_path() / "out").string());
  // The resolved config holds the absolute folder, so it means the same from anywhere.
  EXPECT_TRUE(contains(mixtrain::core::resolved_toml(e),
                       "dir = \"" + (std::filesystem::current_path() / "out").string()));
  e = from_file({"plugins.paths=[\"q\"]"});
  EXPECT_EQ(e.plugin_paths.at(0), std::filesystem::current_path() / "q");
  std::filesystem::remove_all(dir);
}

// model.loss_chunk_rows unset means "by the class count and the backend" (from 4096 classes 1024,
// or 512 on the CPU; else 0): the resolved config must leave it unset, or an evaluation or resume
// reading it would chunk a small vocabulary's loss that the run computed whole (another summation
// order, other last bits).
TEST(sdk_Experiment, AnUnsetLossChunkStaysUnsetInTheResolvedConfig) {
  const auto e = parse(kFull);
  ASSERT_FALSE(e.model.loss_chunk_rows.has_value());
  const std::string text = resolved_toml_of(e);
  EXPECT_FALSE(contains(text, "loss_chunk_rows =")) << text;
  EXPECT_FALSE(parse(text).model.loss_chunk_rows.has_value());
  const auto set = parse(kFull, {"model.loss_chunk_rows=64"});
  EXPECT_TRUE(contains(resolved_toml_of(set), "loss_chunk_rows = 64"));
  EXPECT_EQ(parse(resolved_toml_of(set)).model.loss_chunk_rows, 64);
}

// model.loss_pad_classes: unset unless set, and left unset in the resolved config (its default
// depends on the backend: a CUDA run's resolved config evaluated on the CPU must not pad there);
// a value set, 0 too, is carried through it; out of [0, 4096] it is refused at its key.
TEST(sdk_Experiment, LossPadClassesIsReadAndRangeChecked) {
  const auto unset = parse(kFull);
  EXPECT_FALSE(unset.model.loss_pad_classes.has_value());
  const std::string text = resolved_toml_of(unset);
  EXPECT_FALSE(contains(text, "loss_pad_classes =")) << text;
  EXPECT_FALSE(parse(text).model.loss_pad_classes.has_value());
  for (const std::int64_t n : {0, 64}) {
    const auto set = parse(kFull, {"model.loss_pad_classes=" + std::to_string(n)});
    EXPECT_EQ(set.model.loss_pad_classes, n);
    EXPECT_EQ(parse(resolved_toml_of(set)).model.loss_pad_classes, n);
  }
  for (const std::string bad : {"-1", "4097"}) {
    const auto e = error_of<sdk::ConfigError>(kFull, {"model.loss_pad_classes=" + bad});
    ASSERT_TRUE(e.has_value()) << bad;
    EXPECT_TRUE(contains(e->full_message(), "loss_pad_classes")) << e->full_message();
  }
}

// model.recompute: a list of op types the op table marks recomputable, carried through the
// resolved config (duplicates once); an op type that cannot be recomputed, one that does not
// exist and a value that is no list of strings are refused at the entry's key and place.
TEST(sdk_Experiment, RecomputeTakesRecomputableOpTypesAndNamesTheEntryItRefuses) {
  EXPECT_TRUE(parse(kFull).model.recompute.empty());
  EXPECT_TRUE(parse(resolved_toml_of(parse(kFull))).model.recompute.empty());
  const auto set = parse(kFull, {R"(model.recompute=["gelu", "layernorm", "gelu"])"});
  const std::vector<std::string> both = {"gelu", "layernorm"};
  EXPECT_EQ(set.model.recompute, both);
  EXPECT_EQ(parse(resolved_toml_of(set)).model.recompute, both);
  EXPECT_EQ(parse(kFull, {R"(model.recompute="gelu")"}).model.recompute,
            std::vector<std::string>{"gelu"});
  struct Bad {
    std::string value, key, says;
  };
  for (const Bad& bad : {Bad{R"(["gelu", "add"])", "'model.recompute[1]'", "add"},
                         Bad{R"(["relu"])", "'model.recompute[0]'", "relu"},
                         Bad{R"(["gleu"])", "'model.recompute[0]'", "'gleu' is no op type"},
                         Bad{"3", "'model.recompute'", "array of strings"}}) {
    const auto e = error_of<sdk::ConfigError>(kFull, {"model.recompute=" + bad.value});
    ASSERT_TRUE(e.has_value()) << bad.value;
    EXPECT_TRUE(contains(e->full_message(), bad.key)) << e->full_message();
    EXPECT_TRUE(contains(e->full_message(), bad.says)) << e->full_message();
    EXPECT_TRUE(contains(e->full_message(), "--set model.recompute=")) << e->full_message();
  }
}

// run.step_graphs unset means "where the backend records them": left unset in the resolved config,
// so a resume on another backend decides again; a value set, false too, is carried through it.
TEST(sdk_Experiment, AnUnsetStepGraphsStaysUnsetInTheResolvedConfig) {
  const auto unset = parse(kFull);
  EXPECT_FALSE(unset.run.step_graphs.has_value());
  const std::string text = resolved_toml_of(unset);
  EXPECT_FALSE(contains(text, "step_graphs =")) << text;
  EXPECT_FALSE(parse(text).run.step_graphs.has_value());
  for (const bool on : {false, true}) {
    const auto set = parse(kFull, {std::string("run.step_graphs=") + (on ? "true" : "false")});
    EXPECT_EQ(set.run.step_graphs, on);
    EXPECT_EQ(parse(resolved_toml_of(set)).run.step_graphs, on);
  }
}

// A misspelt host sub-table of a component section is suggested as the host's, not only the
// components' names ([[precision.overide]] is the override list).
TEST(sdk_Experiment, AMisspeltOverrideTableIsSuggested) {
  const auto e = error_of<sdk::ConfigError>(std::string(kFull) +
                                            "\n[[precision.overide]]\nlayers = \"fc1\"\n");
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->full_message(), "did you mean [precision.override]?"))
      << e->full_message();
}

// run.name becomes runs/<name>: a name must keep the run below runs/.
TEST(sdk_Experiment, ARunNameThatIsAPathIsRefusedAtItsKey) {
  for (const std::string name : {"", ".", "..", "../esc", "/tmp/x", "a/../b", "a//b", "a/"}) {
    const auto e = error_of<sdk::ConfigError>(kFull, {"run.name=\"" + name + "\""});
    ASSERT_TRUE(e.has_value()) << name;
    EXPECT_TRUE(contains(e->what(), "a relative path of plain folder names"))
        << name << ": " << e->what();
    EXPECT_TRUE(contains(e->full_message(), "run.dir or --run-dir")) << e->full_message();
  }
  EXPECT_EQ(parse(kFull, {"run.name=\"my run.v2\""}).run.name, "my run.v2");
  EXPECT_EQ(parse(kFull, {"run.name=\"sweep/lr1\""}).run.name, "sweep/lr1");  // grouped runs
}

}  // namespace

namespace {

TEST(sdk_Experiment, UnnamedLayersAreNumberedPerTypeAroundExplicitNames) {
  std::string text = kFull;
  const std::string layers_old =
      text.substr(text.find("layers = ["), text.find("]\n\n[data]") - text.find("layers = [") + 2);
  text.replace(text.find(layers_old), layers_old.size(),
               "layers = [ { type = \"linear\", out = 8 }, { type = \"relu\" },\n"
               "  { type = \"linear\", out = 8 }, { type = \"relu\", name = \"relu2\" },\n"
               "  { type = \"relu\" }, { type = \"linear\", out = 4 } ]\n");
  auto e = parse(text);
  std::vector<std::string> names;
  for (const auto& l : e.model.layers) names.push_back(l.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"linear1", "relu1", "linear2", "relu2", "relu3", "linear3"}));
}

}  // namespace

namespace {

// kFull with its [model] table replaced by a resnet preset whose [model.resnet] has `block_line`
// on line 36.
std::string resnet_config(const std::string& block_line) {
  std::string text = kFull;
  const auto from = text.find("layers = [");
  const auto to = text.find("]\n\n[data]") + 2;
  std::string model = "preset = \"resnet\"\n";  // 33
  model += "[model.resnet]\n";                  // 34
  model += "blocks = [1, 1]\n";                 // 35
  model += block_line + "\n";                   // 36
  model += "widths = [4, 8]\n";                 // 37
  text.replace(from, to - from, model);
  return text;
}

// [model] reads `blocks` as the block graph's table only: any other value there (the ResNet
// preset's stage depths written one table too high, an array of tables) would vanish unread.
TEST(sdk_Experiment, AModelBlocksThatIsNotATableOfBlocksIsRefusedAtItsLine) {
  const std::string text = "[model]\nlayers = [ { type = \"linear\", out = 4 } ]\n";
  for (const std::string& extra :
       {std::string("blocks = [3, 3, 3]\n"), std::string("[[model.blocks]]\nname = \"res\"\n")}) {
    try {
      (void)parse(text + extra);
      ADD_FAILURE() << extra << " was accepted";
    } catch (const sdk::ConfigError& e) {
      EXPECT_EQ(e.where().line, 3u) << e.what();
      EXPECT_EQ(e.key(), "model.blocks");
      EXPECT_NE(e.hint().find("[model.resnet] blocks"), std::string::npos) << e.hint();
    }
  }
}

TEST(sdk_Experiment, ResNetBlockSelectsTorchvisionsBottleneck) {
  auto e = parse(resnet_config("block = \"bottleneck\""));
  std::vector<std::string> names;
  for (const auto& l : e.model.layers) names.push_back(l.name);
  for (const char* want : {"layer1.0.conv3", "layer1.0.bn3", "layer1.0.relu3",
                           "layer1.0.downsample.0", "layer2.0.downsample.1", "fc"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  // Without the key: BasicBlocks, as before.
  e = parse(resnet_config(""));
  for (const auto& l : e.model.layers) EXPECT_EQ(l.name.find("conv3"), std::string::npos) << l.name;
  EXPECT_TRUE(contains(resolved_toml_of(e), "block = \"basic\"")) << resolved_toml_of(e);
}

TEST(sdk_Experiment, AMisspelledResNetBlockNamesFileLineColumnAndTheBlocks) {
  auto e = error_of<sdk::ConfigError>(resnet_config("block = \"bottlenek\""));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->where().to_string(), "exp.toml:36:9");
  EXPECT_EQ(e->key(), "model.resnet.block");
  const std::string what = std::string(e->what()) + " " + e->hint();
  for (const char* part :
       {"exp.toml:36:9: 'model.resnet.block'", "'bottlenek'", "one of: basic, bottleneck"})
    EXPECT_TRUE(contains(what, part)) << what;
  // And from --set.
  e = error_of<sdk::ConfigError>(resnet_config(""), {"model.resnet.block=bottlenek"});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "--set model.resnet.block=bottlenek")) << e->what();
}

}  // namespace

// How many mistakes parse() reports: 0, 1 (a ConfigError), or a ConfigErrors' count.
std::size_t mistakes_in(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const mixtrain::core::ConfigErrors& e) {
    return e.errors().size() + e.others().size();
  } catch (const sdk::PluginError&) {
    return 1;
  } catch (const sdk::ConfigError&) {
    return 1;
  }
  return 0;
}

// Independent mistakes in several sections are reported together, in the order the sections are
// read, each at its own line, as one ConfigError whose first line and location are the first's;
// a section that reads what a refused one sets ([model] reads [data]'s vocabulary) is not read,
// so no error that could only follow from another is reported.
TEST(sdk_Experiment, IndependentMistakesAreReportedTogether) {
  const std::string text =
      "[run]\n"                                        // 1
      "steps = -3\n"                                   // 2
      "[model]\n"                                      // 3
      "layers = [ { type = \"linear\", out = 4 } ]\n"  // 4
      "[data]\n"                                       // 5
      "batch_size = 0\n"                               // 6
      "[eval]\n"                                       // 7
      "top_k = \"x\"\n"                                // 8
      "[backend]\n"                                    // 9
      "type = \"cpu\"\n"                               // 10
      "threads = \"two\"\n";                           // 11
  const auto all = error_of<mixtrain::core::ConfigErrors>(text);
  ASSERT_TRUE(all.has_value());
  std::vector<std::pair<std::string, std::uint32_t>> got;
  for (const auto& e : all->errors()) got.emplace_back(e.key(), e.where().line);
  const std::vector<std::pair<std::string, std::uint32_t>> want = {
      {"run.steps", 2}, {"data.batch_size", 6}, {"backend.threads", 11}, {"eval.top_k", 8}};
  EXPECT_EQ(got, want);
  // The first error's location and key; the others in the message as the CLI prints errors.
  EXPECT_EQ(all->key(), "run.steps");
  EXPECT_EQ(all->where().line, 2u);
  const std::string printed = all->full_message();
  EXPECT_EQ(printed.rfind("exp.toml:2:", 0), 0u) << printed;
  std::size_t at = 0;
  for (const auto& e : all->errors()) {
    at = printed.find(e.what(), at);
    ASSERT_NE(at, std::string::npos) << e.what() << " in\n" << printed;
    EXPECT_NE(printed.find("HINT: " + e.hint()), std::string::npos) << e.hint();
  }
  EXPECT_NE(printed.find("\nerror: exp.toml:6:"), std::string::npos) << printed;
  // One mistake is thrown as itself.
  EXPECT_EQ(mistakes_in(kFull), 0u);
  EXPECT_EQ(mistakes_in(kFull, {"run.steps=-3"}), 1u);
  EXPECT_EQ(mistakes_in(kFull, {"run.steps=-3", "eval.top_k=-1"}), 2u);
  // A component no plugin offers (a PluginError) joins the others, after them.
  EXPECT_EQ(mistakes_in(kFull, {"run.steps=-3", "precision.policy=\"bf16\""}), 2u);
  try {
    parse(kFull, {"precision.policy=\"bf16\"", "run.steps=-3"});
    ADD_FAILURE() << "accepted";
  } catch (const mixtrain::core::ConfigErrors& e) {
    EXPECT_EQ(e.key(), "run.steps");
    ASSERT_EQ(e.others().size(), 1u);
    EXPECT_NE(e.others()[0].find("no policy named 'bf16'"), std::string::npos) << e.others()[0];
    EXPECT_NE(e.full_message().find("\nerror: " + e.others()[0]), std::string::npos);
  }
  // Early stopping and keep_best check their metric against [eval] top_k: with [eval] refused
  // they wait, rather than call eval_top5_accuracy no number of this run.
  EXPECT_EQ(
      mistakes_in(kFull, {"run.early_stopping_patience=3",
                          "run.early_stopping_metric=\"eval_top5_accuracy\"", "eval.top_k=\"x\""}),
      1u);
  // [model] reads [data] (a preset's vocabulary and context): with [data] refused, [model] is not
  // read, and its own mistake waits for the next round rather than risk an error that only
  // follows from the data's defaults.
  const std::string chained =
      "[data]\nbatch_size = 0\n[model]\nlayers = [ { type = \"linaer\", out = 4 } ]\n";
  EXPECT_EQ(mistakes_in(chained), 1u);
  const auto data = error_of<sdk::ConfigError>(chained);
  ASSERT_TRUE(data.has_value());
  EXPECT_EQ(data->key(), "data.batch_size") << data->what();
}

TEST(sdk_Experiment, ImageFolderReadsItsKeysAndRefusesWhatCannotApply) {
  const std::string text =
      without_flat_synthetic_keys(kFull) + "\n[data.image_folder]\ntrain = \"/images/train\"\n";
  const std::vector<std::string> folder = {"data.source=image_folder"};
  auto e = parse(text, folder);
  EXPECT_EQ(e.data.source, mixtrain::core::DataSource::image_folder);
  EXPECT_EQ(e.data.image_train_dir, "/images/train");
  EXPECT_TRUE(e.data.image_eval_dir.empty());
  EXPECT_EQ(e.data.crop_size, 224);
  EXPECT_EQ(e.data.image_spec.resize, 256);  // torchvision's Resize(256), CenterCrop(224)
  EXPECT_EQ(e.data.image_spec.scale_min, 0.08);
  EXPECT_GE(e.data.image_spec.threads, 1u);
  EXPECT_TRUE(e.data.check_image_files);
  EXPECT_TRUE(contains(resolved_toml_of(e), "[data.image_folder]")) << resolved_toml_of(e);

  e = parse(text, {"data.source=image_folder", "data.size=64", "data.threads=3", "data.eval=val"});
  EXPECT_EQ(e.data.image_spec.resize, 73);  // round(64 · 8 / 7)
  EXPECT_EQ(e.data.image_spec.threads, 3u);
  EXPECT_EQ(e.data.image_eval_dir, std::filesystem::current_path() / "val");

  auto err = error_of<sdk::ConfigError>(
      text, {"data.source=image_folder", "data.scale_min=0.5", "data.scale_max=0.25"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.image_folder.scale_max");
  err = error_of<sdk::ConfigError>(text, {"data.source=image_folder", "data.ratio_max=0"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.image_folder.ratio_max");
  // RandomResizedCrop cuts folders; a padded crop of fixed-size images cannot apply.
  err = error_of<sdk::ConfigError>(text + "\n[data.augment]\ncrop_padding = 4\n", folder);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.augment.crop_padding");
  EXPECT_TRUE(contains(err->full_message(), "RandomResizedCrop")) << err->full_message();
  // Flips apply.
  e = parse(text + "\n[data.augment]\nhorizontal_flip = true\n", folder);
  EXPECT_TRUE(e.data.augment.spec.horizontal_flip);
  err = error_of<sdk::ConfigError>(text, {"data.source=image_folder", "data.pixels=float32"});
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->key(), "data.pixels");
  // The folder is required.
  err = error_of<sdk::ConfigError>(without_flat_synthetic_keys(kFull), folder);
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->key(), "train")) << err->key();
}
