// The backward epilogues of linear layers (linear.h, gemm facet 1.5's gemm_gradient): wgrad sums
// the bias gradient, and the dgrad of the linear after a fused gelu computes the gelu's gradient
// and its producer's bias gradient. And input gradients that their op adds into the FP32 sum of a
// tensor read several times (layer.h): a linear's dgrad with beta = 1, a layer norm's
// layernorm_backward_accumulate. Against the unfused ops from the same weights: bit for bit in
// FP32, within one bf16 rounding in bf16, with gradient accumulation, a frozen bias, a backend
// without the op and the non-finite replay.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using sdk::TensorView;
using test_support::op;

// The CPU backend's GEMM facet, counting gemm_gradient calls, or refusing the op (an older
// backend's gemm 1.4).
class CountingGemm final : public sdk::GemmFacet {
 public:
  CountingGemm(sdk::GemmFacet& in, bool offer_gradient) : in_(in), offer_(offer_gradient) {}
  bool supports(sdk::GemmOp op, std::span<const DType> d) const override {
    return (offer_ || op != sdk::GemmOp::gemm_gradient) && in_.supports(op, d);
  }
  void gemm(const sdk::GemmArgs& a) override { in_.gemm(a); }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& a) override { in_.gemm_strided_batched(a); }
  void gemm_gradient(const sdk::GemmGradientArgs& a) override {
    ++gradient_calls;
    if (a.has_activation_grad) ++activation_grad_calls;
    in_.gemm_gradient(a);
  }
  int gradient_calls = 0, activation_grad_calls = 0;

 private:
  sdk::GemmFacet& in_;
  bool offer_;
};

// The activation facet, counting the passes the epilogues replace.
class CountingActivation final : public sdk::ActivationFacet {
 public:
  explicit CountingActivation(sdk::ActivationFacet& in) : in_(in) {}
  void bias_grad(TensorView dy, TensorView db, bool acc) override {
    ++bias_grad_calls;
    in_.bias_grad(dy, db, acc);
  }
  void activation_forward(sdk::Activation a, TensorView x, TensorView y) override {
    ++activation_forward_calls;
    in_.activation_forward(a, x, y);
  }
  void activation_backward(sdk::Activation a, TensorView x, TensorView dy, TensorView dx) override {
    ++activation_backward_calls;
    in_.activation_backward(a, x, dy, dx);
  }
  void axpy(float alpha, TensorView x, TensorView y) override { in_.axpy(alpha, x, y); }
  int bias_grad_calls = 0, activation_forward_calls = 0, activation_backward_calls = 0;

 private:
  sdk::ActivationFacet& in_;
};

// gelu_unfused: whether it lists sdk::kFeatureGemmBf16GeluUnfused (on any CPU).
class CountingBackend final : public test_support::GeluFeatureBackend {
 public:
  CountingBackend(bool offer_gradient, bool gelu_unfused)
      : GeluFeatureBackend(gelu_unfused),
        gemm(*sdk::facet<sdk::GemmFacet>(*in_), offer_gradient),
        activation(*sdk::facet<sdk::ActivationFacet>(*in_)) {}
  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::GemmFacet::kName) return &gemm;
    if (name == sdk::ActivationFacet::kName) return &activation;
    return in_->find_facet(name);
  }
  CountingGemm gemm;
  CountingActivation activation;
};

// GPT-2's MLP shape in small, with a head: fc (+gelu epilogue) -> gelu -> proj -> head.
ModelSpec mlp(bool fuse) {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {op("linear", "fc", {{"out", 24}}, {"input"}), op("gelu", "gelu", {}, {"fc"}),
                 op("linear", "proj", {{"out", 16}}, {"gelu"}),
                 op("linear", "head", {{"out", 5}}, {"proj"})};
  spec.fuse_epilogues = fuse;
  return spec;
}

constexpr std::int64_t kRows = 9;

struct Step {
  std::vector<float> values;  // the losses, then every parameter gradient
  std::shared_ptr<CountingBackend> backend;
  std::size_t gradient_bytes = 0;
};

