// The dropout op on the CPU backend: its key (replay, steps, micro-batches, replicas, seeds), its
// keep rate, evaluation mode, the op's spec errors and its plan-time check on a backend without
// the facet. The finite-difference check is in test_layer_gradients.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "graph/ops/dropout.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::cpu;
using test_support::op;
using test_support::random_vector;
using test_support::read;
using test_support::write;

// A dropout layer on [rows, cols] with its input filled (no zeros, so y == 0 means dropped).
struct Fixture {
  DropoutLayer layer;
  Tensor x;
  std::int64_t rows;
  Fixture(float p, std::int64_t rows_, std::int64_t cols, const std::string& name = "drop",
          DType dtype = DType::fp32)
      : layer(name, cols, p), x(cpu(), dtype, sdk::Shape{rows_, cols}), rows(rows_) {
    sdk::OpPrecision prec;
    prec.activation = prec.activation_grad = dtype;
    layer.set_precision(prec);
    layer.allocate(cpu(), rows);
    layer.init_parameters(42);
    auto v = random_vector(static_cast<std::size_t>(rows * cols), 3, 0.5f, 2.0f);
    Tensor f32(cpu(), DType::fp32, sdk::Shape{rows, cols});
    write(f32.view(), v);
    cpu()->cast(f32.view(), x.view());
  }
  std::vector<float> forward() {
    layer.forward(x.view(), rows);
    return read(layer.output(rows));
  }
};

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

TEST(Dropout, TheSameKeyGivesTheSameMaskSoAReplayOfTheStepSeesIt) {
  Fixture f(0.5f, 16, 64);
  f.layer.begin_micro_batch(0, 3);
  const auto first = f.forward();
  const auto replay = f.forward();  // the non-finite replay re-runs forward in the same step
  EXPECT_EQ(bits(first), bits(replay));
  std::int64_t dropped = 0;
  for (float v : first) dropped += v == 0.0f;
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, static_cast<std::int64_t>(first.size()));
}

TEST(Dropout, StepsMicroBatchesNodesAndRunSeedsDrawDifferentMasks) {
  Fixture f(0.5f, 16, 64);
  auto mask = [&](std::int64_t step, std::int64_t micro) {
    f.layer.begin_micro_batch(micro, step);
    std::vector<bool> m;
    for (float v : f.forward()) m.push_back(v != 0.0f);
    return m;
  };
  const auto base = mask(3, 0);
  EXPECT_NE(mask(4, 0), base) << "the next optimizer step";
  EXPECT_NE(mask(3, 1), base) << "the next micro-batch";
  EXPECT_EQ(mask(3, 0), base) << "back to the same step and micro-batch";
  Fixture other(0.5f, 16, 64, "other");
  other.layer.begin_micro_batch(0, 3);
  std::vector<bool> m;
  for (float v : other.forward()) m.push_back(v != 0.0f);
  EXPECT_NE(m, base) << "another node";
  f.layer.init_parameters(43);
  EXPECT_NE(mask(3, 0), base) << "another run seed";
}

TEST(Dropout, KeptElementsAreScaledByOneOverOneMinusPAndTheBackwardUsesTheSameMask) {
  const float p = 0.25f;
  Fixture f(p, 8, 33);
  f.layer.begin_micro_batch(0, 1);
  const auto x = read(f.x.view());
  const auto y = f.forward();
  Tensor dy(cpu(), DType::fp32, sdk::Shape{8, 33}), dx(cpu(), DType::fp32, sdk::Shape{8, 33});
  const auto g = random_vector(y.size(), 9, 0.5f, 2.0f);
  write(dy.view(), g);
  f.layer.backward(f.x.view(), dy.view(), dx.view(), 8);
  const auto dxv = read(dx.view());
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0.0f) {
      EXPECT_EQ(dxv[i], 0.0f) << i;
      continue;
    }
    EXPECT_EQ(y[i], x[i] * (1.0f / (1.0f - p))) << i;
    EXPECT_EQ(dxv[i], g[i] * (1.0f / (1.0f - p))) << i;
  }
}

