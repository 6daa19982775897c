// Precision planning in the host: what a policy is told about each op (kind, GEMMs with their
// operand roles, precision sensitivity), the one place precision-sensitive ops are pinned to FP32,
// how [[precision.override]] meets a pinned op (a glob leaves it, its exact name overrides it), a
// layer norm's output stored in the bf16 its GEMM readers read, and FP8 scaling slots named per
// GEMM, "<node>.<gemm>.<role>".
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu_test_backend.h"
#include "graph/ops/operand_scaler.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/precision/planning.h"
#include "mixtrain/sdk/policy_block_scaling.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "plugin_test_support.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using sdk::OperandRole;
using test_support::cpu;

// A policy that plans every op in bf16, precision-sensitive ones included, and records what it
// was told; with `fp8`, GEMM inputs are FP8 and it records the operand slots the host asks for.
class RecordingPolicy final : public sdk::PrecisionPolicy {
 public:
  explicit RecordingPolicy(bool fp8 = false) : fp8_(fp8) {}
  sdk::OpPrecision plan(const sdk::OpDescription& op) const override {
    seen.push_back(op);
    return {DType::bf16, fp8_ && op.has_gemm() ? DType::fp8_e4m3 : DType::bf16, DType::bf16,
            DType::bf16};
  }
  bool needs_loss_scaling() const override { return false; }
  bool uses_scaled_operands() const override { return fp8_; }
  sdk::OperandScaling operand_scaling(const sdk::OperandSlot& slot) override {
    asked.insert(slot.name());
    ++asks[slot.name()];
    EXPECT_EQ(slot.name(), slot.node() + "." + slot.gemm() + "." +
                               std::string(sdk::operand_role_name(slot.role())));
    return {slot.role() == OperandRole::grad_output ? DType::fp8_e5m2 : DType::fp8_e4m3, 1.0f,
            1.0f};
  }
  void record_amax(const sdk::OperandSlot& slot, float amax) override {
    recorded.insert(slot.name());
    EXPECT_GE(amax, 0.0f) << slot.name();
  }

  mutable std::vector<sdk::OpDescription> seen;
  std::set<std::string> asked, recorded;
  std::map<std::string, int> asks;  // casts per slot

 private:
  bool fp8_;
};

// input [8] -> fc1 [8] -> relu1 -> ln1 -> head [3]
std::unique_ptr<Model> small_model() {
  ModelSpec spec;
  const sdk::SourceLocation where{"model.toml", 1, 1};
  spec.layers = {test_support::op("linear", "fc1", {{"out", 8}}, {}, where),
                 test_support::op("relu", "relu1", {}, {}, where),
                 test_support::op("layernorm", "ln1", {}, {}, where),
                 test_support::op("linear", "head", {{"out", 3}}, {}, where)};
  return std::make_unique<Model>(cpu(), spec, 8, 3);
}

const Layer& layer(const Model& m, const std::string& name) {
  for (const auto& l : m.layers())
    if (l->name() == name) return *l;
  throw std::runtime_error("no layer " + name);
}

bool all_fp32(const sdk::OpPrecision& p) {
  return p.weight == DType::fp32 && p.gemm_input == DType::fp32 && p.activation == DType::fp32 &&
         p.activation_grad == DType::fp32;
}

PrecisionOverride override_of(std::string pattern, DType dtype) {
  PrecisionOverride o;
  o.pattern = std::move(pattern);
  o.weight = o.gemm_input = o.activation = o.activation_grad = dtype;
  o.where = {"run.toml", 12, 1};
  return o;
}

TEST(PrecisionPlanning, ThePolicySeesEachOpsKindGemmsAndSensitivity) {
  auto m = small_model();
  RecordingPolicy policy;
  plan_precision(*m, policy, cpu()->capabilities(), {});
  ASSERT_EQ(policy.seen.size(), 4u);
  const auto& fc1 = policy.seen[0];
  EXPECT_EQ(fc1.name, "fc1");
  EXPECT_EQ(fc1.kind, "linear");
  EXPECT_EQ(fc1.in_features, 8);
  EXPECT_EQ(fc1.out_features, 8);
  ASSERT_EQ(fc1.gemms.size(), 1u);
  EXPECT_EQ(fc1.gemms[0].name, "matmul");
  EXPECT_EQ(fc1.gemms[0].operands,
            (std::vector<OperandRole>{OperandRole::input, OperandRole::weight,
                                      OperandRole::grad_output}));
  EXPECT_FALSE(fc1.precision_sensitive);
  EXPECT_EQ(policy.seen[1].kind, "relu");
  EXPECT_FALSE(policy.seen[1].has_gemm());
  EXPECT_FALSE(policy.seen[1].precision_sensitive);
  EXPECT_EQ(policy.seen[2].kind, "layernorm");
  EXPECT_FALSE(policy.seen[2].has_gemm());
  EXPECT_TRUE(policy.seen[2].precision_sensitive);
  EXPECT_EQ(policy.seen[3].name, "head");
  EXPECT_EQ(policy.seen[3].out_features, 3);
}

