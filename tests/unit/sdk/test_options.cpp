// sdk::Options::resolve and its helpers: every way a plugin table can be wrong must produce a
// ConfigError naming file:line:col and the dotted key, and valid tables must resolve exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/sdk/options.h"

namespace sdk = mixtrain::sdk;
using sdk::OptionSpec;
using sdk::OptionType;
using sdk::OptionValue;
using sdk::RawOption;

namespace {

const sdk::SourceLocation kTable{"run.toml", 7, 1};

sdk::SourceLocation at(std::uint32_t line, std::uint32_t col) {
  return {"run.toml", line, col};
}

sdk::OptionSchema schema() {
  return {
      OptionSpec::number("lr", 1e-3, "learning rate").greater_than(0),
      OptionSpec::number("beta", 0.9, "decay").at_least(0).at_most(1),
      OptionSpec::integer("warmup", 10, "warm-up steps").at_least(0),
      OptionSpec::boolean("nesterov", false, "use Nesterov momentum"),
      OptionSpec::string("mode", "fast", "speed").one_of({"fast", "careful", "exact"}),
      OptionSpec::string("label", "", "free text"),
  };
}

sdk::Options resolve(const std::vector<RawOption>& raw, const sdk::OptionSchema& s = schema()) {
  return sdk::Options::resolve("optimizer", s, raw, kTable);
}

std::optional<sdk::ConfigError> config_error(const std::vector<RawOption>& raw,
                                             const sdk::OptionSchema& s = schema()) {
  try {
    resolve(raw, s);
  } catch (const sdk::ConfigError& e) {
    return e;
  }
  return std::nullopt;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(sdk_Options, DefaultsWhenNothingIsGiven) {
  auto o = resolve({});
  EXPECT_EQ(o.table(), "optimizer");
  EXPECT_DOUBLE_EQ(o.get_double("lr"), 1e-3);
  EXPECT_EQ(o.get_int("warmup"), 10);
  EXPECT_FALSE(o.get_bool("nesterov"));
  EXPECT_EQ(o.get_string("mode"), "fast");
  EXPECT_EQ(o.get_string("label"), "");
  for (const auto& s : schema()) {
    EXPECT_FALSE(o.was_set(s.name)) << s.name;
    EXPECT_EQ(o.where(s.name).to_string(), "run.toml:7:1") << s.name;  // the table header
  }
}

TEST(sdk_Options, GivenValuesWinAndKeepTheirLocations) {
  auto o = resolve({{"lr", 0.5, at(8, 6)},
                    {"warmup", std::int64_t{3}, at(9, 10)},
                    {"nesterov", true, at(10, 12)},
                    {"mode", std::string("exact"), at(11, 8)},
                    {"type", std::string("sgd"), at(12, 8)}});  // a host key: ignored
  EXPECT_DOUBLE_EQ(o.get_double("lr"), 0.5);
  EXPECT_EQ(o.get_int("warmup"), 3);
  EXPECT_TRUE(o.get_bool("nesterov"));
  EXPECT_EQ(o.get_string("mode"), "exact");
  EXPECT_TRUE(o.was_set("lr"));
  EXPECT_TRUE(o.was_set("mode"));
  EXPECT_FALSE(o.was_set("beta"));
  EXPECT_EQ(o.where("lr").to_string(), "run.toml:8:6");
  EXPECT_EQ(o.where("mode").to_string(), "run.toml:11:8");
  EXPECT_EQ(o.where("beta").to_string(), "run.toml:7:1");
}

TEST(sdk_Options, IntegerIsAcceptedForANumberOptionAndWidened) {
  auto o = resolve({{"lr", std::int64_t{2}, at(8, 6)}});
  const auto& eff = o.effective();
  ASSERT_EQ(eff[0].first, "lr");
  ASSERT_TRUE(std::holds_alternative<double>(eff[0].second));
  EXPECT_EQ(std::get<double>(eff[0].second), 2.0);
  EXPECT_EQ(o.get_double("lr"), 2.0);
}

TEST(sdk_Options, WrongTypeNamesLocationKeyAndBothTypes) {
  auto e = config_error({{"lr", std::string("fast"), at(8, 6)}});
  ASSERT_TRUE(e.has_value());
  const std::string what = e->what();
  EXPECT_EQ(what.rfind("run.toml:8:6: 'optimizer.lr': ", 0), 0u) << what;
  EXPECT_TRUE(contains(what, "expected a number, got a string \"fast\"")) << what;
  EXPECT_EQ(e->key(), "optimizer.lr");
  EXPECT_EQ(e->where().line, 8u);
  EXPECT_EQ(e->where().column, 6u);
  EXPECT_TRUE(contains(e->hint(), "learning rate")) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "allowed: > 0.0")) << e->hint();
}