TEST(Dropout, TheKeepRateIsOneMinusPWithinFiveSigmaOverAMillionElements) {
  for (const float p : {0.1f, 0.5f, 0.8f}) {
    Fixture f(p, 1000, 1000);
    f.layer.begin_micro_batch(0, 1);
    const auto y = f.forward();
    double kept = 0;
    for (float v : y) kept += v != 0.0f;
    const double n = static_cast<double>(y.size());
    const double sigma = std::sqrt(p * (1.0 - p) / n);
    EXPECT_LT(std::abs(kept / n - (1.0 - p)), 5 * sigma) << "p = " << p;
  }
}

TEST(Dropout, EvaluationModeAndPZeroAreTheIdentityBitForBit) {
  for (const DType t : {DType::fp32, DType::bf16}) {
    Fixture f(0.5f, 8, 40, "drop", t);
    f.layer.begin_micro_batch(0, 5);
    f.layer.set_training(false);
    EXPECT_EQ(bits(f.forward()), bits(read(f.x.view()))) << sdk::dtype_name(t);
    Fixture zero(0.0f, 8, 40, "drop", t);
    EXPECT_EQ(bits(zero.forward()), bits(read(zero.x.view()))) << sdk::dtype_name(t);
    EXPECT_TRUE(zero.layer.backend_needs(t).empty()) << "p = 0 never calls the facet";
  }
}

ModelSpec dropout_model(double p, sdk::SourceLocation where = {}) {
  ModelSpec spec;
  spec.layers = {op("linear", "fc1", {{"out", 16}}), op("dropout", "drop", {{"p", p}}, {}, where),
                 op("linear", "head", {{"out", 3}})};
  return spec;
}

TEST(Dropout, AModelDrawsPerStepAndResumesFromTheStepCount) {
  auto make = [] {
    auto m = std::make_unique<Model>(cpu(), dropout_model(0.5), 6, 3);
    for (auto& l : m->layers()) l->set_precision({});
    m->allocate(4);
    m->init_parameters(5);
    std::vector<float> x = random_vector(24, 1);
    write(m->input(4), x);
    std::vector<std::int32_t> labels = {0, 1, 2, 0};
    cpu()->copy_from_host(m->labels(4), labels.data());
    return m;
  };
  auto loss_at = [](Model& m, std::int64_t step) {
    m.begin_micro_batch(0, 1, step);
    m.forward(4);
    return m.loss(4, 1.0f, false).loss;
  };
  auto a = make(), b = make();
  const float step1 = loss_at(*a, 1), step2 = loss_at(*a, 2);
  EXPECT_NE(step1, step2) << "a new step draws a new mask";
  // A fresh model (a resumed run) at the same step draws what the first one drew.
  EXPECT_EQ(loss_at(*b, 2), step2);
  EXPECT_EQ(loss_at(*b, 1), step1);
}

// The shifted key reads the same bits as the key from that element on, for offsets small and
// past 2^32, and offset 0 is the key itself.
TEST(Dropout, AKeyFromAnElementReadsTheKeysBitsFromThatElementOn) {
  const sdk::DropoutKey key{0x5EEDull, (7ull << 32) | 1u};
  const std::uint32_t threshold = sdk::dropout_threshold(0.5f);
  EXPECT_EQ(dropout_key_from_element(key, 0).seed, key.seed);
  for (const std::uint64_t first : {1ull, 3ull, 1000ull, (1ull << 32) + 5, ~0ull - 4096}) {
    const sdk::DropoutKey shifted = dropout_key_from_element(key, first);
    EXPECT_EQ(shifted.stream, key.stream);
    std::int64_t differs_from_unshifted = 0;
    for (std::uint64_t i = 0; i < 4096; ++i) {
      ASSERT_EQ(sdk::dropout_keeps(shifted, i, threshold),
                sdk::dropout_keeps(key, first + i, threshold))
          << "first " << first << ", element " << i;
      differs_from_unshifted +=
          sdk::dropout_keeps(shifted, i, threshold) != sdk::dropout_keeps(key, i, threshold);
    }
    EXPECT_GT(differs_from_unshifted, 1000) << "first " << first;
  }
}