TEST(PrecisionPlanning, TheHostPinsSensitiveOpsToFp32WhateverThePolicyPlans) {
  auto m = small_model();
  RecordingPolicy policy;
  test::CapturingSink sink;
  plan_precision(*m, policy, cpu()->capabilities(), {}, sdk::Logger(&sink, "test"));
  // Pinned, but for its output, which head reads as a bf16 GEMM operand (the next test).
  const auto& ln = layer(*m, "ln1").precision();
  EXPECT_EQ(ln.weight, DType::fp32);
  EXPECT_EQ(ln.gemm_input, DType::fp32);
  EXPECT_EQ(ln.activation_grad, DType::fp32);
  EXPECT_EQ(layer(*m, "fc1").precision().gemm_input, DType::bf16);
  EXPECT_EQ(layer(*m, "relu1").precision().activation, DType::bf16);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::debug,
                            "op 'ln1' (layernorm) is precision-sensitive: kept in fp32"));
}

// A layer norm whose every reader reads it as a bf16 GEMM operand stores its output in bf16;
// one read in FP32 (an override keeping head in fp32), an override naming it, or a reader that
// is no GEMM keep it in FP32.
TEST(PrecisionPlanning, ALayerNormReadOnlyByBf16GemmsStoresItsOutputInBf16) {
  {
    auto m = small_model();
    RecordingPolicy policy;
    test::CapturingSink sink;
    plan_precision(*m, policy, cpu()->capabilities(), {}, sdk::Logger(&sink, "test"));
    EXPECT_EQ(layer(*m, "ln1").precision().activation, DType::bf16);
    EXPECT_TRUE(sink.contains(sdk::LogLevel::debug,
                              "op 'ln1' (layernorm) stores its output in bf16, the dtype its "
                              "readers' GEMMs read it in"));
  }
  {
    auto m = small_model();
    RecordingPolicy policy;
    plan_precision(*m, policy, cpu()->capabilities(), {override_of("head", DType::fp32)});
    EXPECT_TRUE(all_fp32(layer(*m, "ln1").precision())) << "head reads it in fp32";
  }
  {
    auto m = small_model();
    RecordingPolicy policy;
    plan_precision(*m, policy, cpu()->capabilities(), {override_of("ln1", DType::fp32)});
    EXPECT_TRUE(all_fp32(layer(*m, "ln1").precision())) << "named by an override";
  }
  {
    ModelSpec spec;
    spec.graph = true;
    spec.layers = {test_support::op("linear", "fc1", {{"out", 8}}, {"input"}),
                   test_support::op("layernorm", "ln1", {}, {"fc1"}),
                   test_support::op("linear", "mix", {{"out", 8}}, {"ln1"}),
                   test_support::op("add", "sum", {}, {"mix", "ln1"}),
                   test_support::op("linear", "head", {{"out", 3}}, {"sum"})};
    Model m(cpu(), spec, 8, 3);
    RecordingPolicy policy;
    plan_precision(m, policy, cpu()->capabilities(), {});
    EXPECT_TRUE(all_fp32(layer(m, "ln1").precision())) << "an add reads it too";
  }
}

// The shared CPU backend, counting its casts.
class CastCountingBackend final : public test_support::ForwardingBackend {
 public:
  void cast(sdk::TensorView s, sdk::TensorView d, const sdk::CastArgs& a) override {
    ++casts;
    test_support::ForwardingBackend::cast(s, d, a);
  }
  int casts = 0;
};

