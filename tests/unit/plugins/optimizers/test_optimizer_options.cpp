// Option validation of sgd and adamw, the host-owned keys of [optimizer], and the README tables.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "adamw_optimizer.h"
#include "mixtrain/sdk/error.h"
#include "plugin_test_support.h"
#include "sgd_optimizer.h"

namespace mixtrain::optimizers {
namespace {

using Values = std::vector<std::pair<std::string, sdk::OptionValue>>;

template <class Optimizer>
void construct(Values values) {
  test::construct<Optimizer>("optimizer", std::move(values));
}

using test::expect_config_error;
using test::has;

TEST(optimizers_options, Defaults) {
  const auto sgd = test::resolve("optimizer", SgdOptimizer::option_schema(), {});
  EXPECT_EQ(sgd.get_double("lr"), 0.01);
  EXPECT_EQ(sgd.get_double("momentum"), 0.0);
  EXPECT_EQ(sgd.get_double("dampening"), 0.0);
  EXPECT_FALSE(sgd.get_bool("nesterov"));
  EXPECT_EQ(sgd.get_double("weight_decay"), 0.0);
  const auto adamw = test::resolve("optimizer", AdamWOptimizer::option_schema(), {});
  EXPECT_EQ(adamw.get_double("lr"), 1e-3);
  EXPECT_EQ(adamw.get_double("beta1"), 0.9);
  EXPECT_EQ(adamw.get_double("beta2"), 0.999);
  EXPECT_EQ(adamw.get_double("eps"), 1e-8);
  EXPECT_EQ(adamw.get_double("weight_decay"), 0.01);
}

TEST(optimizers_options, NesterovNeedsMomentumAndNoDampening) {
  auto e = expect_config_error([] { construct<SgdOptimizer>({{"nesterov", true}}); });
  EXPECT_TRUE(has(e.what(),
                  "test.toml:4:1: 'optimizer.nesterov': Nesterov momentum requires "
                  "momentum > 0 and dampening = 0"))
      << e.what();
  EXPECT_FALSE(e.hint().empty());
  e = expect_config_error([] {
    construct<SgdOptimizer>({{"momentum", 0.9}, {"dampening", 0.1}, {"nesterov", true}});
  });
  EXPECT_EQ(e.where().line, 6u);
  EXPECT_NO_THROW(construct<SgdOptimizer>({{"momentum", 0.9}, {"nesterov", true}}));
}

// An lr of inf or 1e308 used to apply one step and write non-finite masters.
TEST(optimizers_options, LearningRateIsFiniteAndAtMostTen) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double lr : {inf, 1e308, 10.5, std::nan("")}) {
    auto e = expect_config_error([&] { construct<SgdOptimizer>({{"lr", lr}}); });
    EXPECT_EQ(e.key(), "optimizer.lr");
    EXPECT_TRUE(has(e.what(), "is out of range")) << e.what();
    e = expect_config_error([&] { construct<AdamWOptimizer>({{"lr", lr}}); });
    EXPECT_EQ(e.key(), "optimizer.lr");
    EXPECT_TRUE(has(e.hint(), "[0.0, 10.0]")) << e.hint();
  }
  EXPECT_NO_THROW(construct<SgdOptimizer>({{"lr", 10.0}}));
  EXPECT_NO_THROW(construct<AdamWOptimizer>({{"lr", 10.0}}));
}

TEST(optimizers_options, RangesFollowPyTorch) {
  auto e = expect_config_error([] { construct<SgdOptimizer>({{"lr", 0.0}}); });
  EXPECT_TRUE(has(e.what(), "'optimizer.lr': value 0.0 is out of range")) << e.what();
  EXPECT_TRUE(has(e.hint(), "allowed: (0.0, 10.0]")) << e.hint();
  e = expect_config_error([] { construct<SgdOptimizer>({{"momentum", 1.0}}); });
  EXPECT_TRUE(has(e.what(), "'optimizer.momentum': must be < 1")) << e.what();
  e = expect_config_error([] { construct<SgdOptimizer>({{"weight_decay", -0.1}}); });
  EXPECT_EQ(e.key(), "optimizer.weight_decay");
  e = expect_config_error([] { construct<AdamWOptimizer>({{"beta1", -0.5}}); });
  EXPECT_TRUE(has(e.hint(), "allowed: [0.0, 1.0]")) << e.hint();
  e = expect_config_error([] { construct<AdamWOptimizer>({{"lr", 0.1}, {"beta2", 1.0}}); });
  EXPECT_TRUE(has(e.what(), "test.toml:5:1: 'optimizer.beta2': must be < 1")) << e.what();
  e = expect_config_error([] { construct<AdamWOptimizer>({{"eps", -1e-8}}); });
  EXPECT_EQ(e.key(), "optimizer.eps");
  EXPECT_NO_THROW(construct<AdamWOptimizer>({{"lr", 0.0}, {"weight_decay", 0.0}}));
}

TEST(optimizers_options, WrongTypeAndUnknownKey) {
  auto e = expect_config_error([] { construct<SgdOptimizer>({{"nesterov", std::int64_t{1}}}); });
  EXPECT_TRUE(has(e.what(), "'optimizer.nesterov': expected a boolean, got an integer 1"))
      << e.what();
  e = expect_config_error([] { construct<AdamWOptimizer>({{"beta1", std::string("0.9")}}); });
  EXPECT_TRUE(has(e.what(), "expected a number, got a string \"0.9\"")) << e.what();
  e = expect_config_error([] { construct<AdamWOptimizer>({{"lr", 0.1}, {"weight_dacay", 0.1}}); });
  EXPECT_TRUE(has(e.what(), "test.toml:5:1: 'optimizer.weight_dacay': unknown key")) << e.what();
  EXPECT_TRUE(has(e.hint(), "did you mean 'weight_decay'?")) << e.hint();
}

TEST(optimizers_options, ScheduleKeysBelongToTheHost) {
  const std::vector<std::string> host_keys{
      "type",       "schedule",  "warmup_steps", "min_lr",           "step_size",     "gamma",
      "milestones", "pct_start", "div_factor",   "final_div_factor", "clip_grad_norm"};
  for (const auto& schema : {SgdOptimizer::option_schema(), AdamWOptimizer::option_schema()}) {
    for (const auto& spec : schema)
      EXPECT_EQ(std::find(host_keys.begin(), host_keys.end(), spec.name), host_keys.end())
          << spec.name << " is a host key";
    const auto raw = test::raw_options({{"type", std::string("adamw")},
                                        {"schedule", std::string("cosine")},
                                        {"warmup_steps", std::int64_t{10}},
                                        {"min_lr", 0.0},
                                        {"clip_grad_norm", 1.0}});
    EXPECT_NO_THROW(sdk::Options::resolve("optimizer", schema, raw,
                                          sdk::SourceLocation{"test.toml", 3, 1}, host_keys));
  }
}

void expect_documented(const std::string& component, const sdk::OptionSchema& schema) {
  const std::string readme =
      std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/plugins/optimizers/README.md";
  std::vector<std::string> expected;
  for (const auto& spec : schema) expected.push_back(test::readme_row(spec));
  EXPECT_EQ(test::readme_rows(readme, component), expected)
      << "update the `" << component << "` table in " << readme;
}

TEST(optimizers_readme, OptionTablesMatchSchemas) {
  expect_documented("sgd", SgdOptimizer::option_schema());
  expect_documented("adamw", AdamWOptimizer::option_schema());
}

}  // namespace
}  // namespace mixtrain::optimizers