TEST(sdk_Options, WrongTypeForEveryKind) {
  struct Case {
    RawOption raw;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"warmup", 2.5, at(9, 10)}, "expected an integer, got a number 2.5"},
      {{"warmup", true, at(9, 10)}, "expected an integer, got a boolean true"},
      {{"nesterov", std::int64_t{1}, at(10, 12)}, "expected a boolean, got an integer 1"},
      {{"label", std::int64_t{5}, at(11, 9)}, "expected a string, got an integer 5"},
      {{"lr", false, at(8, 6)}, "expected a number, got a boolean false"},
  };
  for (const auto& c : cases) {
    auto e = config_error({c.raw});
    ASSERT_TRUE(e.has_value()) << c.expected;
    EXPECT_TRUE(contains(e->what(), c.expected)) << e->what();
    EXPECT_EQ(e->key(), "optimizer." + c.raw.key);
    EXPECT_EQ(e->where().line, c.raw.where.line);
  }
}

TEST(sdk_Options, OutOfRangeForMinMaxAndExclusiveBounds) {
  // greater_than(0): 0 itself is out.
  auto e = config_error({{"lr", 0.0, at(8, 6)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "'optimizer.lr': value 0.0 is out of range")) << e->what();
  EXPECT_TRUE(contains(e->hint(), "allowed: > 0.0")) << e->hint();
  EXPECT_NO_THROW(resolve({{"lr", 1e-30, at(8, 6)}}));

  // at_least(0).at_most(1): both ends are in, just outside is out.
  EXPECT_NO_THROW(resolve({{"beta", 0.0, at(8, 6)}}));
  EXPECT_NO_THROW(resolve({{"beta", 1.0, at(8, 6)}}));
  e = config_error({{"beta", 1.5, at(9, 8)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "run.toml:9:8: 'optimizer.beta': value 1.5 is out of range"))
      << e->what();
  EXPECT_TRUE(contains(e->hint(), "allowed: [0.0, 1.0]")) << e->hint();
  e = config_error({{"beta", std::int64_t{-1}, at(9, 8)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "value -1.0 is out of range")) << e->what();

  // Integer bounds are shown as integers.
  e = config_error({{"warmup", std::int64_t{-3}, at(10, 10)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "'optimizer.warmup': value -3 is out of range")) << e->what();
  EXPECT_TRUE(contains(e->hint(), "allowed: >= 0")) << e->hint();

  // NaN never satisfies a bound, and is refused even where there is none.
  EXPECT_TRUE(config_error({{"beta", std::nan(""), at(9, 8)}}).has_value());
  e = config_error({{"x", std::nan(""), at(9, 5)}}, {OptionSpec::number("x", 1.0, "free")});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "'optimizer.x': value nan is out of range")) << e->what();
  EXPECT_EQ(e->hint().find("allowed:  "), std::string::npos) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "nan")) << e->hint();
  // Infinity is refused unless the spec allows it, even where there is no bound; -inf always.
  const double inf = std::numeric_limits<double>::infinity();
  for (double x : {inf, -inf}) {
    e = config_error({{"x", x, at(9, 5)}}, {OptionSpec::number("x", 1.0, "free")});
    ASSERT_TRUE(e.has_value());
    EXPECT_TRUE(contains(e->what(), "is out of range")) << e->what();
    EXPECT_TRUE(contains(e->hint(), "allowed: a finite number (not nan or inf)")) << e->hint();
  }
  e = config_error({{"beta", inf, at(9, 8)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->hint(), "[0.0, 1.0]")) << e->hint();
  const sdk::OptionSchema ceiling = {
      OptionSpec::number("max", inf, "ceiling").greater_than(0).allow_infinity()};
  EXPECT_EQ(resolve({{"max", inf, at(9, 5)}}, ceiling).get_double("max"), inf);
  EXPECT_EQ(resolve({}, ceiling).get_double("max"), inf);
  EXPECT_EQ(resolve({{"max", 1e300, at(9, 5)}}, ceiling).get_double("max"), 1e300);
  EXPECT_TRUE(config_error({{"max", -inf, at(9, 5)}}, ceiling).has_value());
  e = config_error({{"max", std::nan(""), at(9, 5)}}, ceiling);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->hint(), "allowed: a number or inf (not nan), (0.0, inf]")) << e->hint();
}