// Two micro-batches of one step (the second accumulates), from seed 5's weights.
Step run(const ModelSpec& spec, bool offer_gradient, const sdk::OpPrecision& precision = {},
         bool gelu_unfused = false) {
  Step s;
  s.backend = std::make_shared<CountingBackend>(offer_gradient, gelu_unfused);
  Model m(s.backend, spec, 12, 5);
  for (auto& l : m.layers()) l->set_precision(precision);
  m.allocate(kRows);
  m.init_parameters(5);
  s.gradient_bytes = m.gradient_plan().sum_bytes;
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<float> x(kRows * 12);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(micro)) * 2.0f;
    std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3};
    s.backend->copy_from_host(m.input(kRows), x.data());
    s.backend->copy_from_host(m.labels(kRows), y.data());
    m.begin_micro_batch(micro, 2);
    m.forward(kRows);
    s.values.push_back(m.loss(kRows, 4.0f, true).loss);
    m.backward(kRows);
  }
  for (auto* p : m.parameters()) {
    if (p->frozen) continue;
    const auto g = test_support::read(p->grad.view());
    s.values.insert(s.values.end(), g.begin(), g.end());
  }
  return s;
}

TEST(GradientEpilogues, RunInTheGemmsAndMatchTheUnfusedOpsBitForBitInFp32) {
  const Step fused = run(mlp(true), true);
  const Step unfused = run(mlp(false), true);
  const Step older = run(mlp(true), false);  // a backend without gemm_gradient
  ASSERT_EQ(fused.values.size(), unfused.values.size());
  EXPECT_EQ(fused.values, unfused.values);
  EXPECT_EQ(older.values, unfused.values);
  // Per micro-batch: proj's dgrad with gelu's gradient and fc's bias gradient, and the wgrads of
  // proj and head with their bias gradients; fc's wgrad has no bias left to sum. Nothing else.
  EXPECT_EQ(fused.backend->gemm.gradient_calls, 2 * 3);
  EXPECT_EQ(fused.backend->gemm.activation_grad_calls, 2 * 1);
  EXPECT_EQ(fused.backend->activation.bias_grad_calls, 0);
  EXPECT_EQ(fused.backend->activation.activation_backward_calls, 0);
  for (const Step* s : {&unfused, &older}) {
    EXPECT_EQ(s->backend->gemm.gradient_calls, 0);
    EXPECT_EQ(s->backend->activation.bias_grad_calls, 2 * 3);
    EXPECT_EQ(s->backend->activation.activation_backward_calls, 2 * 1);
  }
  // The gelu's input gradient is its output's buffer, where proj's dgrad writes dz: the plan
  // holds one [9, 24] fp32 gradient less.
  EXPECT_EQ(unfused.gradient_bytes - fused.gradient_bytes,
            aligned_buffer_bytes(kRows * 24 * 4, kDefaultBufferAlignment));
  EXPECT_EQ(older.gradient_bytes, unfused.gradient_bytes);
}

TEST(GradientEpilogues, Bf16RoundsDzOnceAndStaysWithinItsRoundingOfTheUnfusedOps) {
  const sdk::OpPrecision bf16 = test_support::uniform_precision(DType::bf16);
  // The baseline runs the same fused forward on a backend without gemm_gradient: only the
  // backward differs.
  const Step fused = run(mlp(true), true, bf16);
  const Step unfused = run(mlp(true), false, bf16);
  ASSERT_EQ(fused.values.size(), unfused.values.size());
  EXPECT_EQ(fused.backend->gemm.activation_grad_calls, 2);
  double num = 0, den = 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < fused.values.size(); ++i) {
    const double d = static_cast<double>(fused.values[i]) - unfused.values[i];
    num += d * d;
    den += static_cast<double>(unfused.values[i]) * unfused.values[i];
    differ += fused.values[i] != unfused.values[i];
  }
  // The forward is the same; the backward rounds dy·W once less before gelu's gradient.
  EXPECT_EQ(fused.values[0], unfused.values[0]) << "the first loss";
  EXPECT_EQ(unfused.backend->gemm.activation_grad_calls, 0);
  EXPECT_GT(differ, 0u) << "one rounding fewer should move some gradient";
  EXPECT_LT(std::sqrt(num / den), 1e-2);
}