// The stored bf16 output is the bits the readers' casts made: a training step gives the same
// loss and gradients as with the output in FP32, without the casts.
TEST(PrecisionPlanning, ALayerNormsBf16OutputTrainsAsTheReadersCastsDid) {
  auto step = [](bool stored_in_bf16) {
    auto backend = std::make_shared<CastCountingBackend>();
    ModelSpec spec;
    spec.layers = {test_support::op("linear", "fc1", {{"out", 8}}),
                   test_support::op("relu", "relu1"), test_support::op("layernorm", "ln1"),
                   test_support::op("linear", "head", {{"out", 3}})};
    Model m(backend, spec, 8, 3);
    RecordingPolicy policy;
    plan_precision(m, policy, backend->capabilities(), {});
    if (!stored_in_bf16) {
      auto& ln = *m.layers()[2];
      auto p = ln.precision();
      p.activation = DType::fp32;
      ln.set_precision(p);
    }
    m.allocate(4);
    m.init_parameters(7);
    m.refresh_working_copies();
    std::vector<float> x(4 * 8);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.37f * static_cast<float>(i % 11) - 1.3f;
    std::vector<std::int32_t> y = {0, 1, 2, 0};
    backend->copy_from_host(m.input(4), x.data());
    backend->copy_from_host(m.labels(4), y.data());
    backend->casts = 0;
    m.forward(4);
    std::vector<float> out = {m.loss(4, 1.0f, true).loss};
    m.backward(4);
    for (auto* p : m.parameters()) {
      const auto g = test_support::read(p->grad.view());
      out.insert(out.end(), g.begin(), g.end());
    }
    return std::pair{out, backend->casts};
  };
  const auto [stored, casts_stored] = step(true);
  const auto [fp32, casts_fp32] = step(false);
  EXPECT_EQ(stored, fp32);
  // head cast ln1's fp32 output to bf16 twice, for its forward and for its weight gradient.
  EXPECT_EQ(casts_fp32 - casts_stored, 2);
}

TEST(PrecisionPlanning, AGlobOverrideLeavesSensitiveOpsPinned) {
  auto m = small_model();
  RecordingPolicy policy;
  plan_precision(*m, policy, cpu()->capabilities(), {override_of("*", DType::fp16)});
  EXPECT_EQ(layer(*m, "fc1").precision().gemm_input, DType::fp16);
  EXPECT_EQ(layer(*m, "relu1").precision().activation, DType::fp16);
  EXPECT_EQ(layer(*m, "head").precision().activation_grad, DType::fp16);
  EXPECT_TRUE(all_fp32(layer(*m, "ln1").precision()));
}

TEST(PrecisionPlanning, NamingASensitiveOpExactlyOverridesItWithAWarning) {
  auto m = small_model();
  RecordingPolicy policy;
  test::CapturingSink sink;
  auto o = override_of("ln1", DType::bf16);
  o.weight.reset();
  o.gemm_input.reset();
  plan_precision(*m, policy, cpu()->capabilities(), {o}, sdk::Logger(&sink, "test"));
  const auto& p = layer(*m, "ln1").precision();
  EXPECT_EQ(p.activation, DType::bf16);
  EXPECT_EQ(p.activation_grad, DType::bf16);
  EXPECT_EQ(p.weight, DType::fp32);
  EXPECT_TRUE(sink.contains(sdk::LogLevel::warn,
                            "[[precision.override]] at run.toml:12:1 takes precision-sensitive op "
                            "'ln1' (layernorm) out of fp32"));
}

