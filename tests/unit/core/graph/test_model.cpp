// Model construction errors and buffer semantics.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {
namespace {

using test_support::cpu;

LayerSpec linear(const char* name, std::int64_t out, std::uint32_t line) {
  return test_support::op("linear", name, {{"out", out}}, {}, {"model.toml", line, 3});
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

LayerSpec act(const char* type, const char* name) {
  return test_support::op(type, name, {}, {}, {"model.toml", 1, 1});
}

// One forward/loss/backward of linear-relu-linear-gelu-linear on a fixed batch; returns the
// loss, the logits and every parameter gradient, flattened.
std::vector<float> train_step_outputs(bool fuse, const sdk::OpPrecision& precision,
                                      std::int64_t* fused_pairs = nullptr) {
  ModelSpec spec;
  spec.layers = {linear("fc1", 24, 1), act("relu", "relu1"), linear("fc2", 16, 2),
                 act("gelu", "gelu2"), linear("head", 5, 3)};
  spec.fuse_epilogues = fuse;
  // Fused means fused on every CPU, its bf16 GEMMs native or not
  // (sdk::kFeatureGemmBf16GeluUnfused).
  auto backend = std::make_shared<test_support::GeluFeatureBackend>(false);
  Model m(backend, spec, 12, 5);
  for (auto& l : m.layers()) l->set_precision(precision);
  m.allocate(9);
  m.init_parameters(11);
  if (fused_pairs != nullptr) *fused_pairs = m.fused_pairs();
  std::vector<float> x(9 * 12);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  backend->copy_from_host(m.input(9), x.data());
  backend->copy_from_host(m.labels(9), y.data());
  m.forward(9);
  m.compute_loss(9, 8.0f, true);
  m.backward(9);
  const auto lv = m.read_loss();
  std::vector<float> out{lv.loss};
  std::vector<float> logits(9 * 5);
  sdk::TensorView l32 = m.logits(9);
  if (l32.dtype == sdk::DType::fp32) {
    backend->copy_to_host(logits.data(), l32);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  for (auto* p : m.parameters()) {
    std::vector<float> g(static_cast<std::size_t>(p->grad.shape().numel()));
    backend->copy_to_host(g.data(), p->grad.view());
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

TEST(Model, LinearActivationPairsFuseAndMatchTheUnfusedStepBitForBitInFp32) {
  std::int64_t pairs_on = -1, pairs_off = -1;
  const auto fused = train_step_outputs(true, {}, &pairs_on);
  const auto unfused = train_step_outputs(false, {}, &pairs_off);
  EXPECT_EQ(pairs_on, 2);
  EXPECT_EQ(pairs_off, 0);
  ASSERT_EQ(fused.size(), unfused.size());
  EXPECT_EQ(fused, unfused);
}

TEST(Model, FusedBf16StepStaysWithinBf16RoundingOfTheUnfusedStep) {
  sdk::OpPrecision bf16;
  bf16.weight = sdk::DType::bf16;
  bf16.gemm_input = sdk::DType::bf16;
  bf16.activation = sdk::DType::bf16;
  bf16.activation_grad = sdk::DType::bf16;
  const auto fused = train_step_outputs(true, bf16);
  const auto unfused = train_step_outputs(false, bf16);
  ASSERT_EQ(fused.size(), unfused.size());
  double num = 0, den = 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < fused.size(); ++i) {
    num +=
        (static_cast<double>(fused[i]) - unfused[i]) * (static_cast<double>(fused[i]) - unfused[i]);
    den += static_cast<double>(unfused[i]) * unfused[i];
    differ += fused[i] != unfused[i];
  }
  // One rounding instead of two changes some values by a bf16 step, nothing more.
  EXPECT_GT(differ, 0u) << "fused bf16 rounds once, so it should not be bit-identical";
  EXPECT_LT(std::sqrt(num / den), 1e-2);
}

TEST(Model, ALinearFusedWithReluWritesItsPreActivationOnlyUnfusedIntoPlannedMemory) {
  ModelSpec spec;
  spec.layers = {linear("fc1", 24, 1), act("relu", "relu1"), linear("fc2", 16, 2),
                 act("gelu", "gelu2"), linear("head", 5, 3)};
  auto allocated = [&](bool fuse) {
    spec.fuse_epilogues = fuse;
    auto model = std::make_unique<Model>(cpu(), spec, 12, 5);
    for (auto& l : model->layers()) l->set_precision({});
    model->allocate(9);
    return model;
  };
  const auto fused = allocated(true);
  const auto plain = allocated(false);
  // fc1's z (9 rows x 24 fp32) is not needed by the fused relu; fc2's is (gelu's backward). The
  // activation plan holds one buffer less. Unfused, z goes into the relu's output (the relu
  // rectifies it in place), so the deferred-output plan holds nothing.
  const std::size_t z = aligned_buffer_bytes(9u * 24u * 4u, kDefaultBufferAlignment);
  EXPECT_EQ(plain->activation_plan().sum_bytes - fused->activation_plan().sum_bytes, z);
  EXPECT_TRUE(fused->executor().deferred_output_plan().nodes.empty());
  EXPECT_TRUE(plain->executor().deferred_output_plan().nodes.empty());
  EXPECT_EQ(fused->layers()[0]->output(9).data, nullptr);

  // The non-finite replay runs unfused: fc1 then writes its output into relu1's memory and
  // everything is checked (the unfused step's gradients are the fused step's: fp32, one rounding
  // either way); afterwards the model is fused again and still trains.
  fused->init_parameters(3);
  std::vector<float> x(9 * 12, 0.25f);
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  cpu()->copy_from_host(fused->input(9), x.data());
  cpu()->copy_from_host(fused->labels(9), y.data());
  auto gradients = [&] {
    std::vector<float> all;
    for (auto* t : fused->parameters()) {
      const auto g = test_support::read(t->grad.view());
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  };
  fused->forward(9);
  fused->loss(9, 1.0f, true);
  fused->backward(9);
  const std::vector<float> fused_grads = gradients();
  const NonfiniteSite site = locate_first_nonfinite(*fused, 9, 1.0f);
  EXPECT_EQ(site.where, "");
  EXPECT_EQ(site.node, "");
  EXPECT_EQ(gradients(), fused_grads);
  EXPECT_EQ(fused->layers()[0]->output(9).data, fused->layers()[1]->output(9).data);
  EXPECT_EQ(fused->fused_pairs(), 2);
  fused->forward(9);
  EXPECT_TRUE(std::isfinite(fused->loss(9, 1.0f, true).loss));
}

// The shared CPU backend, counting the allocations made through it.
class CountingBackend final : public test_support::ForwardingBackend {
 public:
  void* allocate(std::size_t bytes) override {
    ++allocations;
    return ForwardingBackend::allocate(bytes);
  }
  int allocations = 0;
};

TEST(Model, TheNonfiniteReplayAllocatesNothing) {
  // Fused pairs (fc1 + relu defers z), a tensor with two readers (its gradient sums through a
  // scratch), and a replay that finds nothing (every node runs) or stops at a NaN weight.
  ModelSpec spec;
  spec.graph = true;
  using test_support::op;
  spec.layers = {
      op("linear", "fc1", {{"out", 16}}, {"input"}), op("relu", "relu1", {}, {"fc1"}),
      op("linear", "fc2", {{"out", 16}}, {"relu1"}), op("gelu", "gelu2", {}, {"fc2"}),
      op("add", "sum", {}, {"gelu2", "relu1"}),      op("linear", "head", {{"out", 5}}, {"sum"})};
  auto backend = std::make_shared<CountingBackend>();
  Model m(backend, spec, 12, 5);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(9);
  m.init_parameters(3);
  ASSERT_EQ(m.fused_pairs(), 2);
  std::vector<float> x(9 * 12, 0.25f);
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  backend->copy_from_host(m.input(9), x.data());
  backend->copy_from_host(m.labels(9), y.data());
  // A training step first: whatever a step grows on demand is there before the replay.
  m.begin_micro_batch(0, 1);
  m.forward(9);
  ASSERT_TRUE(std::isfinite(m.loss(9, 1.0f, true).loss));
  m.backward(9);

  const int before = backend->allocations;
  EXPECT_EQ(locate_first_nonfinite(m, 9, 1.0f).where, "");
  EXPECT_EQ(backend->allocations, before) << "a replay that runs every node";
  ModelParameter& w = m.layers()[2]->parameters()[0];  // fc2.weight
  auto values = test_support::read(w.master.view());
  values[5] = std::nanf("");
  test_support::write(w.master.view(), values);
  EXPECT_EQ(locate_first_nonfinite(m, 9, 1.0f).where, "forward fc2.output");
  EXPECT_EQ(backend->allocations, before) << "a replay that stops at a NaN";
}

// A model with no fused pair still runs with fusion on (its layers accumulate a gradient with
// several readers in the kernel, in FP32): the replay turns fusion off for itself and back on,
// so the steps after it compute the bits of the steps before it.
TEST(Model, TheNonfiniteReplayLeavesFusionOnInAModelWithoutFusedPairs) {
  ModelSpec spec;
  spec.graph = true;
  using test_support::op;
  spec.layers = {op("linear", "fc1", {{"out", 16}}, {"input"}),
                 op("linear", "fc2", {{"out", 16}}, {"fc1"}), op("add", "sum", {}, {"fc1", "fc2"}),
                 op("linear", "head", {{"out", 5}}, {"sum"})};
  auto backend = std::make_shared<backend_cpu::CpuBackend>(1);
  Model m(backend, spec, 12, 5);
  for (auto& l : m.layers()) l->set_precision(test_support::uniform_precision(sdk::DType::fp16));
  m.allocate(9);
  m.init_parameters(4);
  ASSERT_EQ(m.fused_pairs(), 0);
  std::vector<float> x(9 * 12);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.61f * static_cast<float>(i)) * 3.0f;
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  backend->copy_from_host(m.input(9), x.data());
  backend->copy_from_host(m.labels(9), y.data());
  const auto step = [&] {
    m.begin_micro_batch(0, 1);
    m.forward(9);
    m.compute_loss(9, 1024.0f, true);
    m.backward(9);
    std::vector<float> out;
    for (auto* p : m.parameters()) {
      const auto g = test_support::read(p->grad.view());
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  const std::vector<float> before = step();
  EXPECT_TRUE(m.epilogue_fusion());
  EXPECT_EQ(locate_first_nonfinite(m, 9, 1024.0f).where, "");
  EXPECT_TRUE(m.epilogue_fusion());
  EXPECT_EQ(step(), before);
  // A setting of the caller's own is kept too.
  m.set_epilogue_fusion(false);
  EXPECT_EQ(locate_first_nonfinite(m, 9, 1024.0f).where, "");
  EXPECT_FALSE(m.epilogue_fusion());
}

// A model built with fuse_epilogues = false (the config's model.fuse_epilogues) stays unfused
// after a replay, as one built fused stays fused.
TEST(Model, TheNonfiniteReplayKeepsAModelBuiltUnfusedUnfused) {
  ModelSpec spec;
  spec.layers = {linear("fc1", 24, 1), act("relu", "relu1"), linear("head", 5, 3)};
  spec.fuse_epilogues = false;
  auto backend = std::make_shared<backend_cpu::CpuBackend>(1);
  Model m(backend, spec, 12, 5);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(9);
  m.init_parameters(2);
  EXPECT_FALSE(m.epilogue_fusion());
  EXPECT_EQ(m.fused_pairs(), 0);
  std::vector<float> x(9 * 12, 0.5f);
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  backend->copy_from_host(m.input(9), x.data());
  backend->copy_from_host(m.labels(9), y.data());
  m.forward(9);
  m.compute_loss(9, 1.0f, true);
  m.backward(9);
  EXPECT_EQ(locate_first_nonfinite(m, 9, 1.0f).where, "");
  EXPECT_FALSE(m.epilogue_fusion());
  EXPECT_EQ(m.fused_pairs(), 0);
}

}  // namespace
}  // namespace mixtrain::core
