// Recomputation (model.recompute, memory_plan.h's plan_recomputation): the tiny GPT with its gelu
// and layer norm outputs, or its whole blocks but the residual adds, computed again for the
// backward, against the same model keeping them, from the same weights: the same loss and
// gradients (bit for bit where both run the same kernels: unfused; within FP32 rounding where the
// kept model runs its gelu as a GEMM epilogue), a plan that keeps those outputs only through their
// forward reads and recomputes a half block as one chain, a smaller arena, the summary's line,
// one more forward call per recomputed output a step, the underflow pass's own arena, a
// non-finite weight named at the same place, finite differences, LoRA's sums of linears recomputed
// with their linears (fused or not, in the non-finite replay too) and its dropout drawing the same
// mask again, and a spec naming an op that cannot be recomputed refused. The step arena's poisoned
// steps, the non-finite replay and the underflow pass run on it too (test_step_arena.cpp's
// families).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/lora.h"
#include "mixtrain/core/graph/memory_plan.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/graph/model_summary.h"
#include "mixtrain/sdk/error.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::random_vector;
using test_support::uniform_precision;

constexpr std::int64_t kTokens = 6, kVocab = 13, kBatch = 3;

ModelSpec spec(bool fuse, std::vector<std::string> recompute, std::int64_t loss_block = 0) {
  ModelSpec s = test_support::tiny_gpt_spec(2, 2, 8, kVocab);
  s.fuse_epilogues = fuse;
  s.loss_chunk_rows = loss_block;
  s.recompute = std::move(recompute);
  return s;
}

std::unique_ptr<Model> model(const ModelSpec& s, DType dtype,
                             std::shared_ptr<sdk::DeviceBackend> backend = test_support::cpu()) {
  auto m = test_support::tiny_gpt_model(s, kTokens, kVocab, kBatch, 0.3f, uniform_precision(dtype),
                                        false, {}, backend);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(kBatch * kTokens)), labels(ids.size());
  const auto r = random_vector(2 * ids.size(), 9, 0.0f, static_cast<float>(kVocab) - 0.01f);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int32_t>(r[i]);
    labels[i] = static_cast<std::int32_t>(r[ids.size() + i]);
  }
  backend->copy_from_host(m->input(kBatch), ids.data());
  backend->copy_from_host(m->labels(kBatch), labels.data());
  return m;
}

// One step's loss, then every parameter gradient.
std::vector<float> step(Model& m) {
  m.forward(kBatch);
  std::vector<float> out = {m.loss(kBatch, 1.0f, true).loss};
  m.backward(kBatch);
  const std::vector<float> g = test_support::all_gradients(m);
  out.insert(out.end(), g.begin(), g.end());
  return out;
}

std::set<std::string> recomputed_names(const Model& m) {
  std::set<std::string> names;
  for (const RecomputedOutput& r : plan_recomputation(m.plan(), m.layers()))
    names.insert(m.layers()[r.node]->name());
  return names;
}

// The plan's recomputed outputs by node name.
std::map<std::string, RecomputedOutput> recomputed_by_name(const Model& m) {
  std::map<std::string, RecomputedOutput> by_name;
  for (const RecomputedOutput& r : plan_recomputation(m.plan(), m.layers()))
    by_name[m.layers()[r.node]->name()] = r;
  return by_name;
}

// Node `name`'s forward position.
std::size_t position(const Model& m, const std::string& name) {
  for (std::size_t i = 0; i < m.layers().size(); ++i)
    if (m.layers()[i]->name() == name) return i;
  ADD_FAILURE() << name;
  return 0;
}

const std::vector<std::string> kBoth = {"gelu", "layernorm"};
// Every op of a block but its residual adds (Hugging Face's gradient checkpointing keeps the
// blocks' inputs): each block is computed again, a chain at a time, from its residual stream.
const std::vector<std::string> kBlocks = {"layernorm", "linear", "attention", "gelu"};

