// The CNN fusions through the model on the core tests' CPU backend: add + ReLU, and batch norm +
// add + ReLU (docs/model-graph.md): fused against unfused bit for bit in fp32, within bf16
// rounding in bf16, the fallback on a backend without the fused op, and the non-finite replay,
// which runs the pairs unfused and still names batch norm's output.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cnn_test_support.h"
#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "forwarding_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/backend_residual.h"

namespace mixtrain::core {
namespace {

using namespace cnn_testing;
using sdk::DType;
using test_support::cpu;
using test_support::read;
using test_support::write;

// One fp32 training step of a small ResNet: the loss and every gradient, flattened; `views`
// receives how many relu nodes became views of the op before them.
std::vector<float> resnet_step(bool fuse, int* views) {
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {4, 8};
  p.classes = 3;
  ModelSpec spec = graph(resnet_preset(p));
  spec.fuse_epilogues = fuse;
  Model m(cpu(), spec, 3 * 8 * 8, 3, image(3, 8, 8));
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(4);
  m.init_parameters(5);
  feed(m, 4, 2);
  const std::vector<float> out = loss_and_gradients(m, 4);
  *views = 0;
  for (auto& l : m.layers()) *views += l->type() == "relu" && l->is_view();
  return out;
}

TEST(CnnFusion, ResidualAddTakesItsReluAndMatchesTheUnfusedStepBitForBit) {
  int fused_views = 0, plain_views = 0;
  const auto fused = resnet_step(true, &fused_views);
  const auto plain = resnet_step(false, &plain_views);
  // stem bn1 + per block bn1 and the add: 1 + 2 + 2 relus taken in.
  EXPECT_EQ(fused_views, 5);
  EXPECT_EQ(plain_views, 0);
  ASSERT_EQ(fused.size(), plain.size());
  EXPECT_EQ(fused, plain);
}

// One training step of a small Bottleneck ResNet (two blocks, the first with a projection
// shortcut), then an evaluation forward: the loss, every gradient, the running statistics and the
// evaluation logits, flattened.
struct BottleneckStep {
  std::vector<float> values;
  std::int64_t fused_pairs = 0;
  std::size_t activation_bytes = 0;
  std::vector<std::string> unwritten;  // nodes whose output was never written (fused into the add)
  std::size_t deferred_buffers = 0;    // the replay's own buffers (memory_plan.h)
};

BottleneckStep bottleneck_step(std::shared_ptr<sdk::DeviceBackend> backend, bool fuse,
                               DType dtype) {
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {4, 8};
  p.block = ResNetBlock::bottleneck;
  p.classes = 3;
  ModelSpec spec = graph(resnet_preset(p));
  spec.fuse_epilogues = fuse;
  Model m(std::move(backend), spec, 3 * 8 * 8, 3, image(3, 8, 8));
  for (auto& l : m.layers()) l->set_precision(test_support::uniform_precision(dtype));
  m.allocate(4);
  m.init_parameters(5);
  feed(m, 4, 2);
  m.forward(4);
  BottleneckStep out;
  out.values.push_back(m.loss(4, 1.0f, true).loss);
  m.backward(4);
  for (auto* t : m.parameters()) {
    const auto g = read(t->grad.view());
    out.values.insert(out.values.end(), g.begin(), g.end());
  }
  for (auto* b : m.buffers()) {
    const auto v = read(b->value.view());
    out.values.insert(out.values.end(), v.begin(), v.end());
  }
  for (auto& l : m.layers())
    if (!l->is_view() && l->output(4).data == nullptr) out.unwritten.push_back(l->name());
  m.set_mode(Model::Mode::eval);
  m.forward(4);
  const auto logits = read(m.logits(4));
  out.values.insert(out.values.end(), logits.begin(), logits.end());
  out.fused_pairs = m.fused_pairs();
  out.activation_bytes = m.activation_plan().sum_bytes;
  out.deferred_buffers = m.executor().deferred_output_plan().nodes.size();
  return out;
}

TEST(CnnFusion, BatchNormAddReluRunsInTheAddsPassAndMatchesTheUnfusedStepBitForBit) {
  const BottleneckStep fused = bottleneck_step(cpu(), true, DType::fp32);
  const BottleneckStep plain = bottleneck_step(cpu(), false, DType::fp32);
  // Each block's bn3 runs inside its add (the projection block's add reads two batch norms and
  // takes in the first); their outputs are never written, so the activation plan holds less.
  EXPECT_EQ(fused.fused_pairs, 2);
  EXPECT_EQ(plain.fused_pairs, 0);
  EXPECT_EQ(fused.unwritten, (std::vector<std::string>{"layer1.0.bn3", "layer2.0.bn3"}));
  EXPECT_TRUE(plain.unwritten.empty());
  EXPECT_LT(fused.activation_bytes, plain.activation_bytes);
  // Unfused (the replay), batch norm writes into the add's output, which the add then sums onto:
  // no buffer of the replay's own.
  EXPECT_EQ(fused.deferred_buffers, 0u);
  // In fp32 batch norm's unrounded value is what the unfused op stores: the same sums, the same
  // gradients (the add's one-pass backward included), statistics and evaluation logits.
  ASSERT_EQ(fused.values.size(), plain.values.size());
  EXPECT_EQ(fused.values, plain.values);
}

TEST(CnnFusion, BatchNormAddReluInBf16RoundsOnceAndTracksTheUnfusedStep) {
  const BottleneckStep fused = bottleneck_step(cpu(), true, DType::bf16);
  const BottleneckStep plain = bottleneck_step(cpu(), false, DType::bf16);
  EXPECT_EQ(fused.fused_pairs, 2);
  ASSERT_EQ(fused.values.size(), plain.values.size());
  // Fused, batch norm's output is not rounded to bf16 before the add: the two runs differ by
  // bf16 roundings (2^-8 relative) carried through one step, not by a wrong sum.
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < fused.values.size(); ++i) {
    diff += (fused.values[i] - plain.values[i]) * (fused.values[i] - plain.values[i]);
    norm += plain.values[i] * plain.values[i];
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(diff / norm), 3e-2) << "relative distance " << std::sqrt(diff / norm);
  EXPECT_NEAR(fused.values[0], plain.values[0], 2e-2 * std::abs(plain.values[0]));
  EXPECT_NE(fused.values, plain.values) << "the fused sum was rounded twice, as unfused";
}

TEST(CnnFusion, BatchNormAddOnABackendWithoutItRunsUnfusedWithTheSameResults) {
  auto narrowed = std::make_shared<NarrowedBatchNormBackend>(
      std::vector<sdk::BatchNormOp>{sdk::BatchNormOp::batchnorm_add_forward});
  const BottleneckStep fallback = bottleneck_step(narrowed, true, DType::fp32);
  const BottleneckStep fused = bottleneck_step(cpu(), true, DType::fp32);
  EXPECT_EQ(fallback.fused_pairs, 0);
  EXPECT_TRUE(fallback.unwritten.empty());
  EXPECT_EQ(fallback.values, fused.values);
}

// The CPU backend without its residual facet: adds join by axpy.
class NoResidualBackend final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ResidualFacet::kName ? nullptr : in_->find_facet(name);
  }
};

