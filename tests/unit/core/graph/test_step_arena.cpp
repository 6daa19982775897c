// The step's one arena (memory_plan.h, plan_step_memory): activations and their gradients share
// it, a gradient taking the bytes of activations the backward has read for the last time. That is
// safe only if every op reads what the plan says it reads. Here each model family's step runs
// twice from the same weights: plainly, and with Executor::set_poison_dead_buffers filling each
// buffer with NaN once its last planned read has passed. A read the plan did not list would then
// see NaN: the two steps must give the same bits, finite. Fused and unfused, FP32 and bf16, the
// chunked loss, and the non-finite replay (which runs the fused pairs unfused). An evaluation of
// more rows than the step has a forward-only placement of its own in the same arena: checked the
// same way, against the same evaluation in the step's placement.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cnn_test_support.h"
#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/lora.h"
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

using Rows = Executor::PassRows;

struct Family {
  std::string name;
  // Allocated for `rows` (the all-FP32 pass's gradients reserved in the arena when asked),
  // initialised, fed the most rows of the two.
  std::function<std::unique_ptr<Model>(bool reserve_fp32, Rows rows)> make;
  std::int64_t rows;
};

// `fp32_norm`: each block's last batch norm in fp32, so that its fused add, reading another
// dtype, falls back to writing the norm's output apart (a deferred output, every pass).
std::unique_ptr<Model> resnet(ResNetBlock block, bool fuse, DType dtype, bool reserve = false,
                              Rows rows = {4, 4}, bool fp32_norm = false) {
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {4, 8};
  p.block = block;
  p.classes = 3;
  ModelSpec spec = cnn_testing::graph(resnet_preset(p));
  spec.fuse_epilogues = fuse;
  auto m = std::make_unique<Model>(cpu(), spec, 3 * 8 * 8, 3, cnn_testing::image(3, 8, 8));
  for (auto& l : m->layers()) {
    const bool last_norm = l->name().ends_with(".bn2") || l->name().ends_with(".bn3");
    l->set_precision(uniform_precision(fp32_norm && last_norm ? DType::fp32 : dtype));
  }
  m->allocate(rows, reserve);
  m->init_parameters(5);
  cnn_testing::feed(*m, m->max_rows(), 2);
  return m;
}

constexpr std::int64_t kTokens = 6, kVocab = 13, kBatch = 3;

// The tiny GPT as a family varies it.
struct GptOptions {
  bool fuse = true;
  DType dtype = DType::fp32;
  std::int64_t loss_block = 0;  // model.loss_chunk_rows
  bool flash = true;
  // LoRA adapters (r = 2) beside these linears of each block, whose sums run as sums of linears
  // (add.h) when fused; the others frozen with the base.
  std::vector<std::string> lora = {};
  double lora_dropout = 0.0;
  std::vector<std::string> recompute = {};  // model.recompute's op types
  std::vector<std::string> frozen = {};  // train.frozen's patterns
};

const std::vector<std::string> kEveryLinear = {"h.*.attn.c_attn", "h.*.attn.c_proj", "h.*.mlp.c_fc",
                                               "h.*.mlp.c_proj"};

std::unique_ptr<Model> gpt(const GptOptions& o, bool reserve = false,
                           Rows rows = {kBatch, kBatch}) {
  ModelSpec spec = test_support::tiny_gpt_spec(2, 2, 8, kVocab, o.flash);
  spec.recompute = o.recompute;
  for (const std::string& p : o.frozen)
    spec.freeze.frozen.push_back({p, {"train.toml", 1, 1}, "train.frozen"});
  if (!o.lora.empty()) {
    LoraSpec adapters;
    adapters.r = 2;
    adapters.alpha = 4.0;
    adapters.dropout = o.lora_dropout;
    for (const std::string& glob : o.lora)
      adapters.targets.push_back({glob, {}, "model.lora.targets"});
    apply_lora(spec, adapters);
  }
  spec.fuse_epilogues = o.fuse;
  spec.loss_chunk_rows = o.loss_block;
  const std::int64_t batch = std::max(rows.train, rows.evaluation);
  auto m = test_support::tiny_gpt_model(spec, kTokens, kVocab, batch, 0.3f,
                                        uniform_precision(o.dtype), reserve, rows.train);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * kTokens)), labels(ids.size());
  const auto r = random_vector(2 * ids.size(), 9, 0.0f, static_cast<float>(kVocab) - 0.01f);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int32_t>(r[i]);
    labels[i] = static_cast<std::int32_t>(r[ids.size() + i]);
  }
  cpu()->copy_from_host(m->input(batch), ids.data());
  cpu()->copy_from_host(m->labels(batch), labels.data());
  return m;
}