TEST(sdk_Options, RangeText) {
  // An empty choice is shown, not left as nothing between commas.
  EXPECT_EQ(OptionSpec::string("x", "", "").one_of({"", "gpt"}).range_text(), "one of: \"\", gpt");
  EXPECT_EQ(OptionSpec::number("x", 1, "").greater_than(0).range_text(), "> 0.0");
  EXPECT_EQ(OptionSpec::number("x", 1, "").at_least(0.5).range_text(), ">= 0.5");
  EXPECT_EQ(OptionSpec::number("x", 1, "").at_most(2).range_text(), "<= 2.0");
  // Whole numbers are written out, not in exponent form ("10.0", not "1e+01").
  EXPECT_EQ(OptionSpec::number("x", 1, "").at_least(0).at_most(10).range_text(), "[0.0, 10.0]");
  EXPECT_EQ(OptionSpec::number("x", 1, "").greater_than(0).allow_infinity().range_text(),
            "(0.0, inf]");
  EXPECT_EQ(OptionSpec::number("x", 1, "").greater_than(0).at_most(1).range_text(), "(0.0, 1.0]");
  EXPECT_EQ(OptionSpec::integer("n", 1, "").at_least(1).at_most(8).range_text(), "[1, 8]");
  // An integer bound outside int64 (or infinite) is written as a number, never cast.
  EXPECT_EQ(OptionSpec::integer("n", 1, "").at_least(1).allow_infinity().range_text(), "[1, inf]");
  EXPECT_EQ(OptionSpec::integer("n", 1, "").at_most(1e19).range_text().rfind("<= 1", 0), 0u);
  EXPECT_EQ(OptionSpec::string("s", "a", "").one_of({"a", "b"}).range_text(), "one of: a, b");
  EXPECT_EQ(OptionSpec::string("s", "a", "").range_text(), "");
}

TEST(sdk_Options, ChoicesWithDidYouMean) {
  auto e = config_error({{"mode", std::string("carefull"), at(11, 8)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(
      contains(e->what(), "run.toml:11:8: 'optimizer.mode': 'carefull' is not a valid choice"))
      << e->what();
  EXPECT_TRUE(contains(e->hint(), "did you mean 'careful'?")) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "one of: fast, careful, exact")) << e->hint();

  e = config_error({{"mode", std::string("zzzzzzzzzz"), at(11, 8)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_FALSE(contains(e->hint(), "did you mean")) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "one of: fast, careful, exact")) << e->hint();
}

TEST(sdk_Options, UnknownKeyWithDidYouMeanAndKnownKeys) {
  auto e = config_error({{"nesterv", true, at(12, 1)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "run.toml:12:1: 'optimizer.nesterv': unknown key")) << e->what();
  EXPECT_EQ(e->key(), "optimizer.nesterv");
  EXPECT_TRUE(contains(e->hint(), "did you mean 'nesterov'?")) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "known keys: lr, beta, warmup, nesterov, mode, label"))
      << e->hint();

  // Reported even when every declared key is valid, and without a suggestion when far off.
  e = config_error({{"lr", 0.1, at(8, 6)}, {"completely_different", true, at(13, 1)}});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->key(), "optimizer.completely_different");
  EXPECT_FALSE(contains(e->hint(), "did you mean")) << e->hint();

  // A component without options says so.
  e = config_error({{"x", true, at(13, 1)}}, {});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->hint(), "takes no options")) << e->hint();
}

