// The step's one arena (memory_plan.h, plan_step_memory): activations and their gradients share
// it, a gradient taking the bytes of activations the backward has read for the last time. That is
// safe only if every op reads what the plan says it reads. Here each model family's step runs
// twice from the same weights: plainly, and with Executor::set_poison_dead_buffers filling each
// buffer with NaN once its last planned read has passed. A read the plan did not list would then
// see NaN: the two steps must give the same bits, finite. Fused and unfused, FP32 and bf16, the
// chunked loss, and the non-finite replay (which runs the fused pairs unfused).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cnn_test_support.h"
#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/model.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::cpu;
using test_support::op;
using test_support::random_vector;
using test_support::read;
using test_support::uniform_precision;

struct Family {
  std::string name;
  // Allocated (the all-FP32 pass's gradients reserved in the arena when asked), initialised, fed.
  std::function<std::unique_ptr<Model>(bool reserve_fp32)> make;
  std::int64_t rows;
};

std::unique_ptr<Model> resnet(ResNetBlock block, bool fuse, DType dtype, bool reserve = false) {
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {4, 8};
  p.block = block;
  p.classes = 3;
  ModelSpec spec = cnn_testing::graph(resnet_preset(p));
  spec.fuse_epilogues = fuse;
  auto m = std::make_unique<Model>(cpu(), spec, 3 * 8 * 8, 3, cnn_testing::image(3, 8, 8));
  for (auto& l : m->layers()) l->set_precision(uniform_precision(dtype));
  m->allocate(4, reserve);
  m->init_parameters(5);
  cnn_testing::feed(*m, 4, 2);
  return m;
}

constexpr std::int64_t kTokens = 6, kVocab = 13, kBatch = 3;

std::unique_ptr<Model> gpt(bool fuse, DType dtype, std::int64_t loss_block, bool reserve = false,
                           bool flash = true) {
  ModelSpec spec = test_support::tiny_gpt_spec(2, 2, 8, kVocab, flash);
  spec.fuse_epilogues = fuse;
  spec.loss_chunk_rows = loss_block;
  auto m = test_support::tiny_gpt_model(spec, kTokens, kVocab, kBatch, 0.3f,
                                        uniform_precision(dtype), reserve);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(kBatch * kTokens)), labels(ids.size());
  const auto r = random_vector(2 * ids.size(), 9, 0.0f, static_cast<float>(kVocab) - 0.01f);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int32_t>(r[i]);
    labels[i] = static_cast<std::int32_t>(r[ids.size() + i]);
  }
  cpu()->copy_from_host(m->input(kBatch), ids.data());
  cpu()->copy_from_host(m->labels(kBatch), labels.data());
  return m;
}

// Fan-out (one tensor read by three ops, add(h, h)), a reshape and a flatten: gradients summed
// in FP32 from several readers, some written apart and added.
std::unique_ptr<Model> fan_out(DType dtype, bool reserve = false) {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {
      op("linear", "fc1", {{"out", 6}}, {"input"}), op("relu", "relu1", {}, {"fc1"}),
      op("linear", "fc2", {{"out", 6}}, {"relu1"}), op("add", "res", {}, {"fc2", "input", "fc1"}),
      op("add", "twice", {}, {"res", "res"}),       op("layernorm", "ln", {}, {"twice"}),
      op("reshape", "tokens", {}, {"ln"}),          op("linear", "mix", {{"out", 3}}, {"tokens"}),
      op("flatten", "flat", {}, {"mix"}),           op("linear", "head", {{"out", 3}}, {"flat"})};
  spec.layers[6].shape = {2, -1};
  auto m = std::make_unique<Model>(cpu(), spec, 6, 3);
  for (auto& l : m->layers()) l->set_precision(uniform_precision(dtype));
  m->allocate(5, reserve);
  m->init_parameters(11);
  cnn_testing::feed(*m, 5, 3);
  return m;
}

std::vector<Family> families() {
  std::vector<Family> f;
  for (const bool fuse : {true, false})
    for (const DType d : {DType::fp32, DType::bf16}) {
      const std::string tag =
          std::string(fuse ? "fused " : "unfused ") + std::string(sdk::dtype_name(d));
      f.push_back({"basic resnet, " + tag,
                   [=](bool r) { return resnet(ResNetBlock::basic, fuse, d, r); }, 4});
      f.push_back({"bottleneck resnet, " + tag,
                   [=](bool r) { return resnet(ResNetBlock::bottleneck, fuse, d, r); }, 4});
      f.push_back({"gpt, " + tag, [=](bool r) { return gpt(fuse, d, 0, r); }, kBatch});
      f.push_back({"gpt, loss in blocks of 5 rows, " + tag,
                   [=](bool r) { return gpt(fuse, d, 5, r); }, kBatch});
      // Unfused attention keeps P (and then dS) as a GEMM operand of its own dtype.
      f.push_back({"gpt, unfused attention, " + tag,
                   [=](bool r) { return gpt(fuse, d, 0, r, /*flash=*/false); }, kBatch});
    }
  f.push_back({"fan-out, fp32", [](bool r) { return fan_out(DType::fp32, r); }, 5});
  f.push_back({"fan-out, bf16", [](bool r) { return fan_out(DType::bf16, r); }, 5});
  return f;
}