TEST(Recompute, TrainsTheBitsOfTheKeptOutputsWhereBothRunTheSameKernels) {
  for (const auto& types : {kBoth, kBlocks})
    for (const DType dtype : {DType::fp32, DType::bf16}) {
      SCOPED_TRACE(std::string(sdk::dtype_name(dtype)) + ", " + std::to_string(types.size()) +
                   " types");
      const auto kept = model(spec(false, {}), dtype);
      const auto recomputed = model(spec(false, types), dtype);
      ASSERT_FALSE(recomputed_names(*recomputed).empty());
      const std::vector<float> a = step(*kept), b = step(*recomputed);
      EXPECT_EQ(a, b);
      // A second step from the same weights: the forward wrote back where the recomputation moved
      // the outputs.
      EXPECT_EQ(step(*recomputed), b);
    }
}

TEST(Recompute, ARecomputedGeluRunsApartFromTheGemmWithinFp32Rounding) {
  // Fused, the kept model's gelu may be its linear's GEMM epilogue (the CPU's fp32 GEMMs take it)
  // where the recomputed one runs alone: the same function, rounded apart.
  const auto kept = model(spec(true, {}), DType::fp32);
  const auto recomputed = model(spec(true, kBoth), DType::fp32);
  for (const auto& l : recomputed->layers()) {
    if (l->type() == "linear") {
      EXPECT_FALSE(l->fused()) << l->name() << " runs the gelu it reads";
    }
  }
  const std::vector<float> a = step(*kept), b = step(*recomputed);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 2e-5 * std::max(1.0f, std::abs(a[i]))) << "value " << i;
}

TEST(Recompute, TheOutputsLiveThroughTheirForwardReadsAndTheArenaShrinks) {
  const auto kept = model(spec(true, {}), DType::bf16);
  const auto recomputed = model(spec(true, kBoth), DType::bf16);
  // Every gelu and layer norm: ln_f too, whose reader (the LM head) runs its own backward here.
  EXPECT_EQ(recomputed_names(*recomputed),
            (std::set<std::string>{"h.0.ln_1", "h.0.ln_2", "h.0.mlp.gelu", "h.1.ln_1", "h.1.ln_2",
                                   "h.1.mlp.gelu", "ln_f"}));
  const Ops& ops = recomputed->layers();
  const int n = static_cast<int>(ops.size());
  const StepMemoryPlan plan = plan_step_memory(recomputed->plan(), ops, kBatch);
  const StepMemoryPlan before = plan_step_memory(kept->plan(), kept->layers(), kBatch);
  ASSERT_EQ(plan.recomputed.size(), 7u);
  for (const RecomputedOutput& r : plan.recomputed) {
    const std::string& name = ops[r.node]->name();
    SCOPED_TRACE(name);
    // Its forward buffer: the activations are listed in forward order, one per planned output.
    std::size_t k = 0;
    for (std::size_t i = 0; i < r.node; ++i)
      if (ops[i]->planned_output_bytes(kBatch * recomputed->plan().node(i).rows_per_sample) > 0)
        ++k;
    EXPECT_LT(plan.lives[k].last_step, n) << "kept past the forward";
    EXPECT_EQ(plan.lives[k].name, name);
    const BufferLife& again = plan.lives[plan.recompute_buffer[r.node]];
    EXPECT_EQ(again.first_step, 2 * n - static_cast<int>(r.first_reader));
    EXPECT_EQ(again.last_step, 2 * n - static_cast<int>(r.last_reader));
    EXPECT_EQ(again.bytes, plan.lives[k].bytes);
  }
  EXPECT_LT(plan.arena.arena_bytes, before.arena.arena_bytes);
  EXPECT_LT(plan.arena.peak_live_bytes, before.arena.peak_live_bytes);
}