TEST(PrecisionPlanning, AGlobMatchingOnlySensitiveOpsIsAnErrorThatSaysHowToNameOne) {
  auto m = small_model();
  RecordingPolicy policy;
  try {
    plan_precision(*m, policy, cpu()->capabilities(), {override_of("ln*", DType::bf16)});
    FAIL() << "no ConfigError";
  } catch (const sdk::ConfigError& e) {
    const std::string msg = e.full_message();
    EXPECT_NE(msg.find("run.toml:12"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'ln*' matches only precision-sensitive ops (ln1), which a glob leaves in "
                       "fp32"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("layers = \"ln1\""), std::string::npos) << msg;
  }
}

// The logits node of a per-tensor FP8 plan computes in the policy's 16-bit activations (planning.h
// says why), logged; an override naming it puts it back in FP8, and a plan without FP8 is left
// alone.
TEST(PrecisionPlanning, PerTensorFp8KeepsTheLogitsNodeIn16BitsUnlessAnOverrideNamesIt) {
  {
    auto m = small_model();
    RecordingPolicy policy(/*fp8=*/true);
    test::CapturingSink sink;
    plan_precision(*m, policy, cpu()->capabilities(), {}, sdk::Logger(&sink, "test"));
    EXPECT_EQ(layer(*m, "fc1").precision().gemm_input, DType::fp8_e4m3);
    EXPECT_EQ(layer(*m, "head").precision().gemm_input, DType::bf16);
    EXPECT_EQ(layer(*m, "head").precision().weight, DType::bf16);
    EXPECT_FALSE(layer(*m, "head").operand_scaler()->active());
    EXPECT_TRUE(sink.contains(sdk::LogLevel::info,
                              "the logits node 'head' computes its GEMMs in bf16, not FP8"));
    EXPECT_TRUE(sink.contains(sdk::LogLevel::info, "gemm_input = \"fp8_e4m3\" keeps it in FP8"));
  }
  {
    auto m = small_model();
    RecordingPolicy policy(/*fp8=*/true);
    PrecisionOverride fp8_head;
    fp8_head.pattern = "head";
    fp8_head.gemm_input = DType::fp8_e4m3;
    plan_precision(*m, policy, cpu()->capabilities(), {fp8_head});
    EXPECT_EQ(layer(*m, "head").precision().gemm_input, DType::fp8_e4m3);
    EXPECT_TRUE(layer(*m, "head").operand_scaler()->active());
  }
  {
    auto m = small_model();
    RecordingPolicy policy;
    test::CapturingSink sink;
    plan_precision(*m, policy, cpu()->capabilities(), {}, sdk::Logger(&sink, "test"));
    EXPECT_EQ(layer(*m, "head").precision().gemm_input, DType::bf16);
    EXPECT_FALSE(sink.contains(sdk::LogLevel::info, "the logits node"));
  }
}

// The FP8 model of the slot tests: the logits node back in FP8 by an override, so that both
// linears scale their operands.
std::vector<PrecisionOverride> fp8_head() {
  PrecisionOverride o;
  o.pattern = "head";
  o.gemm_input = DType::fp8_e4m3;
  return {o};
}

TEST(PrecisionPlanning, Fp8OperandSlotsAreNamedPerGemm) {
  auto m = small_model();
  RecordingPolicy policy(/*fp8=*/true);
  plan_precision(*m, policy, cpu()->capabilities(), fp8_head());
  m->allocate(4);
  m->init_parameters(7);
  m->refresh_working_copies();
  for (auto& l : m->layers()) l->collect_operand_stats(true);
  std::vector<float> x(4 * 8);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  std::vector<std::int32_t> y = {0, 1, 2, 0};
  test_support::write(m->input(4), x);
  cpu()->copy_from_host(m->labels(4), y.data());
  m->forward(4);
  m->compute_loss(4, 1.0f, true);
  m->backward(4);
  m->flush_operand_amaxes();

  const std::set<std::string> expected = {"fc1.matmul.input",       "fc1.matmul.weight",
                                          "fc1.matmul.grad_output", "head.matmul.input",
                                          "head.matmul.weight",     "head.matmul.grad_output"};
  EXPECT_EQ(policy.asked, expected);
  EXPECT_EQ(policy.recorded, expected);
  std::set<std::string> stats;
  for (const auto& l : m->layers())
    for (const auto& st : l->operand_stats()) stats.insert(st.slot);
  EXPECT_EQ(stats, expected) << "the FP8 statistics use the policy's slot names";
}

// A weight is cast to FP8 once per optimizer step: the second micro-batch reuses the first's copy
// (and sums the same gradient again, exactly), while inputs and gradients are cast every time;
// after the step's flush the next forward casts the weights anew, so an evaluation between steps
// sees the updated ones.
TEST(PrecisionPlanning, AWeightIsCastToFp8OncePerStepAcrossItsMicroBatches) {
  auto accumulated = small_model(), single = small_model();
  RecordingPolicy policy(/*fp8=*/true), single_policy(/*fp8=*/true);
  plan_precision(*accumulated, policy, cpu()->capabilities(), fp8_head());
  plan_precision(*single, single_policy, cpu()->capabilities(), fp8_head());
  std::vector<float> x(4 * 8);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  const std::vector<std::int32_t> y = {0, 1, 2, 0};
  for (Model* m : {accumulated.get(), single.get()}) {
    m->allocate(4);
    m->init_parameters(7);
    test_support::write(m->input(4), x);
    cpu()->copy_from_host(m->labels(4), y.data());
  }
  auto micro_batch = [&](Model& m, std::int64_t k, std::int64_t count) {
    m.begin_micro_batch(k, count);
    m.forward(4);
    m.compute_loss(4, 1.0f, true);
    m.backward(4);
  };
  micro_batch(*accumulated, 0, 2);
  micro_batch(*accumulated, 1, 2);
  micro_batch(*single, 0, 1);
  EXPECT_EQ(policy.asks["fc1.matmul.weight"], 1);
  EXPECT_EQ(policy.asks["head.matmul.weight"], 1);
  EXPECT_EQ(policy.asks["fc1.matmul.input"], 2);
  EXPECT_EQ(policy.asks["head.matmul.grad_output"], 2);
  const auto twice = test_support::read(accumulated->parameters()[0]->grad.view());
  const auto once = test_support::read(single->parameters()[0]->grad.view());
  ASSERT_EQ(twice.size(), once.size());
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_EQ(twice[i], 2.0f * once[i]) << i;
  accumulated->flush_operand_amaxes();
  single->flush_operand_amaxes();
  // The optimizer's turn: new weights in both models, then an evaluation forward.
  for (Model* m : {accumulated.get(), single.get()}) {
    auto w = test_support::read(m->parameters()[0]->master.view());
    for (float& v : w) v *= -0.5f;
    test_support::write(m->parameters()[0]->master.view(), w);
    m->refresh_working_copies();
    m->forward(4);
  }
  EXPECT_EQ(policy.asks["fc1.matmul.weight"], 2);
  std::vector<float> got(4 * 3), want(got.size());
  Tensor scratch;
  copy_to_host_fp32(cpu(), accumulated->logits(4), got.data(), scratch);
  copy_to_host_fp32(cpu(), single->logits(4), want.data(), scratch);
  EXPECT_EQ(got, want);
}

// A block-scaled policy with fp8-block's layouts (1x128 along each pass's reduction dim, 128x128
// weights), everything else fp32.
class Fp8BlockPolicy final : public sdk::PrecisionPolicy, public sdk::BlockScalingFacet {
 public:
  sdk::OpPrecision plan(const sdk::OpDescription& op) const override {
    return {DType::fp32, op.has_gemm() ? DType::fp8_e4m3 : DType::fp32, DType::fp32, DType::fp32};
  }
  bool needs_loss_scaling() const override { return false; }
  sdk::BlockScaledOperandPlan operand_plan(const sdk::OperandSlot& slot, sdk::GemmPass,
                                           sdk::ReductionAxis axis) const override {
    return {slot.role() == OperandRole::weight ? sdk::fp8_block_weight_layout()
                                               : sdk::fp8_block_layout(axis),
            false};
  }
};

// The CPU backend's gemm facet, forwarded: a test facet derives from it and overrides what it
// answers differently.
class ForwardingGemm : public sdk::GemmFacet {
 public:
  explicit ForwardingGemm(sdk::GemmFacet* in) : in_(in) {}
  bool supports(sdk::GemmOp op, std::span<const DType> dtypes) const override {
    return in_->supports(op, dtypes);
  }
  void gemm(const sdk::GemmArgs& args) override { in_->gemm(args); }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& args) override {
    in_->gemm_strided_batched(args);
  }
  void quantize_block_scaled(const sdk::BlockQuantizeArgs& args) override {
    in_->quantize_block_scaled(args);
  }
  void gemm_block_scaled(const sdk::BlockScaledGemmArgs& args) override {
    in_->gemm_block_scaled(args);
  }
  void gemm_gradient(const sdk::GemmGradientArgs& args) override { in_->gemm_gradient(args); }

 private:
  sdk::GemmFacet* in_;
};

