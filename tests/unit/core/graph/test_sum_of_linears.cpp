// A sum of linears (add.h, linear.h): an add that alone reads two linears runs their GEMMs into
// its own output, the first writing it and the second adding to it, as LoRA's base and B adapter
// are summed. Against the ops apart (fuse_epilogues = false) from the same weights: the same
// numbers in FP32, the bf16 sum within its rounding, no pass of the add and neither linear's
// output in memory, one gradient buffer for the sum and both linears, what vetoes it (a relu the
// add runs), a layer norm reader left alone, the non-finite replay, and finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/liveness_plan.h"
#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::op;

// LoRA in small: embed's output read by a biased base linear and by A (r = 4), B (scale 2, no
// bias) after A, their sum read by `reader` ("gelu", "relu" or "layernorm"), then the head.
ModelSpec lora_block(bool fuse, const std::string& reader = "gelu") {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {op("linear", "embed", {{"out", 24}}, {"input"}),
                 op("linear", "base", {{"out", 24}}, {"embed"}),
                 op("linear", "a", {{"out", 4}, {"bias", false}}, {"embed"}),
                 op("linear", "b", {{"out", 24}, {"bias", false}, {"scale", 2.0}}, {"a"}),
                 op("add", "sum", {}, {"base", "b"}),
                 op(reader, "after", {}, {"sum"}),
                 op("linear", "head", {{"out", 5}}, {"after"})};
  spec.fuse_epilogues = fuse;
  return spec;
}

constexpr std::int64_t kRows = 11;

struct Trained {
  std::shared_ptr<test_support::CallCountingBackend> backend;
  std::unique_ptr<Model> model;
  std::map<std::string, int> forward_calls, backward_calls;
  std::vector<float> values;  // the losses of two steps, then every parameter gradient
};

void feed(Trained& r, int step) {
  std::vector<float> x(kRows * 12);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(step)) * 2.0f;
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0};
  r.backend->copy_from_host(r.model->input(kRows), x.data());
  r.backend->copy_from_host(r.model->labels(kRows), y.data());
}

// B starts away from zero (LoRA's starts at 0, where its GEMM adds nothing to see).
Trained built(const ModelSpec& spec, bool bf16) {
  Trained r;
  r.backend = std::make_shared<test_support::CallCountingBackend>();
  r.backend->counting = true;
  r.model = std::make_unique<Model>(r.backend, spec, 12, 5);
  for (auto& l : r.model->layers())
    l->set_precision(bf16 && !l->precision_sensitive()
                         ? test_support::uniform_precision(DType::bf16)
                         : sdk::OpPrecision{});
  r.model->allocate(kRows);
  r.model->init_parameters(3);
  for (auto* p : r.model->parameters())
    if (p->name == "b.weight") {
      std::vector<float> w(static_cast<std::size_t>(p->master.view().numel()));
      for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = 0.3f * std::cos(0.7f * static_cast<float>(i));
      test_support::write(p->master.view(), w);
    }
  r.model->refresh_working_copies();
  return r;
}

// Two steps of forward, loss and backward; the first step's calls counted.
Trained train(const ModelSpec& spec, bool bf16 = false) {
  Trained r = built(spec, bf16);
  for (int step = 0; step < 2; ++step) {
    feed(r, step);
    r.backend->calls.clear();
    r.model->forward(kRows);
    if (step == 0) r.forward_calls = r.backend->calls;
    r.values.push_back(r.model->loss(kRows, 1.0f, true).loss);
    r.backend->calls.clear();
    r.model->backward(kRows);
    if (step == 0) r.backward_calls = r.backend->calls;
  }
  const auto g = test_support::all_gradients(*r.model);
  r.values.insert(r.values.end(), g.begin(), g.end());
  return r;
}

sdk::TensorView output_of(const Trained& r, const std::string& node) {
  for (const auto& l : r.model->layers())
    if (l->name() == node) return l->output(kRows);
  throw std::logic_error("no node " + node);
}

int count(const std::map<std::string, int>& calls, const char* op) {
  const auto it = calls.find(op);
  return it == calls.end() ? 0 : it->second;
}