const std::vector<std::string> kFrozenPrefix = {"wte.*", "wpe.*", "h.0.*"};

// Fan-out (one tensor read by three ops, add(h, h)), a reshape and a flatten: gradients summed
// in FP32 from several readers, some written apart and added.
std::unique_ptr<Model> fan_out(DType dtype, bool reserve = false, Rows rows = {5, 5}) {
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
  m->allocate(rows, reserve);
  m->init_parameters(11);
  cnn_testing::feed(*m, m->max_rows(), 3);
  return m;
}

std::vector<Family> families() {
  std::vector<Family> f;
  for (const bool fuse : {true, false})
    for (const DType d : {DType::fp32, DType::bf16}) {
      const std::string tag =
          std::string(fuse ? "fused " : "unfused ") + std::string(sdk::dtype_name(d));
      f.push_back({"basic resnet, " + tag,
                   [=](bool r, Rows n) { return resnet(ResNetBlock::basic, fuse, d, r, n); }, 4});
      f.push_back({"bottleneck resnet, " + tag,
                   [=](bool r, Rows n) { return resnet(ResNetBlock::bottleneck, fuse, d, r, n); },
                   4});
      const auto family = [&](const std::string& name, GptOptions o) {
        o.fuse = fuse;
        o.dtype = d;
        f.push_back({name + ", " + tag, [=](bool r, Rows n) { return gpt(o, r, n); }, kBatch});
      };
      family("gpt", {});
      family("gpt, loss in blocks of 5 rows", {.loss_block = 5});
      // Unfused attention keeps P (and then dS) as a GEMM operand of its own dtype.
      family("gpt, unfused attention", {.flash = false});
      family("gpt with LoRA adapters", {.lora = kEveryLinear});
      // PEFT's default for GPT-2: the MLP's linears frozen without adapters, their inputs not
      // kept for a backward that does not read them.
      family("gpt with LoRA on c_attn alone", {.lora = {"h.*.attn.c_attn"}});
      family("gpt recomputing its gelu and layer norm outputs",
             {.recompute = {"gelu", "layernorm"}});
      family("gpt recomputing its blocks from their residual stream",
             {.recompute = {"layernorm", "linear", "attention", "gelu"}});
      family("gpt recomputing its blocks, unfused attention",
             {.flash = false, .recompute = {"layernorm", "linear", "attention", "gelu"}});
      // The embeddings (and so the tied LM head) and the first block frozen: no backward runs
      // there, so nothing is kept for one.
      family("gpt, its embeddings and first block frozen", {.frozen = kFrozenPrefix});
      family("gpt with LoRA adapters, recomputing its blocks, loss in blocks of 5 rows",
             {.loss_block = 5,
              .lora = kEveryLinear,
              .recompute = {"layernorm", "linear", "attention", "gelu"}});
      // Its dropout too: the mask drawn again from the step's key in the backward.
      family("gpt with LoRA adapters and their dropout, recomputing its blocks and dropout",
             {.lora = kEveryLinear,
              .lora_dropout = 0.3,
              .recompute = {"layernorm", "linear", "attention", "gelu", "dropout"}});
    }
  // The batch norm before each add reads fp32 where the add reads bf16: unfused every pass.
  f.push_back({"basic resnet, fp32 norms before bf16 adds",
               [](bool r, Rows n) {
                 return resnet(ResNetBlock::basic, true, DType::bf16, r, n, /*fp32_norm=*/true);
               },
               4});
  f.push_back({"fan-out, fp32", [](bool r, Rows n) { return fan_out(DType::fp32, r, n); }, 5});
  f.push_back({"fan-out, bf16", [](bool r, Rows n) { return fan_out(DType::bf16, r, n); }, 5});
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
    if (t->grad.empty()) continue;  // frozen (LoRA's base)
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
    const auto plain_model = f.make(false, {f.rows, f.rows});
    const auto poisoned_model = f.make(false, {f.rows, f.rows});
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
    const auto m = f.make(false, {f.rows, f.rows});
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
    const auto without = f.make(false, {f.rows, f.rows});
    const auto plain_model = f.make(true, {f.rows, f.rows});
    const auto poisoned_model = f.make(true, {f.rows, f.rows});
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

TEST(StepArena, AFrozenPrefixKeepsNothingForTheBackwardItDoesNotRun) {
  const auto trained = gpt({.dtype = DType::bf16});
  const auto frozen = gpt({.dtype = DType::bf16, .frozen = kFrozenPrefix});
  const auto lives = [](const Model& m) { return plan_step_memory(m.plan(), m.layers(), kBatch); };
  const StepMemoryPlan a = lives(*trained), b = lives(*frozen);
  const int n = static_cast<int>(frozen->layers().size());
  int prefix = 0;
  // The block's output is h.1's input, which h.1.ln_1's backward reads.
  for (std::size_t k = 0; k < b.activation_buffers; ++k) {
    if (!b.lives[k].name.starts_with("h.0.") || b.lives[k].name == "h.0.residual_2") continue;
    ++prefix;
    EXPECT_LT(b.lives[k].last_step, n) << b.lives[k].name << " kept for a backward";
  }
  EXPECT_GT(prefix, 4);
  EXPECT_LT(b.arena.peak_live_bytes, a.arena.peak_live_bytes);
}

TEST(StepArena, AFrozenLinearKeepsNoInputForItsBackward) {
  // A frozen weight has no wgrad, the one GEMM that reads x. With LoRA on c_attn alone (PEFT's
  // default for GPT-2), the MLP's linears are frozen without adapters: ln_2's and the gelu's
  // outputs are read by no backward. With adapters there too, lora_A's wgrad reads them.
  const auto last_step = [](const Model& m, const std::string& name) {
    const StepMemoryPlan p = plan_step_memory(m.plan(), m.layers(), kBatch);
    for (std::size_t k = 0; k < p.activation_buffers; ++k)
      if (p.lives[k].name == name) return p.lives[k].last_step;
    ADD_FAILURE() << name << " is no planned activation";
    return -1;
  };
  const auto attention_only = gpt({.dtype = DType::bf16, .lora = {"h.*.attn.c_attn"}});
  const auto every_linear = gpt({.dtype = DType::bf16, .lora = kEveryLinear});
  const int n = static_cast<int>(attention_only->layers().size());
  for (const char* name : {"h.0.ln_2", "h.0.mlp.gelu", "h.1.ln_2", "h.1.mlp.gelu"}) {
    SCOPED_TRACE(name);
    EXPECT_LT(last_step(*attention_only, name), n);
    EXPECT_GT(last_step(*every_linear, name), static_cast<int>(every_linear->layers().size()));
  }
  // c_attn's input, which its adapter's wgrad reads, is kept either way.
  EXPECT_GT(last_step(*attention_only, "h.0.ln_1"), n);
}

TEST(StepArena, GradientsTakeTheBytesOfActivationsTheBackwardIsDoneWith) {
  for (const bool fuse : {true, false}) {
    const auto m = resnet(ResNetBlock::bottleneck, fuse, DType::bf16);
    const StepMemoryPlan& p = m->executor().step_plan();
    // The convolutions' workspaces (the CPU's decoded operands and fp32 outputs) live in the
    // arena too, each at its step; apart they would take the largest of them.
    std::size_t workspace = 0;
    for (const auto* at : {&p.forward_workspace, &p.backward_workspace})
      for (const std::size_t k : *at)
        if (k != kNoBuffer) workspace = std::max(workspace, p.lives[k].bytes);
    EXPECT_LT(p.arena.arena_bytes,
              p.activations.arena_bytes + p.gradients.planned.arena_bytes + workspace);
    // Never below what one step has live at once.
    EXPECT_GE(p.arena.arena_bytes, p.arena.peak_live_bytes);
    EXPECT_EQ(p.lives.size(), p.arena.offset.size());
    const auto g = gpt({.fuse = fuse});
    const StepMemoryPlan& q = g->executor().step_plan();
    EXPECT_LT(q.arena.arena_bytes, q.activations.arena_bytes + q.gradients.planned.arena_bytes);
  }
}

// An evaluation: its loss and logits, flattened (in evaluation mode, read in it).
std::vector<float> evaluate(Model& m, std::int64_t rows, bool poison) {
  m.executor().set_poison_dead_buffers(poison);
  m.set_mode(Model::Mode::eval);
  m.forward(rows);
  std::vector<float> out{m.evaluation_loss(rows).loss};
  const auto logits = read(m.logits(rows));
  out.insert(out.end(), logits.begin(), logits.end());
  m.set_mode(Model::Mode::train);
  return out;
}

// The evaluation's own placement reads only what its forward-only plan lists, and evaluates as
// the same model allocated for a step of all its rows; in fewer bytes than that step's arena.
// Both first run a training step of one row (the ops' unfused outputs then have a place of the
// step's, which the evaluation must not write through).
TEST(EvaluationPlacement, AnEvaluationOfMoreRowsReadsOnlyWhatItsForwardPlanListed) {
  for (const Family& f : families()) {
    SCOPED_TRACE(f.name);
    const auto whole = f.make(false, {f.rows, f.rows});
    const auto apart = f.make(false, {1, f.rows});
    ASSERT_GT(apart->executor().evaluation_plan().lives.size(), 0u);
    ASSERT_EQ(step(*whole, 1, false), step(*apart, 1, true));
    const auto expected = evaluate(*whole, f.rows, false);
    ASSERT_TRUE(all_finite(expected));
    EXPECT_EQ(evaluate(*apart, f.rows, true), expected);
    // Equal where the model is too small for the gradients to matter (fan-out's 5 rows).
    EXPECT_LE(apart->executor().memory().activations, whole->executor().memory().activations);
    if (!f.name.starts_with("fan-out")) {
      EXPECT_LT(apart->executor().memory().activations, whole->executor().memory().activations);
    }
  }
}

// Evaluation mode moves the outputs to its placement and training mode moves them back, to the
// same addresses (a recorded step graph replays them): a step after an evaluation is the step
// without it.
TEST(EvaluationPlacement, AStepAfterAnEvaluationIsTheStepWithoutIt) {
  for (const Family& f : families()) {
    SCOPED_TRACE(f.name);
    const auto fresh = f.make(false, {2, f.rows});
    const auto evaluated = f.make(false, {2, f.rows});
    std::vector<const void*> before;
    for (const auto& l : evaluated->layers()) before.push_back(l->output(2).data);
    evaluate(*evaluated, f.rows, false);
    // (The chunked logits, unallocated before, are allocated whole when the evaluation reads them.)
    for (std::size_t i = 0; i < before.size(); ++i)
      if (before[i] != nullptr) {
        EXPECT_EQ(evaluated->layers()[i]->output(2).data, before[i]) << i;
      }
    const auto expected = step(*fresh, 2, false);
    ASSERT_TRUE(all_finite(expected));
    EXPECT_EQ(step(*evaluated, 2, true), expected);
  }
}

TEST(EvaluationPlacement, APassThePlacementInUseCannotHoldIsRefused) {
  const auto m = resnet(ResNetBlock::basic, true, DType::fp32, false, {2, 4});
  EXPECT_THROW(m->forward(3), std::logic_error);  // the step holds 2 rows
  m->set_mode(Model::Mode::eval);
  m->forward(4);
  EXPECT_THROW(m->loss(4, 1.0f, true), std::logic_error);  // no gradient kept in evaluation
  EXPECT_THROW(m->backward(4), std::logic_error);
  EXPECT_THROW(m->forward(5), std::logic_error);
  // No training step planned: only evaluation runs.
  const auto evaluating = resnet(ResNetBlock::basic, true, DType::fp32, false, {0, 4});
  EXPECT_THROW(evaluating->forward(1), std::logic_error);
  EXPECT_EQ(evaluating->executor().step_plan().lives.size(), 0u);
  const auto whole = resnet(ResNetBlock::basic, true, DType::fp32, false, {4, 4});
  EXPECT_EQ(evaluate(*evaluating, 4, true), evaluate(*whole, 4, false));
}

}  // namespace
}  // namespace mixtrain::core