// The CPU backend with gemm facet G (a ForwardingGemm) standing in for its own.
template <class G>
class CpuWithGemm final : public test_support::ForwardingBackend {
 public:
  CpuWithGemm() : gemm_(static_cast<sdk::GemmFacet*>(in_->find_facet(sdk::GemmFacet::kName))) {}
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::GemmFacet::kName ? &gemm_ : in_->find_facet(name);
  }
  G gemm_;
};

// A gemm facet whose device runs no 128x128 layout (facet 1.3's refusal), as a GPU without them
// answers.
class GemmWithout2dBlocks final : public ForwardingGemm {
 public:
  using ForwardingGemm::ForwardingGemm;
  std::string block_layout_refusal(const sdk::BlockScaledLayout& layout) const override {
    return layout.block_rows == 128 && layout.block_cols == 128
               ? "Test GPU (sm_80) has no 128x128 block scales"
               : "";
  }
};
using CpuWithout2dBlocks = CpuWithGemm<GemmWithout2dBlocks>;

TEST(PrecisionPlanning, ABlockLayoutTheBackendDoesNotRunIsRefusedAtTheNodeWithItsReason) {
  ModelSpec spec;
  spec.layers = {test_support::op("linear", "fc1", {{"out", 8}}, {}, {"model.toml", 4, 3}),
                 test_support::op("linear", "head", {{"out", 3}}, {}, {"model.toml", 5, 3})};
  Fp8BlockPolicy policy;
  {
    Model runs(cpu(), spec, 8, 3);  // the CPU simulator runs every layout
    EXPECT_NO_THROW(plan_precision(runs, policy, cpu()->capabilities(), {}));
  }
  auto backend = std::make_shared<CpuWithout2dBlocks>();
  Model m(backend, spec, 8, 3);
  try {
    plan_precision(m, policy, backend->capabilities(), {});
    FAIL() << "the plan was accepted";
  } catch (const sdk::ConfigError& e) {
    const std::string what = e.full_message();
    for (const char* part : {"model.toml:4:3", "'fc1'", "fc1.matmul.weight", "128x128",
                             "Test GPU (sm_80) has no 128x128 block scales", "backend.type=cpu"})
      EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
  }
}

