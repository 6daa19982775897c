// Config choices read into enums at the edge (config/choices.h), and the settings structs'
// defaults, which come from the schemas: a config that sets nothing must leave every member at a
// default-constructed struct's value, so a second copy of a default that drifts fails here.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/lr_schedule.h"

namespace mixtrain::core {
namespace {

const PluginRegistry& registry() {
  static const auto* r = [] {
    auto* reg = new PluginRegistry();
    reg->scan({MIXTRAIN_REAL_PLUGIN_DIR});
    return reg;
  }();
  return *r;
}

// Sets nothing the structs hold but the model it needs to parse.
const char* const kBare =
    "[model]\n"
    "layers = [{ type = \"linear\", out = 4 }]\n";

Experiment parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_experiment(Config::from_string(text, "exp.toml", overrides), registry());
}

std::optional<sdk::ConfigError> error_of(const std::string& text,
                                         const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const sdk::ConfigError& e) {
    return e;
  }
  return std::nullopt;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(config_Defaults, ABareConfigLeavesRunAtTheDefaultConstructedSettings) {
  const auto run = parse(kBare).run;
  const RunSettings d;
  EXPECT_EQ(run.name, d.name);
  EXPECT_EQ(run.seed, d.seed);
  EXPECT_EQ(run.steps, d.steps);
  EXPECT_EQ(run.log_every, d.log_every);
  EXPECT_EQ(run.eval_every, d.eval_every);
  EXPECT_EQ(run.on_nonfinite, d.on_nonfinite);
  EXPECT_EQ(run.underflow_every, d.underflow_every);
  EXPECT_EQ(run.dir, d.dir);
  EXPECT_EQ(run.accumulate, d.accumulate);
  EXPECT_EQ(run.step_graphs, d.step_graphs);
  EXPECT_EQ(run.gated_update, d.gated_update);
  EXPECT_TRUE(d.gated_update);  // on unless a config turns it off
  EXPECT_EQ(run.stretch_schedule, d.stretch_schedule);
  EXPECT_EQ(run.metrics, d.metrics);
  EXPECT_EQ(run.early_stopping_patience, d.early_stopping_patience);
  EXPECT_EQ(run.early_stopping_metric, d.early_stopping_metric);
  EXPECT_EQ(run.early_stopping_min_delta, d.early_stopping_min_delta);
}

TEST(config_Defaults, ABareConfigLeavesScheduleEmaEvalAndCheckpointAtTheirDefaults) {
  const auto e = parse(kBare);
  const ScheduleSettings s;
  EXPECT_EQ(e.schedule.schedule, s.schedule);
  EXPECT_EQ(e.schedule.warmup_steps, s.warmup_steps);
  EXPECT_EQ(e.schedule.min_lr, s.min_lr);
  EXPECT_EQ(e.schedule.step_size, s.step_size);
  EXPECT_EQ(e.schedule.gamma, s.gamma);
  EXPECT_EQ(e.schedule.milestones, s.milestones);
  EXPECT_EQ(e.schedule.pct_start, s.pct_start);
  EXPECT_EQ(e.schedule.div_factor, s.div_factor);
  EXPECT_EQ(e.schedule.final_div_factor, s.final_div_factor);
  EXPECT_EQ(e.schedule.clip_grad_norm, s.clip_grad_norm);
  EXPECT_EQ(e.ema.decay, EmaSettings{}.decay);
  EXPECT_EQ(e.eval.weights, EvalSettings{}.weights);
  EXPECT_EQ(e.eval.top_k, EvalSettings{}.top_k);
  const CheckpointSettings c;
  EXPECT_EQ(e.checkpoint.every, c.every);
  EXPECT_EQ(e.checkpoint.keep, c.keep);
  EXPECT_EQ(e.checkpoint.init_from, c.init_from);
  EXPECT_EQ(e.checkpoint.init_layout, c.init_layout);
  EXPECT_EQ(e.checkpoint.keep_best, c.keep_best);
}

TEST(config_Defaults, ABareConfigLeavesDataAtItsDefaults) {
  const auto data = parse(kBare).data;
  const DataSettings d;
  EXPECT_EQ(data.source, d.source);
  EXPECT_EQ(data.batch_size, d.batch_size);
  EXPECT_EQ(data.shuffle, d.shuffle);
  EXPECT_EQ(data.eval_fraction, d.eval_fraction);
  EXPECT_EQ(data.classes, d.classes);
  // eval_batch_size 0 means batch_size, which the reader writes in.
  EXPECT_EQ(d.eval_batch_size, 0);
  EXPECT_EQ(data.eval_batch_size, data.batch_size);
}

TEST(config_Defaults, AnEmptyEscalateTableLeavesItsDefaults) {
  const auto e = parse(std::string(kBare) + "[precision.escalate]\n");
  const EscalationSettings d;
  EXPECT_TRUE(e.escalate.enabled);
  EXPECT_FALSE(d.enabled);
  EXPECT_EQ(e.escalate.after, d.after);
  EXPECT_EQ(e.escalate.window, d.window);
  EXPECT_EQ(e.escalate.deescalate_after, d.deescalate_after);
}

TEST(config_Defaults, DistributedSettingsStartAtTheSchemasDefaults) {
  // [distributed] needs an MPI launch to parse; its host keys resolve from the schema alone.
  const auto o = sdk::Options::resolve("distributed", distributed_schema(), {}, {});
  const DistributedSettings d;
  EXPECT_EQ(d.shard_optimizer, o.get_bool("shard_optimizer"));
  EXPECT_EQ(d.bucket_mb, o.get_double("bucket_mb"));
  EXPECT_EQ(d.overlap, o.get_bool("overlap"));
  EXPECT_EQ(choice_name(d.batch_norm, kBatchNormStats), o.get_string("batch_norm"));
}

TEST(config_Defaults, AnLrScheduleStartsWhereTheConfigsScheduleDoes) {
  const LrSchedule lr;
  const ScheduleSettings s;
  EXPECT_EQ(lr.kind, s.schedule);
  EXPECT_EQ(lr.min_lr, s.min_lr);
  EXPECT_EQ(lr.warmup_steps, s.warmup_steps);
  EXPECT_EQ(lr.step_size, s.step_size);
  EXPECT_EQ(lr.gamma, s.gamma);
  EXPECT_EQ(lr.pct_start, s.pct_start);
  EXPECT_EQ(lr.div_factor, s.div_factor);
  EXPECT_EQ(lr.final_div_factor, s.final_div_factor);
}

TEST(config_Defaults, AKeyWithoutADefaultOfThatTypeIsALogicError) {
  EXPECT_THROW(schema_default_int(run_schema(), "no_such_key"), std::logic_error);
  EXPECT_THROW(schema_default_number(run_schema(), "steps"), std::logic_error);  // an integer
}

TEST(config_Choices, EverySchemaListsItsEnumsNames) {
  auto choices_of = [](const sdk::OptionSchema& schema, const std::string& key) {
    for (const auto& spec : schema)
      if (spec.name == key) return spec.choices;
    return std::vector<std::string>{};
  };
  EXPECT_EQ(choices_of(run_schema(), "on_nonfinite"), choice_names(kNonfiniteActions));
  EXPECT_EQ(choices_of(run_schema(), "metrics"), choice_names(kMetricsSinks));
  EXPECT_EQ(choices_of(eval_schema(), "weights"), choice_names(kEvalWeights));
  EXPECT_EQ(choices_of(distributed_schema(), "batch_norm"), choice_names(kBatchNormStats));
  EXPECT_EQ(choices_of(schedule_schema(), "schedule"), choice_names(kLrScheduleKinds));
  EXPECT_EQ(data_sources(), choice_names(kDataSources));
}

TEST(config_Choices, EachChoiceParsesToItsEnum) {
  auto e = parse(kBare, {"run.on_nonfinite=stop", "eval.weights=ema", "ema.decay=0.9",
                         "optimizer.schedule=inverse_sqrt", "optimizer.warmup_steps=4",
                         "run.metrics=[\"csv\", \"tensorboard\", \"csv\"]"});
  EXPECT_EQ(e.run.on_nonfinite, NonfiniteAction::stop);
  EXPECT_EQ(e.eval.weights, EvalWeights::ema);
  EXPECT_EQ(e.schedule.schedule, LrScheduleKind::inverse_sqrt);
  const std::vector<MetricsSinkKind> sinks = {MetricsSinkKind::jsonl, MetricsSinkKind::csv,
                                              MetricsSinkKind::tensorboard};
  EXPECT_EQ(e.run.metrics, sinks);
  // The resolved config writes the names back.
  const auto toml = resolved_toml(e);
  EXPECT_TRUE(contains(toml, "on_nonfinite = \"stop\"")) << toml;
  EXPECT_TRUE(contains(toml, "metrics = [\"jsonl\", \"csv\", \"tensorboard\"]")) << toml;
  EXPECT_TRUE(contains(toml, "schedule = \"inverse_sqrt\"")) << toml;
}

// An unknown choice: one error at the value's file:line:col that names every choice.
void expect_unknown_choice(const std::string& text, const std::string& at,
                           const std::vector<std::string>& choices) {
  auto err = error_of(text);
  ASSERT_TRUE(err.has_value()) << text;
  EXPECT_TRUE(contains(err->what(), at)) << err->what();
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  EXPECT_TRUE(contains(err->full_message(), list)) << err->full_message();
}

TEST(config_Choices, AnUnknownChoiceNamesFileLineColumnAndTheChoices) {
  const std::string bare = kBare;  // two lines
  expect_unknown_choice(bare + "[run]\non_nonfinite = \"halt\"\n", "exp.toml:4:16",
                        choice_names(kNonfiniteActions));
  expect_unknown_choice(bare + "[eval]\nweights = \"average\"\n", "exp.toml:4:11",
                        choice_names(kEvalWeights));
  expect_unknown_choice(bare + "[optimizer]\nschedule = \"cosine\"\n", "exp.toml:4:12",
                        choice_names(kLrScheduleKinds));
  expect_unknown_choice(bare + "[data]\nsource = \"npz\"\n", "exp.toml:4:10",
                        choice_names(kDataSources));
}

TEST(config_Choices, AnUnknownMetricsSinkPointsAtItsOwnEntry) {
  auto err = error_of(std::string(kBare) + "[run]\nmetrics = [\"csv\", \"tensorbord\"]\n");
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->what(), "exp.toml:4:19")) << err->what();
  EXPECT_TRUE(contains(err->full_message(), "did you mean 'tensorboard'")) << err->full_message();
  EXPECT_TRUE(contains(err->full_message(), "jsonl, tensorboard, csv")) << err->full_message();
}

TEST(config_Choices, ParseChoiceRefusesANameOutsideItsTableAtTheKey) {
  // A schema without one_of lets any name through; parse_choice still refuses it, at the key.
  const sdk::OptionSchema schema = {sdk::OptionSpec::string("weights", "master", "")};
  const auto o = sdk::Options::resolve(
      "eval", schema, {{"weights", std::string("emma"), {"x.toml", 7, 3}}}, {"x.toml", 6, 1}, {});
  try {
    parse_choice(o, "weights", kEvalWeights);
    FAIL() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "x.toml:7:3")) << e.what();
    EXPECT_TRUE(contains(e.full_message(), "did you mean 'ema'? one of: master, ema"))
        << e.full_message();
  }
  EXPECT_EQ(choice_name(EvalWeights::ema, kEvalWeights), "ema");
}

}  // namespace
}  // namespace mixtrain::core