TEST(Recompute, ABlockIsRecomputedAsOneChainFromItsResidualStream) {
  const auto m = model(spec(true, kBlocks), DType::bf16);
  std::map<std::string, RecomputedOutput> by_name = recomputed_by_name(*m);
  for (const std::string b : {"h.0.", "h.1."}) {
    SCOPED_TRACE(b);
    // The projections' outputs feed only the residual adds, which read no input in their
    // backward: they are kept by no one, recomputed by no one.
    EXPECT_EQ(by_name.count(b + "attn.c_proj"), 0u);
    EXPECT_EQ(by_name.count(b + "mlp.c_proj"), 0u);
    // Attention's half: all three at the output projection's backward, the first to need one
    // (it reads attention's output); attention's own backward reads its output and its qkv.
    for (const char* node : {"ln_1", "attn.c_attn", "attn"}) {
      ASSERT_EQ(by_name.count(b + node), 1u) << node;
      EXPECT_EQ(by_name[b + node].first_reader, position(*m, b + "attn.c_proj")) << node;
    }
    EXPECT_EQ(by_name[b + "attn"].last_reader, position(*m, b + "attn"));
    EXPECT_EQ(by_name[b + "attn.c_attn"].last_reader, position(*m, b + "attn"));
    EXPECT_EQ(by_name[b + "ln_1"].last_reader, position(*m, b + "attn.c_attn"));
    // The MLP's half at its output projection's.
    for (const char* node : {"ln_2", "mlp.c_fc", "mlp.gelu"}) {
      ASSERT_EQ(by_name.count(b + node), 1u) << node;
      EXPECT_EQ(by_name[b + node].first_reader, position(*m, b + "mlp.c_proj")) << node;
    }
  }
  const auto kept = model(spec(true, {}), DType::bf16);
  const auto both = model(spec(true, kBoth), DType::bf16);
  const auto peak = [](const Model& x) {
    return plan_step_memory(x.plan(), x.layers(), kBatch).arena.peak_live_bytes;
  };
  EXPECT_LT(peak(*m), peak(*both));
  EXPECT_LT(peak(*both), peak(*kept));
}

TEST(Recompute, TheSummarySaysWhatIsRecomputedAndCountsItsFlops) {
  const auto kept = model(spec(true, {}), DType::bf16);
  const auto recomputed = model(spec(true, kBoth), DType::bf16);
  const ModelSummary a = summarize_model(*kept, kBatch), b = summarize_model(*recomputed, kBatch);
  EXPECT_TRUE(a.recomputed.empty());
  ASSERT_EQ(b.recomputed.size(), 7u);
  std::size_t bytes = 0;
  std::int64_t flops = 0;
  for (const auto& l : recomputed->layers())
    if (l->type() == "gelu" || l->type() == "layernorm") {
      bytes += l->planned_output_bytes(kBatch * kTokens);
      flops += l->forward_flops_per_row() * kTokens;
    }
  EXPECT_EQ(b.recomputed_bytes, bytes);
  EXPECT_EQ(b.training_flops_per_sample - a.training_flops_per_sample, flops);
  EXPECT_LT(b.activation_bytes, a.activation_bytes);
  const std::string text = render_model_summary(b);
  EXPECT_NE(text.find("recomputed for the backward (model.recompute): 7 layernorm, gelu outputs"),
            std::string::npos)
      << text;
  EXPECT_EQ(render_model_summary(a).find("recomputed"), std::string::npos);
}

TEST(Recompute, AnOutputOnlyTheChunkedLossReadsIsKeptAsItIs) {
  // In blocks, the LM head's backward runs inside the loss, where ln_f's output is read anyway.
  const auto m = model(spec(true, kBoth, 5), DType::fp32);
  const std::set<std::string> names = recomputed_names(*m);
  EXPECT_EQ(names.count("ln_f"), 0u);
  EXPECT_EQ(names.count("h.1.mlp.gelu"), 1u);
  const auto kept = model(spec(true, {}, 5), DType::fp32);
  const std::vector<float> a = step(*kept), b = step(*m);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 2e-5 * std::max(1.0f, std::abs(a[i]))) << "value " << i;
}

TEST(Recompute, EachRecomputedOutputRunsOnceMoreAStep) {
  auto backend = std::make_shared<test_support::CallCountingBackend>();
  backend->counting = true;
  const auto kept = model(spec(false, {}), DType::fp32, backend);
  step(*kept);
  backend->calls.clear();
  step(*kept);
  const auto forward_calls = [&](const char* op) {
    return backend->calls.count(op) ? backend->calls.at(op) : 0;
  };
  const int gelus = forward_calls("activation_forward"), norms = forward_calls("layernorm_forward");
  const auto recomputed = model(spec(false, kBoth), DType::fp32, backend);
  step(*recomputed);
  backend->calls.clear();
  step(*recomputed);
  // Two blocks: two gelus and five layer norms (ln_f's reader, the LM head, reads it back too).
  EXPECT_EQ(forward_calls("activation_forward"), gelus + 2);
  EXPECT_EQ(forward_calls("layernorm_forward"), norms + 5);
}