// A block-scaled policy whose quantizations draw per step: dy rounded stochastically (nvfp4's
// gradients) and / or the wgrad inputs through the random Hadamard transform.
class DrawingBlockPolicy final : public sdk::PrecisionPolicy, public sdk::BlockScalingFacet {
 public:
  DrawingBlockPolicy(bool stochastic, bool hadamard)
      : stochastic_(stochastic), hadamard_(hadamard) {}
  sdk::OpPrecision plan(const sdk::OpDescription& op) const override {
    return {DType::fp32, op.has_gemm() ? DType::fp8_e4m3 : DType::fp32, DType::fp32, DType::fp32};
  }
  bool needs_loss_scaling() const override { return false; }
  sdk::BlockScaledOperandPlan operand_plan(const sdk::OperandSlot& slot, sdk::GemmPass,
                                           sdk::ReductionAxis axis) const override {
    return {sdk::fp8_block_layout(axis), stochastic_ && slot.role() == OperandRole::grad_output};
  }
  bool random_hadamard_transform(const sdk::OperandSlot&) const override { return hadamard_; }

 private:
  bool stochastic_, hadamard_;
};

TEST(PrecisionPlanning, ALinearWhoseBlockQuantizationDrawsPerStepIsNoStaticStep) {
  // Its bits are keyed by the step: a recorded step graph would replay the first step's.
  ModelSpec spec;
  spec.layers = {test_support::op("linear", "fc1", {{"out", 3}}, {}, {"model.toml", 4, 3})};
  for (auto [stochastic, hadamard] :
       {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
    DrawingBlockPolicy policy(stochastic, hadamard);
    Model m(cpu(), spec, 8, 3);
    plan_precision(m, policy, cpu()->capabilities(), {});
    EXPECT_EQ(m.layers()[0]->traits().varies_per_step, stochastic || hadamard)
        << "stochastic " << stochastic << ", hadamard " << hadamard;
  }
}

// A gemm facet that asks for transposed quantizations (facet 1.4), as the CUDA backend's does,
// and counts the outputs it got so stored.
class GemmQuantizingTransposed final : public ForwardingGemm {
 public:
  using ForwardingGemm::ForwardingGemm;
  void quantize_block_scaled(const sdk::BlockQuantizeArgs& args) override {
    for (const auto& out : args.outputs)
      if (!out.codes.empty() && out.transpose) ++transposed_outputs;
    ForwardingGemm::quantize_block_scaled(args);
  }
  bool quantizes_transposed() const override { return true; }
  int transposed_outputs = 0;
};
using CpuQuantizingTransposed = CpuWithGemm<GemmQuantizingTransposed>;

// One forward, loss and backward of a 3-layer MLP under `policy`: the loss and every gradient.
std::vector<std::vector<float>> block_scaled_step(const std::shared_ptr<sdk::DeviceBackend>& b,
                                                  sdk::PrecisionPolicy& policy) {
  ModelSpec spec;
  spec.layers = {test_support::op("linear", "fc1", {{"out", 40}}), test_support::op("relu", "r"),
                 test_support::op("linear", "fc2", {{"out", 24}}), test_support::op("relu", "r2"),
                 test_support::op("linear", "head", {{"out", 5}})};
  Model m(b, spec, 72, 5);
  plan_precision(m, policy, b->capabilities(), {});
  const std::int64_t batch = 48;
  m.allocate(batch);
  m.init_parameters(7);
  std::vector<float> x(static_cast<std::size_t>(batch * 72));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>((i * 37) % 101) / 25.0f - 2.0f;
  b->copy_from_host(m.input(batch), x.data());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 5);
  b->copy_from_host(m.labels(batch), labels.data());
  m.forward(batch);
  const LossValues loss = m.loss(batch, 1.0f, true);
  m.backward(batch);
  std::vector<std::vector<float>> out = {{loss.loss}};
  for (auto* p : m.parameters()) out.push_back(test_support::read(p->grad.view()));
  return out;
}