// One step: the loss, every parameter gradient and buffer, flattened. With `underflow`, the
// all-FP32 pass runs between the forward and the loss, as a statistics step's does, and its
// counts come first.
std::vector<float> step(Model& m, std::int64_t rows, bool poison, bool underflow = false) {
  m.executor().set_poison_dead_buffers(poison);
  m.forward(rows);
  std::vector<float> counts;
  if (underflow)
    for (const UnderflowCount& c : measure_gradient_underflow(m, rows, 1.0f)) {
      counts.push_back(static_cast<float>(c.nonzero));
      counts.push_back(static_cast<float>(c.flushed));
    }
  std::vector<float> out = counts;
  out.push_back(m.loss(rows, 1.0f, true).loss);
  m.backward(rows);
  for (auto* t : m.parameters()) {
    const auto g = read(t->grad.view());
    out.insert(out.end(), g.begin(), g.end());
  }
  for (auto* b : m.buffers()) {
    const auto v = read(b->value.view());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

TEST(StepArena, EveryReadOfAStepIsOneThePlanListed) {
  for (const Family& f : families()) {
    SCOPED_TRACE(f.name);
    const auto plain_model = f.make(false);
    const auto poisoned_model = f.make(false);
    const auto plain = step(*plain_model, f.rows, false);
    const auto poisoned = step(*poisoned_model, f.rows, true);
    ASSERT_TRUE(all_finite(plain));
    EXPECT_TRUE(all_finite(poisoned));
    EXPECT_EQ(poisoned, plain);
  }
}

TEST(StepArena, TheNonfiniteReplayReadsOnlyWhatThePlanListed) {
  // The replay runs each fused pair unfused, with a check after every write: on a healthy step it
  // finds nothing, poisoned or not.
  for (const Family& f : families()) {
    SCOPED_TRACE(f.name);
    const auto m = f.make(false);
    m->executor().set_poison_dead_buffers(true);
    const NonfiniteSite site = locate_first_nonfinite(*m, f.rows, 1.0f);
    EXPECT_TRUE(site.where.empty()) << site.where;
  }
}

TEST(StepArena, TheUnderflowPassInTheArenaLeavesTheStepAsItWas) {
  // The all-FP32 pass's gradients (and its contributions written apart) are a buffer of the arena,
  // live between the forward and the step's loss. The pass reads the activations the step reads
  // after it: the step must come out as without the pass, poisoned or not, and the pass's counts
  // the same both ways.
  for (const Family& f : families()) {
    SCOPED_TRACE(f.name);
    const auto without = f.make(false);
    const auto plain_model = f.make(true);
    const auto poisoned_model = f.make(true);
    const auto alone = step(*without, f.rows, false);
    const auto plain = step(*plain_model, f.rows, false, true);
    const auto poisoned = step(*poisoned_model, f.rows, true, true);
    ASSERT_GT(plain.size(), alone.size());
    EXPECT_EQ(
        std::vector<float>(plain.end() - static_cast<std::ptrdiff_t>(alone.size()), plain.end()),
        alone);
    EXPECT_EQ(poisoned, plain);
    EXPECT_NE(plain_model->executor().step_plan().fp32_gradients, kNoBuffer);
  }
}

TEST(StepArena, PoisonedBuffersReadAsNaNSoAnUnlistedReadShows) {
  // The control: a second backward without a forward reads activations the first one read for
  // the last time. Poisoned, those are NaN, and so are the gradients.
  const auto m = resnet(ResNetBlock::bottleneck, true, DType::fp32);
  m->executor().set_poison_dead_buffers(true);
  m->forward(4);
  m->loss(4, 1.0f, true);
  m->backward(4);
  m->loss(4, 1.0f, true);
  m->backward(4);
  bool nan = false;
  for (auto* t : m->parameters()) nan = nan || !all_finite(read(t->grad.view()));
  EXPECT_TRUE(nan);
}

TEST(StepArena, GradientsTakeTheBytesOfActivationsTheBackwardIsDoneWith) {
  for (const bool fuse : {true, false}) {
    const auto m = resnet(ResNetBlock::bottleneck, fuse, DType::bf16);
    const StepMemoryPlan& p = m->executor().step_plan();
    EXPECT_LT(p.arena.arena_bytes, p.activations.arena_bytes + p.gradients.planned.arena_bytes);
    // Never below what one step has live at once.
    EXPECT_GE(p.arena.arena_bytes, p.arena.peak_live_bytes);
    EXPECT_EQ(p.lives.size(), p.arena.offset.size());
    const auto g = gpt(fuse, DType::fp32, 0);
    const StepMemoryPlan& q = g->executor().step_plan();
    EXPECT_LT(q.arena.arena_bytes, q.activations.arena_bytes + q.gradients.planned.arena_bytes);
  }
}

}  // namespace
}  // namespace mixtrain::core
