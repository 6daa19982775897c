// Option validation of the scalers: schema errors from Options::resolve and the cross-option
// checks the constructors add, each with its test.toml location.
#include <gtest/gtest.h>

#include <functional>

#include "dynamic_loss_scaler.h"
#include "mixtrain/sdk/error.h"
#include "no_loss_scaler.h"
#include "plugin_test_support.h"
#include "static_loss_scaler.h"

namespace mixtrain::scalers {
namespace {

using Values = std::vector<std::pair<std::string, sdk::OptionValue>>;

template <class Scaler>
void construct(Values values) {
  test::construct<Scaler>("scaler", std::move(values));
}

using test::expect_config_error;
using test::has;

TEST(scalers_options, WrongType) {
  const auto e = expect_config_error([] {
    construct<DynamicLossScaler>({{"init_scale", 1024.0}, {"growth_interval", 2.5}});
  });
  EXPECT_TRUE(has(e.what(),
                  "test.toml:5:1: 'scaler.growth_interval': expected an integer, got "
                  "a number 2.5"))
      << e.what();
  EXPECT_EQ(e.key(), "scaler.growth_interval");
  EXPECT_EQ(e.where().line, 5u);

  const auto s = expect_config_error([] {
    construct<StaticLossScaler>({{"scale", std::string("big")}});
  });
  EXPECT_TRUE(has(s.what(), "test.toml:4:1: 'scaler.scale': expected a number")) << s.what();
}

TEST(scalers_options, OutOfRange) {
  auto e = expect_config_error([] { construct<DynamicLossScaler>({{"growth_factor", 1.0}}); });
  EXPECT_TRUE(has(e.what(), "test.toml:4:1: 'scaler.growth_factor': value 1.0 is out of range"))
      << e.what();
  EXPECT_TRUE(has(e.hint(), "allowed: > 1.0")) << e.hint();

  e = expect_config_error([] {
    construct<DynamicLossScaler>({{"growth_interval", std::int64_t{0}}});
  });
  EXPECT_TRUE(has(e.hint(), "allowed: >= 1")) << e.hint();

  e = expect_config_error([] { construct<DynamicLossScaler>({{"hysteresis", std::int64_t{0}}}); });
  EXPECT_EQ(e.key(), "scaler.hysteresis");

  e = expect_config_error([] { construct<DynamicLossScaler>({{"backoff_factor", 0.0}}); });
  EXPECT_TRUE(has(e.hint(), "allowed: (0.0, 1.0]")) << e.hint();

  e = expect_config_error([] { construct<StaticLossScaler>({{"scale", 0.0}}); });
  EXPECT_TRUE(has(e.what(), "'scaler.scale': value 0.0 is out of range")) << e.what();

  e = expect_config_error([] { construct<StaticLossScaler>({{"scale", 1e39}}); });
  EXPECT_TRUE(has(e.what(), "does not fit in a float")) << e.what();
}

TEST(scalers_options, BackoffFactorOneRejected) {
  const auto e = expect_config_error([] {
    construct<DynamicLossScaler>({{"init_scale", 8.0}, {"backoff_factor", 1.0}});
  });
  EXPECT_TRUE(has(e.what(), "test.toml:5:1: 'scaler.backoff_factor': must be < 1")) << e.what();
}

TEST(scalers_options, UnknownKeyWithSuggestion) {
  const auto e = expect_config_error([] {
    construct<DynamicLossScaler>({{"init_scale", 8.0}, {"growth_intervall", std::int64_t{10}}});
  });
  EXPECT_TRUE(has(e.what(), "test.toml:5:1: 'scaler.growth_intervall': unknown key")) << e.what();
  EXPECT_TRUE(has(e.hint(), "did you mean 'growth_interval'?")) << e.hint();
  EXPECT_TRUE(has(e.full_message(), "HINT: did you mean 'growth_interval'?"));

  const auto h = expect_config_error([] {
    construct<DynamicLossScaler>({{"hysterisis", std::int64_t{2}}});
  });
  EXPECT_TRUE(has(h.hint(), "did you mean 'hysteresis'?")) << h.hint();

  const auto n = expect_config_error([] { construct<NoLossScaler>({{"scale", 2.0}}); });
  EXPECT_TRUE(has(n.what(), "test.toml:4:1: 'scaler.scale': unknown key")) << n.what();
  EXPECT_TRUE(has(n.hint(), "this component takes no options")) << n.hint();
}

TEST(scalers_options, TypeKeyBelongsToTheHost) {
  EXPECT_NO_THROW(construct<DynamicLossScaler>({{"type", std::string("dynamic")}}));
  EXPECT_NO_THROW(construct<NoLossScaler>({{"type", std::string("none")}}));
}

TEST(scalers_options, MinScaleAboveInitScaleRejected) {
  const auto e = expect_config_error([] {
    construct<DynamicLossScaler>({{"init_scale", 1024.0}, {"min_scale", 2048.0}});
  });
  EXPECT_TRUE(has(e.what(),
                  "test.toml:5:1: 'scaler.min_scale': min_scale 2048 exceeds "
                  "init_scale 1024"))
      << e.what();
  EXPECT_TRUE(has(e.hint(), "min_scale <= init_scale <= max_scale")) << e.hint();

  // The bound the user wrote is blamed, at its own line.
  const auto d = expect_config_error([] {
    construct<DynamicLossScaler>({{"init_scale", 1e10}, {"max_scale", 1e9}});
  });
  EXPECT_EQ(d.key(), "scaler.max_scale");
  EXPECT_TRUE(has(d.what(), "init_scale 1e+10 exceeds max_scale 1e+09")) << d.what();
  const auto i = expect_config_error([] {
    construct<DynamicLossScaler>({{"min_scale", 1e5}});  // default init_scale 65536
  });
  EXPECT_EQ(i.key(), "scaler.min_scale");
  const auto j = expect_config_error([] {
    construct<DynamicLossScaler>({{"init_scale", 1e5}, {"max_scale", 1e4}});
  });
  EXPECT_EQ(j.key(), "scaler.max_scale");
  EXPECT_EQ(j.where().line, 5u);
}

TEST(scalers_options, EqualBoundsAccepted) {
  EXPECT_NO_THROW(construct<DynamicLossScaler>(
      {{"init_scale", 512.0}, {"min_scale", 512.0}, {"max_scale", 512.0}}));
}

}  // namespace
}  // namespace mixtrain::scalers