TEST(PrecisionPlanning, TransposedQuantizationsGiveTheSameStepBitForBit) {
  // fp8-block's layouts, and with dy rounded stochastically (its bits keyed by src's index).
  Fp8BlockPolicy plain;
  DrawingBlockPolicy stochastic(true, false);
  for (sdk::PrecisionPolicy* policy : {static_cast<sdk::PrecisionPolicy*>(&plain),
                                       static_cast<sdk::PrecisionPolicy*>(&stochastic)}) {
    auto transposing = std::make_shared<CpuQuantizingTransposed>();
    const auto want = block_scaled_step(cpu(), *policy);
    const auto got = block_scaled_step(transposing, *policy);
    // x and dy of three linears stored transposed for wgrad, and fp8-block's 128x128 weights for
    // dgrad (no longer shared with forward).
    EXPECT_EQ(transposing->gemm_.transposed_outputs, 9);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "entry " << i;
  }
}

// A policy whose plan stores a tensor in a dtype nothing stores (fp8 is a GEMM operand dtype) is
// refused as the policy's fault at planning, naming the op and the role; an override doing the
// same is refused at its line, with the key that puts fp8 where it goes.
class StoresFp8 final : public sdk::PrecisionPolicy {
 public:
  explicit StoresFp8(int role) : role_(role) {}
  sdk::OpPrecision plan(const sdk::OpDescription&) const override {
    sdk::OpPrecision p{DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    (role_ == 0   ? p.weight
     : role_ == 1 ? p.activation
                  : p.activation_grad) = role_ == 1 ? DType::int32 : DType::fp8_e4m3;
    return p;
  }
  bool needs_loss_scaling() const override { return false; }

 private:
  int role_;
};

TEST(PrecisionPlanning, AStoredDtypeOtherThanFp32Tf32Bf16OrFp16IsRefusedAsThePolicysFault) {
  const char* roles[] = {"weight is fp8_e4m3", "activation is int32",
                         "activation_grad is fp8_e4m3"};
  for (int role = 0; role < 3; ++role) {
    auto m = small_model();
    StoresFp8 policy(role);
    try {
      plan_precision(*m, policy, cpu()->capabilities(), {});
      ADD_FAILURE() << "planned " << roles[role];
    } catch (const sdk::PluginError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the precision policy planned op 'fc1' (linear)"), std::string::npos)
          << what;
      EXPECT_NE(what.find(roles[role]), std::string::npos) << what;
      EXPECT_EQ(what.find("GEMM operand dtype") != std::string::npos, role != 1) << what;
    }
  }
  auto m = small_model();
  RecordingPolicy policy;
  PrecisionOverride fp8_weight;
  fp8_weight.pattern = "fc1";
  fp8_weight.weight = DType::fp8_e4m3;
  fp8_weight.where = {"run.toml", 12, 1};
  try {
    plan_precision(*m, policy, cpu()->capabilities(), {fp8_weight});
    ADD_FAILURE() << "an override stored fc1's weight in fp8";
  } catch (const sdk::ConfigError& e) {
    EXPECT_EQ(e.where().to_string(), "run.toml:12:1");
    EXPECT_EQ(e.key(), "precision.override.weight");
    EXPECT_NE(e.hint().find("set gemm_input = fp8_e4m3 instead"), std::string::npos) << e.hint();
  }
}

// FP8 GEMM inputs under a policy that scales no operands (an override's) run at a scale of 1:
// allowed, and said once naming the layers; under an FP8 policy, nothing is said.
TEST(PrecisionPlanning, Fp8GemmInputsThatNoPolicyScalesAreSaidOnce) {
  PrecisionOverride fp8;
  fp8.pattern = "*";
  fp8.gemm_input = DType::fp8_e4m3;
  fp8.where = {"run.toml", 3, 1};
  {
    auto m = small_model();
    RecordingPolicy policy;
    test::CapturingSink sink;
    plan_precision(*m, policy, cpu()->capabilities(), {fp8}, sdk::Logger(&sink, "test"));
    EXPECT_TRUE(
        sink.contains(sdk::LogLevel::warn, "GEMM inputs in fp8 at a scale of 1 for 'fc1', 'head'"));
  }
  auto m = small_model();
  RecordingPolicy policy(true);
  test::CapturingSink sink;
  plan_precision(*m, policy, cpu()->capabilities(), {}, sdk::Logger(&sink, "test"));
  EXPECT_FALSE(sink.contains(sdk::LogLevel::warn, "at a scale of 1"));
}

// A convolution reads fp8 operands only as a policy scales them (its channels-last input is cast
// by its operand scaler): unscaled fp8 GEMM inputs for it are refused at planning, at the
// override that asked for them, or as the policy's fault; they failed inside the backend's
// layout permute at the first step.
TEST(PrecisionPlanning, AConvolutionWithFp8InputsNoPolicyScalesIsRefusedAtPlanning) {
  const auto cnn = [] {
    ModelSpec spec;
    spec.graph = true;
    spec.layers = {test_support::op("conv2d", "stem", {{"out", 4}, {"kernel", 3}}, {"input"}),
                   test_support::op("global_avgpool", "gap", {}, {"stem"}),
                   test_support::op("linear", "fc", {{"out", 3}}, {"gap"})};
    InputSpec in;
    in.sample_shape = {2, 5, 5};
    return std::make_unique<Model>(cpu(), spec, 2 * 5 * 5, 3, in);
  };
  PrecisionOverride fp8;
  fp8.pattern = "stem";
  fp8.gemm_input = DType::fp8_e4m3;
  fp8.where = {"run.toml", 7, 1};
  {
    auto m = cnn();
    RecordingPolicy bf16;
    try {
      plan_precision(*m, bf16, cpu()->capabilities(), {fp8});
      ADD_FAILURE() << "planned an unscaled fp8 convolution";
    } catch (const sdk::ConfigError& e) {
      EXPECT_EQ(e.where().to_string(), "run.toml:7:1");
      EXPECT_NE(std::string(e.what()).find("op 'stem' (conv2d) would read fp8 GEMM inputs at a "
                                           "scale of 1"),
                std::string::npos)
          << e.what();
    }
  }
  {
    auto m = cnn();
    // The same plan from a policy that scales nothing.
    class PlansFp8 final : public sdk::PrecisionPolicy {
     public:
      sdk::OpPrecision plan(const sdk::OpDescription& op) const override {
        return {DType::bf16, op.has_gemm() ? DType::fp8_e4m3 : DType::bf16, DType::bf16,
                DType::bf16};
      }
      bool needs_loss_scaling() const override { return false; }
    } policy;
    EXPECT_THROW(plan_precision(*m, policy, cpu()->capabilities(), {}), sdk::PluginError);
  }
  // Scaled by an FP8 policy, it plans.
  auto m = cnn();
  RecordingPolicy scaled(true);
  EXPECT_NO_THROW(plan_precision(*m, scaled, cpu()->capabilities(), {}));
}

// What operand_scaling() gives is checked before a cast uses it: an operand scaled to a dtype
// that is not fp8, a scale that is not a finite number above 0, or a scale_inv that is not its
// inverse is the policy's fault, named with the slot and the values (such a run trained silently
// in bf16, or diverged blaming the learning rate).
class GivesScaling final : public sdk::PrecisionPolicy {
 public:
  explicit GivesScaling(sdk::OperandScaling s) : s_(s) {}
  sdk::OpPrecision plan(const sdk::OpDescription& op) const override {
    return {DType::bf16, op.has_gemm() ? DType::fp8_e4m3 : DType::bf16, DType::bf16, DType::bf16};
  }
  bool needs_loss_scaling() const override { return false; }
  bool uses_scaled_operands() const override { return true; }
  sdk::OperandScaling operand_scaling(const sdk::OperandSlot&) override { return s_; }