// A backend whose bf16 GEMMs run a gelu faster apart (sdk::kFeatureGemmBf16GeluUnfused: the CPU on
// native bf16 GEMMs) gets the gelu as its own op, forward and backward: bit for bit the model
// built unfused, the same gradient memory, and no gelu in any GEMM. Its fp32 GEMMs keep theirs.
TEST(GradientEpilogues, ABackendWhoseBf16GemmsRunAGeluFasterApartGetsTheUnfusedOps) {
  const sdk::OpPrecision bf16 = test_support::uniform_precision(DType::bf16);
  const Step apart = run(mlp(true), true, bf16, true);
  const Step unfused = run(mlp(false), true, bf16, false);
  const Step fused = run(mlp(true), true, bf16, false);
  ASSERT_EQ(apart.values.size(), unfused.values.size());
  EXPECT_EQ(apart.values, unfused.values);
  EXPECT_NE(fused.values, unfused.values) << "the fused epilogues round differently";
  EXPECT_EQ(apart.backend->gemm.activation_grad_calls, 0);
  EXPECT_EQ(apart.backend->activation.activation_forward_calls, 2);
  EXPECT_EQ(apart.backend->activation.activation_backward_calls, 2);
  EXPECT_EQ(fused.backend->activation.activation_forward_calls, 0);
  EXPECT_EQ(apart.gradient_bytes, unfused.gradient_bytes);
  const Step fp32 = run(mlp(true), true, {}, true);
  EXPECT_EQ(fp32.backend->gemm.activation_grad_calls, 2);
  EXPECT_EQ(fp32.backend->activation.activation_forward_calls, 0);
}

TEST(GradientEpilogues, AFrozenProducerBiasIsNeitherSummedNorTouched) {
  ModelSpec fused_spec = mlp(true), plain_spec = mlp(false);
  ParameterPattern bias;
  bias.pattern = "fc.bias";
  bias.key = "train.frozen[0]";
  for (ModelSpec* s : {&fused_spec, &plain_spec}) s->freeze.frozen.push_back(bias);
  const Step fused = run(fused_spec, true);
  const Step unfused = run(plain_spec, true);
  EXPECT_EQ(fused.values, unfused.values);
  EXPECT_EQ(fused.backend->gemm.activation_grad_calls, 2);
  EXPECT_EQ(fused.backend->activation.bias_grad_calls, 0);
}

TEST(GradientEpilogues, TheNonfiniteReplayRunsUnfusedAndTheNextStepIsFusedAgain) {
  auto backend = std::make_shared<CountingBackend>(true, false);
  Model m(backend, mlp(true), 12, 5);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(kRows);
  m.init_parameters(5);
  std::vector<float> x(kRows * 12, 0.25f);
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  backend->copy_from_host(m.input(kRows), x.data());
  backend->copy_from_host(m.labels(kRows), y.data());
  auto gradients = [&] {
    std::vector<float> all;
    for (auto* p : m.parameters()) {
      const auto g = test_support::read(p->grad.view());
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  };
  m.forward(kRows);
  m.loss(kRows, 1.0f, true);
  m.backward(kRows);
  const std::vector<float> step = gradients();
  ASSERT_EQ(backend->gemm.gradient_calls, 3);
  const int unfused_activation_grads = backend->activation.activation_backward_calls;
  EXPECT_EQ(locate_first_nonfinite(m, kRows, 1.0f).where, "");
  // The replay computed gelu's gradient by itself, in place where proj's dgrad wrote dy·W.
  EXPECT_GT(backend->activation.activation_backward_calls, unfused_activation_grads);
  EXPECT_EQ(gradients(), step);
  m.forward(kRows);
  m.loss(kRows, 1.0f, true);
  m.backward(kRows);
  EXPECT_EQ(gradients(), step);
  EXPECT_EQ(backend->gemm.activation_grad_calls, 2) << "fused again after the replay";
}

// Two tensors read twice: fc's output by a layer norm and a residual add (GPT's residual stream),
// and the add's output by two linears (LoRA's base and A read one x), which join sums as a sum of
// linears when fused (add.h).
ModelSpec two_readers(bool fuse) {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {
      op("linear", "fc", {{"out", 16}}, {"input"}), op("layernorm", "ln", {}, {"fc"}),
      op("linear", "mix", {{"out", 16}}, {"ln"}),   op("add", "sum", {}, {"mix", "fc"}),
      op("linear", "l1", {{"out", 16}}, {"sum"}),   op("linear", "l2", {{"out", 16}}, {"sum"}),
      op("add", "join", {}, {"l1", "l2"}),          op("linear", "head", {{"out", 5}}, {"join"})};
  spec.fuse_epilogues = fuse;
  return spec;
}

struct Observed {
  std::vector<float> values;  // the loss, then every parameter gradient
  std::map<std::string, int> calls;
};

Observed observe(const ModelSpec& spec, const sdk::OpPrecision& precision = {}) {
  auto backend = std::make_shared<test_support::CallCountingBackend>();
  Model m(backend, spec, 12, 5);
  for (auto& l : m.layers()) l->set_precision(precision);
  m.allocate(kRows);
  m.init_parameters(7);
  std::vector<float> x(kRows * 12);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.29f * static_cast<float>(i)) * 2.0f;
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  backend->copy_from_host(m.input(kRows), x.data());
  backend->copy_from_host(m.labels(kRows), y.data());
  Observed o;
  m.forward(kRows);
  o.values.push_back(m.loss(kRows, 4.0f, true).loss);
  backend->counting = true;
  m.backward(kRows);
  o.calls = backend->calls;
  for (auto* p : m.parameters()) {
    const auto g = test_support::read(p->grad.view());
    o.values.insert(o.values.end(), g.begin(), g.end());
  }
  return o;
}

