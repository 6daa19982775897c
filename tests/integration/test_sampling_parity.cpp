// `mixtrain sample`'s logits processing against Hugging Face's own processors
// (sampling_reference.py under the peers venv, python_peers.h): repetition penalty, temperature,
// top-k and top-p on random logits, the same candidates with the same probabilities (1e-6: HF
// warps in fp32, mixtrain in double), and the same greedy choice. Skipped without transformers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <vector>

#include "cli_test_support.h"
#include "mixtrain/core/generate/text_generation.h"
#include "python_peers.h"

namespace mixtrain::test {
namespace {

struct Case {
  std::vector<float> logits;
  std::vector<std::int32_t> context;
  core::SamplingOptions o;
};

std::vector<Case> cases() {
  std::mt19937 gen(2026);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<std::int32_t> id(0, 99);
  std::vector<Case> out;
  auto add = [&](double temperature, std::int64_t top_k, double top_p, double penalty) {
    Case c;
    for (int i = 0; i < 100; ++i) c.logits.push_back(normal(gen));
    for (int i = 0; i < 12; ++i) c.context.push_back(id(gen));
    c.o.temperature = temperature;
    c.o.top_k = top_k;
    c.o.top_p = top_p;
    c.o.repetition_penalty = penalty;
    out.push_back(std::move(c));
  };
  for (double t : {0.7, 1.0, 1.6})
    for (double p : {0.05, 0.5, 0.9, 0.99, 1.0}) add(t, 0, p, 1.0);
  for (std::int64_t k : {1, 5, 40}) add(1.0, k, 0.8, 1.0);
  for (double penalty : {0.8, 1.3, 2.0}) {
    add(1.0, 0, 1.0, penalty);
    add(0.9, 20, 0.9, penalty);
    add(0.0, 0, 1.0, penalty);  // greedy: the penalty still applies
  }
  return out;
}

class SamplingParity : public CliTest {};

TEST_F(SamplingParity, CandidatesAndProbabilitiesAreHuggingFacesOwn) {
  if (!peers_import("transformers, torch"))
    GTEST_SKIP() << peers_missing_message("transformers, torch", "sampling parity not tested");
  const auto all = cases();
  json in = json::array();
  for (const auto& c : all)
    in.push_back({{"logits", c.logits},
                  {"context", c.context},
                  {"temperature", c.o.temperature},
                  {"top_k", c.o.top_k},
                  {"top_p", c.o.top_p},
                  {"repetition_penalty", c.o.repetition_penalty}});
  std::ofstream(dir_ / "cases.json") << in.dump();
  const auto out = dir_ / "py.out", err = dir_ / "py.err";
  const std::string cmd =
      peers_python() + " " + MIXTRAIN_CONFIGS_DIR + "/../tests/integration/sampling_reference.py " +
      (dir_ / "cases.json").string() + " >" + out.string() + " 2>" + err.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(err);
  const json r = json::parse(slurp(out), nullptr, false);
  ASSERT_TRUE(r.is_object() && r.contains("cases")) << slurp(out);
  ASSERT_EQ(r["cases"].size(), all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto logits = all[i].logits;
    core::apply_repetition_penalty(logits, all[i].context, all[i].o.repetition_penalty);
    const auto& theirs = r["cases"][i];
    if (all[i].o.temperature == 0.0) {
      core::DataRng rng(1, 2);
      EXPECT_EQ(core::sample_token(logits, all[i].o, rng), theirs["argmax"].get<std::int32_t>())
          << "case " << i;
      continue;
    }
    const auto ours = core::sampling_distribution(logits, all[i].o);
    ASSERT_EQ(theirs["probs"].size(), ours.size());
    int candidates = 0;
    for (std::size_t v = 0; v < ours.size(); ++v) {
      const double t = theirs["probs"][v].get<double>();
      EXPECT_EQ(ours[v] > 0.0, t > 0.0) << "case " << i << " id " << v;
      EXPECT_NEAR(ours[v], t, 1e-6) << "case " << i << " id " << v;
      candidates += ours[v] > 0.0;
    }
    EXPECT_GE(candidates, 1) << "case " << i;
  }
}

// The nucleus keeps at least the likeliest token, and a run of equal logits whole.
TEST(Sampling, TheNucleusKeepsTheLikeliestAndTiesWhole) {
  core::SamplingOptions o;
  o.temperature = 1.0;
  o.top_p = 1e-12;
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f};
  auto p = core::sampling_distribution(logits, o);
  EXPECT_EQ(p, (std::vector<double>{0.0, 0.5, 0.0, 0.5}));  // the tied best two, nothing else
  o.top_p = 1.0;
  p = core::sampling_distribution(logits, o);
  for (double v : p) EXPECT_GT(v, 0.0);
  // Draws land only inside the nucleus.
  o.top_p = 0.6;
  core::DataRng rng(7, 1);
  for (int i = 0; i < 200; ++i) {
    const auto id = core::sample_token(logits, o, rng);
    EXPECT_TRUE(id == 1 || id == 3) << id;
  }
}

TEST(Sampling, OptionsOutOfRangeAreUserErrors) {
  auto refused = [](auto edit) {
    core::SamplingOptions o;
    edit(o);
    EXPECT_THROW(core::check_sampling_options(o), sdk::UserError);
  };
  refused([](auto& o) { o.top_p = 0.0; });
  refused([](auto& o) { o.top_p = 1.0 + 1e-9; });
  refused([](auto& o) { o.top_p = std::nan(""); });
  refused([](auto& o) { o.repetition_penalty = 0.0; });
  refused([](auto& o) { o.repetition_penalty = INFINITY; });
  refused([](auto& o) { o.temperature = -0.5; });
  refused([](auto& o) { o.top_k = -1; });
  refused([](auto& o) { o.vocabulary = -1; });
  EXPECT_NO_THROW(core::check_sampling_options(core::SamplingOptions{}));
}

}  // namespace
}  // namespace mixtrain::test