TEST(sdk_Options, HostKeysAreNeitherValidatedNorUnknown) {
  auto o = sdk::Options::resolve("precision", schema(), {{"policy", std::int64_t{3}, at(2, 10)}},
                                 kTable, {"policy"});
  EXPECT_EQ(o.effective().size(), schema().size());
  // "type" is the default host key, but not when another list is given.
  auto e = [] {
    try {
      sdk::Options::resolve("precision", schema(), {{"type", std::string("x"), at(2, 8)}}, kTable,
                            {"policy"});
    } catch (const sdk::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_TRUE(contains(e, "'precision.type': unknown key")) << e;
}

TEST(sdk_Options, RequiredKeyMissingNamesTableAndKey) {
  sdk::OptionSchema s = {OptionSpec::required("path", OptionType::string, "where the data is"),
                         OptionSpec::integer("n", 1, "")};
  auto e = config_error({{"n", std::int64_t{2}, at(8, 5)}}, s);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->what(), "run.toml:7:1: 'optimizer.path': required key is missing"))
      << e->what();
  EXPECT_TRUE(contains(e->hint(), "add path = <a string> to [optimizer]")) << e->hint();
  EXPECT_TRUE(contains(e->hint(), "where the data is")) << e->hint();

  auto o = resolve({{"path", std::string("/data"), at(9, 8)}}, s);
  EXPECT_EQ(o.get_string("path"), "/data");
  EXPECT_TRUE(o.was_set("path"));
}

TEST(sdk_Options, EffectiveFollowsSchemaOrderNotInputOrder) {
  auto o = resolve({{"label", std::string("x"), at(13, 9)},
                    {"mode", std::string("exact"), at(12, 8)},
                    {"lr", 0.25, at(8, 6)}});
  const auto& eff = o.effective();
  std::vector<std::string> keys;
  for (const auto& [k, v] : eff) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"lr", "beta", "warmup", "nesterov", "mode", "label"}));
  EXPECT_EQ(std::get<double>(eff[0].second), 0.25);
  EXPECT_EQ(std::get<double>(eff[1].second), 0.9);
  EXPECT_EQ(std::get<std::int64_t>(eff[2].second), 10);
  EXPECT_EQ(std::get<bool>(eff[3].second), false);
  EXPECT_EQ(std::get<std::string>(eff[4].second), "exact");
  EXPECT_EQ(std::get<std::string>(eff[5].second), "x");
}