TEST(Recompute, TheUnderflowPassRecomputesOutsideTheActivationsTheStepStillReads) {
  // The all-FP32 pass runs between the forward and the loss, while every activation the backward
  // reads is live; the step arena's recomputation buffers share bytes with some of those (they
  // are dead by the backward step that recomputes), so that pass recomputes into its own arena.
  ModelSpec s = spec(true, kBoth);
  s.layers = test_support::tiny_gpt_spec(3, 2, 8, kVocab).layers;
  const auto m = model(s, DType::fp32);
  const Ops& ops = m->layers();
  const int n = static_cast<int>(ops.size());
  const StepMemoryPlan plan = plan_step_memory(m->plan(), ops, kBatch);
  // Which activations the loss and backward still read, and whether a recomputation buffer of the
  // step's shares their bytes (what makes this test able to fail).
  std::vector<std::size_t> live_at_loss;
  for (std::size_t k = 0; k < plan.activation_buffers; ++k)
    if (plan.lives[k].last_step >= n) live_at_loss.push_back(k);
  const auto span = [&](std::size_t k) {
    return std::pair{plan.arena.offset[k], plan.arena.offset[k] + plan.lives[k].bytes};
  };
  bool shared = false;
  for (const RecomputedOutput& r : plan.recomputed)
    for (std::size_t k : live_at_loss) {
      const auto [a0, a1] = span(plan.recompute_buffer[r.node]);
      const auto [b0, b1] = span(k);
      shared = shared || (a0 < b1 && b0 < a1);
    }
  ASSERT_TRUE(shared) << "no recomputation buffer shares bytes with a live activation here";
  std::vector<std::vector<float>> before;
  const auto read_live = [&] {
    std::vector<std::vector<float>> values;
    for (std::size_t i = 0, k = 0; i < ops.size(); ++i) {
      if (ops[i]->planned_output_bytes(kBatch * m->plan().node(i).rows_per_sample) == 0) continue;
      if (std::find(live_at_loss.begin(), live_at_loss.end(), k++) != live_at_loss.end())
        values.push_back(test_support::read(
            m->executor().activation(TensorId::node(i), Extent::batch_of(kBatch))));
    }
    return values;
  };
  m->forward(kBatch);
  before = read_live();
  measure_gradient_underflow(*m, kBatch, 1.0f);
  EXPECT_EQ(read_live(), before);
}

TEST(Recompute, AnInfiniteWeightIsNamedWhereTheKeptModelNamesIt) {
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recomputed" : "kept");
    const auto m = model(spec(true, recompute ? kBoth : std::vector<std::string>{}), DType::fp32);
    for (auto* p : m->parameters())
      if (p->name == "h.1.mlp.c_fc.weight") {
        std::vector<float> w = test_support::read(p->master.view());
        w[3] = std::numeric_limits<float>::infinity();
        test_support::write(p->master.view(), w);
      }
    m->forward(kBatch);
    EXPECT_FALSE(std::isfinite(m->loss(kBatch, 1.0f, true).loss));
    const NonfiniteSite site = locate_first_nonfinite(*m, kBatch, 1.0f);
    EXPECT_EQ(site.node, "h.1.mlp.c_fc");
    EXPECT_EQ(site.where, "forward h.1.mlp.c_fc.output");
  }
}

TEST(Recompute, GradientsThroughRecomputedOutputsMatchFiniteDifferences) {
  const auto m = model(spec(true, kBoth), DType::fp32);
  m->forward(kBatch);
  m->loss(kBatch, 1.0f, true);
  m->backward(kBatch);
  test_support::expect_finite_differences(
      *m, kBatch,
      {"h.1.mlp.c_proj.weight", "h.0.attn.c_attn.weight", "h.1.ln_2.weight", "ln_f.bias"}, 1e-2f,
      2e-3);
  const auto blocks = model(spec(true, kBlocks), DType::fp32);
  blocks->forward(kBatch);
  blocks->loss(kBatch, 1.0f, true);
  blocks->backward(kBatch);
  test_support::expect_finite_differences(
      *blocks, kBatch, {"h.0.mlp.c_fc.weight", "h.1.attn.c_attn.bias", "h.0.ln_1.weight"}, 1e-2f,
      2e-3);
}