TEST(GradientEpilogues, ALaterContributionIsAddedIntoTheFp32SumByItsOwnOp) {
  const Observed fused = observe(two_readers(true));
  const Observed unfused = observe(two_readers(false));
  ASSERT_EQ(fused.values.size(), unfused.values.size());
  EXPECT_EQ(fused.values, unfused.values);
  // The layer norm adds into fc's gradient, l1's dgrad into sum's (beta = 1): no axpy is left.
  auto count = [](const Observed& o, const char* op) {
    const auto it = o.calls.find(op);
    return it == o.calls.end() ? 0 : it->second;
  };
  EXPECT_EQ(count(fused, "layernorm_backward_accumulate"), 1);
  EXPECT_EQ(count(fused, "layernorm_backward"), 0);
  EXPECT_EQ(count(fused, "axpy"), 0);
  EXPECT_EQ(count(unfused, "layernorm_backward_accumulate"), 0);
  EXPECT_EQ(count(unfused, "axpy"), 2);
}

TEST(GradientEpilogues, Bf16ContributionsAddedInFp32TrackTheRoundedOnes) {
  const sdk::OpPrecision bf16 = test_support::uniform_precision(DType::bf16);
  const Observed fused = observe(two_readers(true), bf16);
  const Observed unfused = observe(two_readers(false), bf16);
  ASSERT_EQ(fused.values.size(), unfused.values.size());
  // l1's contribution reaches the sum unrounded instead of through a bf16 scratch.
  double num = 0, den = 0;
  for (std::size_t i = 0; i < fused.values.size(); ++i) {
    const double d = static_cast<double>(fused.values[i]) - unfused.values[i];
    num += d * d;
    den += static_cast<double>(unfused.values[i]) * unfused.values[i];
  }
  // The forward differs only in join, a sum of linears (add.h), whose bf16 sum is rounded once
  // less when fused.
  EXPECT_NEAR(fused.values[0], unfused.values[0], 1e-3 * std::abs(unfused.values[0]));
  EXPECT_LT(std::sqrt(num / den), 1e-2);
  // l2's, the first, is written by its own GEMM in FP32 too: no bf16 copy apart, no cast.
  auto count = [](const Observed& o, const char* op) {
    const auto it = o.calls.find(op);
    return it == o.calls.end() ? 0 : it->second;
  };
  EXPECT_EQ(count(unfused, "cast") - count(fused, "cast"), 1)
      << "fused " << count(fused, "cast") << ", unfused " << count(unfused, "cast");
}

}  // namespace
}  // namespace mixtrain::core