TEST(sdk_Options, GettersRejectUndeclaredKeysAndWrongTypesAsProgrammingErrors) {
  auto o = resolve({});
  EXPECT_THROW(o.get_double("nope"), std::logic_error);
  EXPECT_THROW(o.was_set("nope"), std::logic_error);
  EXPECT_THROW(o.get_int("lr"), std::logic_error);
  EXPECT_THROW(o.get_string("warmup"), std::logic_error);
  EXPECT_THROW(o.get_bool("mode"), std::logic_error);
  EXPECT_DOUBLE_EQ(o.get_double("warmup"), 10.0);  // integers widen
  // A logic_error is not a user error: the CLI must report it as internal.
  try {
    o.get_double("nope");
  } catch (const sdk::UserError&) {
    ADD_FAILURE() << "undeclared key reported as a user error";
  } catch (const std::logic_error& e) {
    EXPECT_TRUE(contains(e.what(), "'nope'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "[optimizer]")) << e.what();
  }
}

TEST(sdk_Options, FailPointsAtTheKey) {
  auto o = resolve({{"beta", 0.5, at(9, 8)}});
  try {
    o.fail("beta", "beta must not exceed lr", "lower beta");
    FAIL() << "fail() returned";
  } catch (const sdk::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "run.toml:9:8: 'optimizer.beta': beta must not exceed lr");
    EXPECT_EQ(e.hint(), "lower beta");
    EXPECT_EQ(e.full_message(),
              "run.toml:9:8: 'optimizer.beta': beta must not exceed lr\n  HINT: lower beta");
  }
}

TEST(sdk_Options, SourceLocationSpelling) {
  EXPECT_EQ((sdk::SourceLocation{"a.toml", 3, 4}.to_string()), "a.toml:3:4");
  EXPECT_EQ((sdk::SourceLocation{"a.toml", 0, 0}.to_string()), "a.toml");
  EXPECT_EQ((sdk::SourceLocation{"", 0, 0}.to_string()), "<config>");
}

TEST(sdk_OptionValue, ToStringUsesTomlSpelling) {
  EXPECT_EQ(sdk::option_value_to_string(true), "true");
  EXPECT_EQ(sdk::option_value_to_string(false), "false");
  EXPECT_EQ(sdk::option_value_to_string(std::int64_t{-3}), "-3");
  EXPECT_EQ(sdk::option_value_to_string(std::string("a\"b\\c")), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(sdk::option_value_to_string(OptionValue{}), "<unset>");
  EXPECT_EQ(sdk::option_value_to_string(0.1), "0.1");
  EXPECT_EQ(sdk::option_value_to_string(0.5), "0.5");
  EXPECT_EQ(sdk::option_value_to_string(65536.0), "65536.0");
  EXPECT_EQ(sdk::option_value_to_string(1.0), "1.0");
  EXPECT_EQ(sdk::option_value_to_string(-2.0), "-2.0");
  EXPECT_EQ(sdk::option_value_to_string(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(sdk::option_value_to_string(-std::numeric_limits<double>::infinity()), "-inf");
}

TEST(sdk_OptionValue, StringsEscapeWhatTomlForbidsInBasicStrings) {
  // TOML basic strings may not contain raw control characters (tab excepted) or DEL.
  EXPECT_EQ(sdk::option_value_to_string(std::string("a\nb")), "\"a\\nb\"");
  EXPECT_EQ(sdk::option_value_to_string(std::string("a\r\tb")), "\"a\\r\\tb\"");
  EXPECT_EQ(sdk::option_value_to_string(std::string("\x01\x7f")), "\"\\u0001\\u007F\"");
  // Non-ASCII UTF-8 passes through unchanged.
  EXPECT_EQ(sdk::option_value_to_string(std::string("caf\xc3\xa9")), "\"caf\xc3\xa9\"");
}

TEST(sdk_OptionValue, DoublesRoundTripExactlyAndStayFloats) {
  const std::vector<double> values = {
      0.1,    1e-8,  65536.0, 0.999,   1e-5, 3.0e38,      1e300,
      5e-324, 100.0, 1e22,    1.0 / 3, -0.0, 123456789.0, 0.30000000000000004};
  for (double v : values) {
    const auto s = sdk::option_value_to_string(v);
    // A TOML float needs a fraction or an exponent; otherwise it reads back as an integer.
    EXPECT_NE(s.find_first_of(".eE"), std::string::npos) << s;
    EXPECT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
    EXPECT_EQ(std::signbit(std::strtod(s.c_str(), nullptr)), std::signbit(v)) << s;
  }
  EXPECT_EQ(std::strtod(sdk::option_value_to_string(1e-8).c_str(), nullptr), 1e-8);
}

TEST(sdk_ClosestMatch, SuggestsNearMissesOnly) {
  const std::vector<std::string> c = {"dynamic", "static", "none"};
  EXPECT_EQ(sdk::closest_match("dynamc", c), "dynamic");
  EXPECT_EQ(sdk::closest_match("statik", c), "static");
  EXPECT_EQ(sdk::closest_match("Static", c), "static");
  EXPECT_EQ(sdk::closest_match("nune", c), "none");
  EXPECT_EQ(sdk::closest_match("exponential", c), "");
  EXPECT_EQ(sdk::closest_match("dynamic", c), "dynamic");
  EXPECT_EQ(sdk::closest_match("x", {}), "");
  // The closest wins over an earlier, farther candidate.
  EXPECT_EQ(sdk::closest_match("weight_decy", {"warmup_steps", "weight", "weight_decay"}),
            "weight_decay");
}

TEST(sdk_ClosestMatch, PrefersAliasesAndShortenedNamesAndNeverRewritesAWord) {
  // Another tool's name for a key: no edits lead from one to the other.
  EXPECT_EQ(sdk::closest_match("learning_rate", {"lr", "weight_decay", "beta1"}), "lr");
  EXPECT_EQ(sdk::closest_match("learning_rate", {"weight_decay"}), "") << "lr is not here";
  // A choice shortened to its first part beats one two edits away.
  EXPECT_EQ(sdk::closest_match("fp16", {"fp32", "bf16-mixed", "fp16-mixed"}), "fp16-mixed");
  EXPECT_EQ(sdk::closest_match("fp8", {"fp8-e4m3", "fp8-e5m2"}), "") << "ambiguous";
  // Two edits of a two-letter word leave nothing of it.
  EXPECT_EQ(sdk::closest_match("lr", {"name", "seed", "dir", "steps"}), "");
}

}  // namespace