TEST(SumOfLinears, TheAddRunsBothGemmsIntoItsOutputAndNeitherOutputExists) {
  const Trained fused = train(lora_block(true));
  const Trained apart = train(lora_block(false));
  ASSERT_EQ(fused.values.size(), apart.values.size());
  // In FP32 the second GEMM's beta = 1 adds its product to the first's output as the add did.
  EXPECT_EQ(fused.values, apart.values);
  EXPECT_EQ(count(fused.forward_calls, "add"), 0) << "no pass of the add";
  EXPECT_EQ(count(apart.forward_calls, "add"), 1);
  EXPECT_EQ(count(fused.forward_calls, "gemm"), 5);
  EXPECT_EQ(output_of(fused, "base").data, nullptr);
  EXPECT_EQ(output_of(fused, "b").data, nullptr);
  EXPECT_NE(output_of(apart, "b").data, nullptr);
  // The arena holds neither output: two [rows, 24] fp32 buffers fewer.
  const std::size_t one = aligned_buffer_bytes(kRows * 24 * 4, kDefaultBufferAlignment);
  EXPECT_EQ(apart.model->activation_plan().sum_bytes - fused.model->activation_plan().sum_bytes,
            2 * one);
}

TEST(SumOfLinears, Bf16RoundsTheSumOnceLessAndStaysWithinItsRoundingOfTheOpsApart) {
  const Trained fused = train(lora_block(true), true);
  const Trained apart = train(lora_block(false), true);
  ASSERT_EQ(fused.values.size(), apart.values.size());
  EXPECT_EQ(count(fused.forward_calls, "add"), 0);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < fused.values.size(); ++i) {
    const double d = static_cast<double>(fused.values[i]) - apart.values[i];
    num += d * d;
    den += static_cast<double>(apart.values[i]) * apart.values[i];
  }
  EXPECT_GT(num, 0.0) << "bf16's sum rounded once less changes some bits";
  EXPECT_LT(std::sqrt(num / den), 1e-2);
}

TEST(SumOfLinears, BothLinearsReadTheSumsGradientWhereItLiesAndNothingCopiesIt) {
  for (bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "fused" : "apart");
    const Trained r = train(lora_block(fuse));
    // Each input's gradient is dy: both are lent its memory (memory_plan.h), so the add's
    // backward writes nothing.
    EXPECT_EQ(count(r.backward_calls, "add_backward"), 0);
  }
}

TEST(SumOfLinears, AReluTheAddRunsKeepsThePassAndALayerNormReaderRunsAlone) {
  const Trained relu = train(lora_block(true, "relu"));
  EXPECT_EQ(count(relu.forward_calls, "add"), 1) << "the add's relu needs its own pass";
  EXPECT_NE(output_of(relu, "b").data, nullptr);
  const Trained relu_apart = train(lora_block(false, "relu"));
  EXPECT_EQ(relu.values, relu_apart.values);

  // A layer norm reading the sum: the sum of linears is taken, the layer norm runs alone.
  const Trained ln = train(lora_block(true, "layernorm"));
  EXPECT_EQ(count(ln.forward_calls, "add"), 0);
  EXPECT_EQ(count(ln.forward_calls, "layernorm_add_forward"), 0);
  EXPECT_EQ(count(ln.forward_calls, "layernorm_forward"), 1);
  const Trained ln_apart = train(lora_block(false, "layernorm"));
  EXPECT_EQ(ln.values, ln_apart.values);
}

TEST(SumOfLinears, TheNonfiniteReplayRunsTheLinearsApartAndTheNextStepFusedAgain) {
  Trained r = built(lora_block(true), false);
  Model& m = *r.model;
  feed(r, 0);
  auto calls = test_support::replay_between_steps(m, kRows, *r.backend);
  EXPECT_EQ(calls.replay["add"], 1) << "the replay runs every op alone";
  EXPECT_EQ(calls.step_after["add"], 0) << "fused again after the replay";
}

TEST(SumOfLinears, AnInfiniteWeightOfBIsNamedThroughTheFusedSum) {
  Trained r = built(lora_block(true), false);
  Model& m = *r.model;
  for (auto* p : m.parameters())
    if (p->name == "b.weight") {
      std::vector<float> w = test_support::read(p->master.view());
      w[5] = std::numeric_limits<float>::infinity();
      test_support::write(p->master.view(), w);
    }
  m.refresh_working_copies();
  feed(r, 0);
  m.forward(kRows);
  EXPECT_FALSE(std::isfinite(m.loss(kRows, 1.0f, true).loss));
  const NonfiniteSite site = locate_first_nonfinite(m, kRows, 1.0f);
  EXPECT_EQ(site.node, "b");
  EXPECT_EQ(site.where, "forward b.output");
}

TEST(SumOfLinears, GradientsThroughTheFusedSumMatchFiniteDifferences) {
  Trained r = built(lora_block(true), false);
  Model& m = *r.model;
  feed(r, 0);
  m.forward(kRows);
  m.loss(kRows, 1.0f, true);
  m.backward(kRows);
  test_support::expect_finite_differences(
      m, kRows, {"base.weight", "a.weight", "b.weight", "embed.bias"}, 1e-2f, 2e-3);
}

}  // namespace
}  // namespace mixtrain::core