// Data parallel: a replica computing some samples of the global batch draws, for each sample,
// the mask one process draws for it, so runs with dropout do not depend on the rank count
// (stochastic rounding, by contrast, draws per replica: test_data_parallel). A sample is one row
// of a feature model and several rows of a token model (its T positions): both are checked.
TEST(Dropout, AReplicasSamplesDrawTheMasksOneProcessDrawsForThem) {
  const std::int64_t cols = 48;
  Fixture whole(0.5f, 8, cols);
  whole.layer.begin_micro_batch(1, 7);
  const auto all = whole.forward();
  const std::vector<float> x = read(whole.x.view());
  for (const std::int64_t rows_per_sample : {1, 2}) {
    // Four replicas of two rows each: 2 samples of one row, or 1 sample of two rows.
    const std::int64_t per_replica = 2 / rows_per_sample;
    for (const std::int64_t replica : {0, 1, 2, 3}) {
      Fixture part(0.5f, 2, cols);
      const auto from = static_cast<std::ptrdiff_t>(replica * 2 * cols),
                 to = static_cast<std::ptrdiff_t>((replica + 1) * 2 * cols);
      write(part.x.view(), std::vector<float>(x.begin() + from, x.begin() + to));
      part.layer.begin_micro_batch(1, 7, /*draw=*/replica * 2 + 1,
                                   SampleRange{replica * per_replica, per_replica});
      const auto y = part.forward();
      EXPECT_EQ(bits(y), bits(std::vector<float>(all.begin() + from, all.begin() + to)))
          << "replica " << replica << ", rows per sample " << rows_per_sample;
      // Backward applies the same samples' mask.
      Tensor dy(cpu(), DType::fp32, sdk::Shape{2, cols}),
          dx(cpu(), DType::fp32, sdk::Shape{2, cols});
      write(dy.view(), std::vector<float>(static_cast<std::size_t>(2 * cols), 1.0f));
      part.layer.backward(part.x.view(), dy.view(), dx.view(), 2);
      const auto g = read(dx.view());
      for (std::size_t i = 0; i < g.size(); ++i)
        ASSERT_EQ(g[i] == 0.0f, y[i] == 0.0f) << "replica " << replica << ", element " << i;
    }
  }
}

TEST(Dropout, POfOneOrOutsideTheRangeStopsAtTheNodesConfigLine) {
  const sdk::SourceLocation where{"model.toml", 7, 3};
  for (const double p : {1.0, -0.1, 1.5}) {
    try {
      Model m(cpu(), dropout_model(p, where), 6, 3);
      ADD_FAILURE() << "p = " << p << " was accepted";
    } catch (const sdk::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("model.toml:7:3"), std::string::npos) << what;
      EXPECT_NE(what.find("p"), std::string::npos) << what;
      if (p == 1.0) {
        EXPECT_NE(e.hint().find("p below 1"), std::string::npos) << e.hint();
      }
    }
  }
}

// A backend with every facet of the CPU's but dropout: the plan stops before anything runs.
class NoDropoutBackend final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::DropoutFacet::kName ? nullptr : in_->find_facet(name);
  }
};

TEST(Dropout, ABackendWithoutTheFacetStopsAtPlanTimeNamingTheNodeAndTheFacet) {
  auto backend = std::make_shared<NoDropoutBackend>();
  Model m(backend, dropout_model(0.1, {"model.toml", 9, 5}), 6, 3);
  for (auto& l : m.layers()) l->set_precision({});
  try {
    m.allocate(4);
    FAIL() << "the plan accepted a backend without the dropout facet";
  } catch (const sdk::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("drop"), std::string::npos) << what;
    EXPECT_NE(what.find("dropout.dropout_forward"), std::string::npos) << what;
    EXPECT_NE(what.find("no dropout facet"), std::string::npos) << what;
  }
  // p = 0 never calls it, so the same backend runs that model.
  Model zero(backend, dropout_model(0.0), 6, 3);
  for (auto& l : zero.layers()) l->set_precision({});
  EXPECT_NO_THROW(zero.allocate(4));
}

}  // namespace
}  // namespace mixtrain::core