// LoRA (r = 2) beside every linear of each block; each B adapter given weights of its own
// (zero_init would make its half of each sum vanish).
std::unique_ptr<Model> lora_model(bool fuse, std::vector<std::string> recompute, DType dtype,
                                  double dropout = 0.0) {
  ModelSpec s = spec(fuse, std::move(recompute));
  LoraSpec adapters;
  adapters.r = 2;
  adapters.alpha = 4.0;
  adapters.dropout = dropout;
  for (const char* glob : {"h.*.attn.c_attn", "h.*.attn.c_proj", "h.*.mlp.c_fc", "h.*.mlp.c_proj"})
    adapters.targets.push_back({glob, {}, "model.lora.targets"});
  apply_lora(s, adapters);
  auto m = model(s, dtype);
  for (auto* p : m->parameters())
    if (p->name.ends_with(".lora_B.weight"))
      test_support::write(
          p->master.view(),
          random_vector(static_cast<std::size_t>(p->master.shape().numel()), 4, -0.5f, 0.5f));
  m->refresh_working_copies();
  return m;
}

TEST(Recompute, ALoraSumIsRecomputedWithItsLinears) {
  for (const bool fuse : {true, false})
    for (const DType dtype : {DType::fp32, DType::bf16}) {
      SCOPED_TRACE(std::string(fuse ? "fused " : "unfused ") + std::string(sdk::dtype_name(dtype)));
      const auto kept = lora_model(fuse, {}, dtype);
      const auto again = lora_model(fuse, kBlocks, dtype);
      const Ops& ops = again->layers();
      const int n = static_cast<int>(ops.size());
      std::map<std::string, RecomputedOutput> by_name = recomputed_by_name(*again);
      for (const std::string target : {"h.0.attn.c_attn", "h.1.mlp.c_fc"}) {
        SCOPED_TRACE(target);
        // The sum that attention (or the gelu) reads back, with its adapter's A.
        ASSERT_EQ(by_name.count(target + ".lora_sum"), 1u);
        ASSERT_EQ(by_name.count(target + ".lora_A"), 1u);
        const RecomputedOutput& sum = by_name[target + ".lora_sum"];
        EXPECT_EQ(by_name[target + ".lora_A"].first_reader, sum.first_reader);
        if (fuse) {
          // The add runs both GEMMs: their forwards run again first, and own no output.
          EXPECT_EQ(sum.inputs_run,
                    (std::vector<std::size_t>{position(*again, target),
                                              position(*again, target + ".lora_B")}));
          EXPECT_EQ(by_name.count(target), 0u);
        } else {
          EXPECT_TRUE(sum.inputs_run.empty());
          EXPECT_EQ(by_name.count(target), 1u);
          EXPECT_EQ(by_name.count(target + ".lora_B"), 1u);
        }
      }
      // The projections' sums feed only the residual adds: read by no backward.
      EXPECT_EQ(by_name.count("h.0.attn.c_proj.lora_sum"), 0u);
      // The sums' forward buffers die in the forward.
      const StepMemoryPlan plan = plan_step_memory(again->plan(), ops, kBatch);
      for (std::size_t k = 0; k < plan.activation_buffers; ++k) {
        const std::string& name = plan.lives[k].name;
        if (name.ends_with("c_attn.lora_sum") || name.ends_with("c_fc.lora_sum")) {
          EXPECT_LT(plan.lives[k].last_step, n) << name;
        }
      }
      const StepMemoryPlan before = plan_step_memory(kept->plan(), kept->layers(), kBatch);
      EXPECT_LT(plan.arena.peak_live_bytes, before.arena.peak_live_bytes);
      // The same kernels either way (the sums fused in both or in neither): the same bits.
      const std::vector<float> a = step(*kept), b = step(*again);
      EXPECT_EQ(a, b);
      EXPECT_EQ(step(*again), b);
      // The non-finite replay runs unfused, where the linears write their outputs, the first
      // into the sum's: recomputed, into the recomputation's buffer. With nothing to find, its
      // gradients are the kept model's replay's.
      for (Model* m : {kept.get(), again.get()}) {
        m->forward(kBatch);
        m->loss(kBatch, 1.0f, true);
        EXPECT_TRUE(locate_first_nonfinite(*m, kBatch, 1.0f).where.empty());
      }
      EXPECT_EQ(test_support::all_gradients(*kept), test_support::all_gradients(*again));
    }
}

