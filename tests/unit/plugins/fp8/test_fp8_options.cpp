// Options of fp8-delayed and fp8-current: defaults, errors with their test.toml location and
// "did you mean", and the README tables against the schemas.
#include <gtest/gtest.h>

#include "fp8_test_support.h"

namespace mixtrain::fp8 {
namespace {

using namespace testing;

sdk::ConfigError config_error(const std::function<void()>& make) {
  try {
    make();
  } catch (const sdk::ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return sdk::ConfigError({}, "", "");
}

std::string full(const sdk::ConfigError& e) {
  return e.full_message();
}

TEST(fp8_options, Defaults) {
  test::CapturingSink sink;
  auto d = make_delayed(sink);
  EXPECT_EQ(d->format(), Fp8Format::hybrid);
  EXPECT_EQ(d->margin(), 0);
  EXPECT_EQ(d->amax_history_len(), 1024u);
  EXPECT_EQ(d->amax_compute_algo(), AmaxComputeAlgo::max);
  EXPECT_EQ(d->amax_update(), AmaxUpdate::fused) << "Transformer Engine's default";
  EXPECT_EQ(d->interval(), 1);
  EXPECT_EQ(d->base().name, "bf16-mixed");
  auto c = make_current(sink);
  EXPECT_EQ(c->format(), Fp8Format::hybrid);
  EXPECT_EQ(c->base().name, "bf16-mixed");
}

TEST(fp8_options, UnknownFormatNamesTheLocationAndSuggests) {
  test::CapturingSink sink;
  const auto e = config_error([&] {
    make_delayed(sink, {{"margin", std::int64_t{1}}, {"fp8_format", std::string("hybird")}});
  });
  EXPECT_TRUE(has(e.what(), "test.toml:5:1")) << e.what();
  EXPECT_TRUE(has(e.what(), "'hybird' is not a valid choice")) << e.what();
  EXPECT_TRUE(has(full(e), "did you mean 'hybrid'?")) << full(e);
  EXPECT_EQ(e.key(), "precision.fp8_format");

  const auto c = config_error([&] { make_current(sink, {{"fp8_format", std::string("e4m2")}}); });
  EXPECT_TRUE(has(c.what(), "test.toml:4:1")) << c.what();
  EXPECT_TRUE(has(full(c), "did you mean 'e4m3'?")) << full(c);
}

TEST(fp8_options, OutOfRangeValuesNameTheLocation) {
  test::CapturingSink sink;
  const auto m = config_error([&] { make_delayed(sink, {{"margin", std::int64_t{33}}}); });
  EXPECT_TRUE(has(m.what(), "test.toml:4:1")) << m.what();
  EXPECT_TRUE(has(m.what(), "value 33 is out of range")) << m.what();
  EXPECT_TRUE(has(full(m), "[0, 32]")) << full(m);
  EXPECT_TRUE(has(config_error([&] {
                    make_current(sink, {{"margin", std::int64_t{-1}}});
                  }).what(),
                  "value -1 is out of range"));
  const auto h = config_error([&] {
    make_delayed(sink, {{"interval", std::int64_t{2}}, {"amax_history_len", std::int64_t{65537}}});
  });
  EXPECT_TRUE(has(h.what(), "test.toml:5:1")) << h.what();
  EXPECT_TRUE(has(full(h), "[1, 65536]")) << full(h);
  EXPECT_TRUE(has(config_error([&] {
                    make_delayed(sink, {{"amax_history_len", std::int64_t{0}}});
                  }).what(),
                  "out of range"));
  EXPECT_TRUE(has(config_error([&] {
                    make_delayed(sink, {{"interval", std::int64_t{0}}});
                  }).what(),
                  "out of range"));
}

TEST(fp8_options, OtherChoicesAndUnknownKeys) {
  test::CapturingSink sink;
  EXPECT_TRUE(has(full(config_error([&] {
                    make_delayed(sink, {{"amax_compute_algo", std::string("most-recent")}});
                  })),
                  "did you mean 'most_recent'?"));
  EXPECT_TRUE(has(full(config_error([&] {
                    make_delayed(sink, {{"amax_update", std::string("unfsued")}});
                  })),
                  "did you mean 'unfused'?"));
  EXPECT_EQ(make_delayed(sink, {{"amax_update", std::string("unfused")}})->amax_update(),
            AmaxUpdate::unfused);
  EXPECT_TRUE(has(full(config_error([&] {
                    make_delayed(sink, {{"base", std::string("bf16_mixed")}});
                  })),
                  "did you mean 'bf16-mixed'?"));
  const auto u = config_error([&] {
    make_current(sink, {{"amax_history_len", std::int64_t{16}}});
  });
  EXPECT_TRUE(has(u.what(), "test.toml:4:1")) << u.what() << " (fp8-current has no history)";
  const auto t = config_error([&] { make_delayed(sink, {{"margin", 1.5}}); });
  EXPECT_TRUE(has(t.what(), "expected an integer")) << t.what();
}

const std::string kReadme = std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/plugins/fp8/README.md";

void expect_documented(const std::string& component, const sdk::OptionSchema& schema) {
  std::vector<std::string> expected;
  for (const auto& spec : schema) expected.push_back(test::readme_row(spec));
  EXPECT_EQ(test::readme_rows(kReadme, component), expected)
      << "update the `" << component << "` table in " << kReadme;
}

TEST(fp8_readme, OptionTablesMatchSchemas) {
  expect_documented("fp8-delayed", DelayedScalingPolicy::option_schema());
  expect_documented("fp8-current", CurrentScalingPolicy::option_schema());
}

}  // namespace
}  // namespace mixtrain::fp8
