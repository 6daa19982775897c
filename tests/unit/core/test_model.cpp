// Model construction errors and buffer semantics.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "cpu_backend.h"
#include "mixtrain/core/model.h"

namespace mixtrain::core {
namespace {

std::shared_ptr<sdk::DeviceBackend> cpu() {
  static auto b = std::make_shared<backend_cpu::CpuBackend>(1);
  return b;
}

LayerSpec linear(const char* name, std::int64_t out, std::uint32_t line) {
  return {"linear", name, out, true, 1e-5, {"model.toml", line, 3}};
}

TEST(Model, LastLayerMustMatchTheClasses) {
  ModelSpec spec;
  spec.layers = {linear("fc1", 8, 4), linear("head", 5, 5)};
  try {
    Model m(cpu(), spec, 4, 10);
    FAIL() << "expected a ConfigError";
  } catch (const sdk::ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("model.toml:5:3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("10 classes"), std::string::npos) << msg;
    EXPECT_NE(e.hint().find("out = 10"), std::string::npos) << e.hint();
  }
}

TEST(Model, DuplicateLayerNamesAreRejected) {
  ModelSpec spec;
  spec.layers = {linear("fc", 8, 4), linear("fc", 3, 7)};
  try {
    Model m(cpu(), spec, 4, 3);
    FAIL() << "expected a ConfigError";
  } catch (const sdk::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.toml:7:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("duplicate layer name 'fc'"), std::string::npos);
  }
}

TEST(Model, SameSeedSameWeightsDifferentSeedDifferent) {
  ModelSpec spec;
  spec.layers = {linear("fc1", 8, 1), linear("head", 3, 2)};
  auto weights = [&](std::uint64_t seed) {
    Model m(cpu(), spec, 4, 3);
    for (auto& l : m.layers()) l->set_precision({});
    m.allocate(2);
    m.init_parameters(seed);
    std::vector<float> w(32);
    cpu()->copy_to_host(w.data(), m.parameters()[0]->master.view());
    return w;
  };
  EXPECT_EQ(weights(5), weights(5));
  EXPECT_NE(weights(5), weights(6));
  // PyTorch's nn.Linear bound: |w| <= 1/sqrt(in_features).
  for (float v : weights(5)) EXPECT_LE(std::abs(v), 0.5f);
}

TEST(Model, SmallerBatchesUseAPrefixOfTheBuffers) {
  ModelSpec spec;
  spec.layers = {linear("head", 3, 1)};
  Model m(cpu(), spec, 2, 3);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(8);
  m.init_parameters(0);
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<std::int32_t> y = {0, 1};
  cpu()->copy_from_host(m.input(2), x.data());
  cpu()->copy_from_host(m.labels(2), y.data());
  m.forward(2);
  auto full = m.loss(2, 1.0f, false);
  EXPECT_TRUE(std::isfinite(full.loss));
  EXPECT_GE(full.correct, 0);
  EXPECT_LE(full.correct, 2);
  EXPECT_EQ(m.logits(2).shape, (sdk::Shape{2, 3}));
}

}  // namespace
}  // namespace mixtrain::core