TEST(Recompute, ADropoutDrawsItsMaskAgainFromTheSameKey) {
  // LoRA's dropout before each A: its output, A's input, is read by A's wgrad. Recomputed, the
  // mask comes from the step's key again, so the step is the kept one's bit for bit.
  std::vector<std::string> with_dropout = kBlocks;
  with_dropout.push_back("dropout");
  for (const bool fuse : {true, false})
    for (const DType dtype : {DType::fp32, DType::bf16}) {
      SCOPED_TRACE(std::string(fuse ? "fused " : "unfused ") + std::string(sdk::dtype_name(dtype)));
      const auto kept = lora_model(fuse, {}, dtype, 0.3);
      const auto blocks = lora_model(fuse, kBlocks, dtype, 0.3);
      const auto again = lora_model(fuse, with_dropout, dtype, 0.3);
      const std::set<std::string> names = recomputed_names(*again);
      EXPECT_EQ(recomputed_names(*blocks).count("h.0.mlp.c_fc.lora_dropout"), 0u);
      for (const char* node : {"h.0.attn.c_attn.lora_dropout", "h.1.mlp.c_proj.lora_dropout"})
        EXPECT_EQ(names.count(node), 1u) << node;
      const auto peak = [](const Model& m) {
        return plan_step_memory(m.plan(), m.layers(), kBatch).arena.peak_live_bytes;
      };
      EXPECT_LT(peak(*again), peak(*blocks));
      const std::vector<float> a = step(*kept), b = step(*again);
      EXPECT_EQ(a, b);
      // The mask drops something: without dropout the step differs.
      EXPECT_NE(step(*lora_model(fuse, {}, dtype)), a);
    }
}

TEST(Recompute, ARecomputedLoraSumCountsAsALinear) {
  const auto kept = lora_model(true, {}, DType::bf16);
  const auto again = lora_model(true, kBlocks, DType::bf16);
  const ModelSummary a = summarize_model(*kept, kBatch), b = summarize_model(*again, kBatch);
  // Its recomputation runs its linears' GEMMs again: their FLOPs count.
  std::int64_t flops = 0;
  for (const RecomputedOutput& r : plan_recomputation(again->plan(), again->layers())) {
    flops += again->layers()[r.node]->forward_flops_per_row() * kTokens;
    for (const std::size_t q : r.inputs_run)
      flops += again->layers()[q]->forward_flops_per_row() * kTokens;
  }
  EXPECT_EQ(b.training_flops_per_sample - a.training_flops_per_sample, flops);
  EXPECT_GT(flops, 0);
  EXPECT_EQ(std::count(b.recomputed.begin(), b.recomputed.end(), "h.1.mlp.c_fc.lora_sum"), 1);
  // Under the type model.recompute names: "add" is no type it takes.
  EXPECT_EQ(std::count(b.recomputed_types.begin(), b.recomputed_types.end(), "add"), 0);
  EXPECT_EQ(std::count(b.recomputed_types.begin(), b.recomputed_types.end(), "linear"), 1);
}

TEST(Recompute, LoraGradientsThroughRecomputedSumsMatchFiniteDifferences) {
  const auto m = lora_model(true, kBlocks, DType::fp32);
  m->forward(kBatch);
  m->loss(kBatch, 1.0f, true);
  m->backward(kBatch);
  test_support::expect_finite_differences(
      *m, kBatch, {"h.0.attn.c_attn.lora_A.weight", "h.1.mlp.c_fc.lora_B.weight"}, 1e-2f, 2e-3);
}

TEST(Recompute, AnOpThatCannotBeRecomputedIsRefusedNamingTheKey) {
  for (const char* type : {"add", "relu", "batchnorm2d", "no_such_op"}) {
    SCOPED_TRACE(type);
    ModelSpec s = spec(true, {"gelu", type});
    s.recompute_where = {"model.toml", 7, 13};
    try {
      model(s, DType::fp32);
      FAIL() << "built";
    } catch (const sdk::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("model.recompute"), std::string::npos) << what;
      EXPECT_NE(what.find(type), std::string::npos) << what;
      EXPECT_NE(what.find("model.toml:7:13"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace mixtrain::core