// The replay runs the pair unfused: batch norm writes into the add's output and the add sums onto
// it in place, by the residual facet or by axpys.
void expect_the_replay_names_the_batch_norm(std::shared_ptr<sdk::DeviceBackend> backend) {
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {4, 8};
  p.block = ResNetBlock::bottleneck;
  p.classes = 3;
  Model m(std::move(backend), graph(resnet_preset(p)), 3 * 8 * 8, 3, image(3, 8, 8));
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(4);
  m.init_parameters(5);
  feed(m, 4, 2);
  ASSERT_EQ(m.fused_pairs(), 2);
  auto gradients = [&] {
    std::vector<float> all;
    for (auto* t : m.parameters()) {
      const auto g = read(t->grad.view());
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  };
  m.forward(4);
  const float fused_loss = m.loss(4, 1.0f, true).loss;
  m.backward(4);
  const std::vector<float> fused = gradients();
  // A clean replay: every tensor finite, the unfused step's gradients (which the replay leaves)
  // those of the fused one bit for bit in fp32, and the fused step after it computes what it did.
  EXPECT_EQ(locate_first_nonfinite(m, 4, 1.0f).where, "");
  EXPECT_EQ(gradients(), fused);
  m.forward(4);
  EXPECT_EQ(m.loss(4, 1.0f, false).loss, fused_loss);
  for (auto* t : m.parameters())
    if (t->name == "layer2.0.bn3.weight") {
      std::vector<float> w = read(t->master.view());
      w[1] = std::numeric_limits<float>::infinity();
      write(t->master.view(), w);
    }
  // Fused, the first bad tensor would be the add's output; the replay names batch norm's, then
  // fuses the pair again.
  const NonfiniteSite site = locate_first_nonfinite(m, 4, 1.0f);
  EXPECT_EQ(site.where, "forward layer2.0.bn3.output");
  EXPECT_EQ(site.node, "layer2.0.bn3");
  EXPECT_EQ(m.fused_pairs(), 2);
}

TEST(CnnFusion, TheNonFiniteReplayOfAFusedBatchNormAddNamesTheBatchNorm) {
  expect_the_replay_names_the_batch_norm(cpu());
  expect_the_replay_names_the_batch_norm(std::make_shared<NoResidualBackend>());
}

// The replay runs a training-mode forward again on the step's batch; batch norm's running
// statistics, which the step's own forward already moved, come out of it as they went in, both
// from a clean replay and from one that stops at a non-finite tensor.
TEST(CnnFusion, TheNonfiniteReplayLeavesTheRunningStatisticsAsTheStepLeftThem) {
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {4, 8};
  p.block = ResNetBlock::bottleneck;
  p.classes = 3;
  Model m(cpu(), graph(resnet_preset(p)), 3 * 8 * 8, 3, image(3, 8, 8));
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(4);
  m.init_parameters(5);
  feed(m, 4, 2);
  const auto statistics = [&] {
    std::vector<std::vector<float>> all;
    for (const ModelBuffer* b : m.buffers()) all.push_back(read(b->value.view()));
    return all;
  };
  m.forward(4);
  ASSERT_TRUE(std::isfinite(m.loss(4, 1.0f, true).loss));
  m.backward(4);
  const auto after_step = statistics();
  ASSERT_FALSE(after_step.empty());
  EXPECT_EQ(locate_first_nonfinite(m, 4, 1.0f).where, "");
  EXPECT_EQ(statistics(), after_step) << "a clean replay";
  for (auto* t : m.parameters())
    if (t->name == "layer2.0.conv2.weight") {
      std::vector<float> w = read(t->master.view());
      w[0] = std::numeric_limits<float>::quiet_NaN();
      write(t->master.view(), w);
    }
  EXPECT_NE(locate_first_nonfinite(m, 4, 1.0f).where, "");
  EXPECT_EQ(statistics(), after_step) << "a replay that stops at a NaN";
  // What the replay undoes: a training forward moves them.
  m.forward(4);
  EXPECT_NE(statistics(), after_step);
}

}  // namespace
}  // namespace mixtrain::core