 private:
  sdk::OperandScaling s_;
};

TEST(PrecisionPlanning, AnOperandScalingThatIsNotFp8AtAFiniteInvertedScaleIsThePolicysFault) {
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    sdk::OperandScaling s;
    const char* said;
  } cases[] = {
      {{DType::bf16, 1.0f, 1.0f}, "dtype bf16, scale 1, scale_inv 1: a scaled operand is cast to"},
      {{DType::fp8_e4m3, 0.0f, inf}, "the scale and its inverse must be finite numbers above 0"},
      {{DType::fp8_e4m3, std::nanf(""), 1.0f}, "must be finite numbers above 0"},
      {{DType::fp8_e4m3, 4.0f, 1.0f}, "scale 4, scale_inv 1: scale_inv must be 1 / scale"},
  };
  for (const auto& c : cases) {
    ModelSpec spec;
    spec.layers = {test_support::op("linear", "fc1", {{"out", 8}}),
                   test_support::op("linear", "head", {{"out", 3}})};
    Model m(cpu(), spec, 8, 3);
    GivesScaling policy(c.s);
    plan_precision(m, policy, cpu()->capabilities(), {});
    m.allocate(4);
    m.init_parameters(1);
    std::vector<float> x(32, 0.5f);
    cpu()->copy_from_host(m.input(4), x.data());
    try {
      m.forward(4);
      ADD_FAILURE() << "a forward ran with " << c.said;
    } catch (const sdk::PluginError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("operand_scaling() for slot 'fc1.matmul."), std::string::npos) << what;
      EXPECT_NE(what.find(c.said), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace mixtrain::core
