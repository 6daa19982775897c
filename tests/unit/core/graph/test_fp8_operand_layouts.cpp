// FP8 operands in both layouts (operand_scaler.h, gemm facet 1.6's cast_transpose): a linear's
// casts write the transpose its backward GEMMs read from the same pass, keep xᵀ (not x) for the
// wgrad, keep W and Wᵀ once per step across micro-batches, and stage dy's layouts instead of
// keeping them. Against the same model on a backend whose gemm facet refuses cast_transpose (the
// casts alone, each GEMM transposing what it needs): the same losses and gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "graph/ops/operand_scaler.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/precision/planning.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "plugin_test_support.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using sdk::OperandRole;
using sdk::TensorView;
using test_support::op;

// Every GEMM in FP8: inputs and weights e4m3, gradients e5m2, with scales that are not 1 (the
// delayed-scaling arithmetic without its history: each cast's scale is fixed per role).
class Fp8Policy final : public sdk::PrecisionPolicy {
 public:
  sdk::OpPrecision plan(const sdk::OpDescription& op) const override {
    return {DType::fp32, op.has_gemm() ? DType::fp8_e4m3 : DType::fp32, DType::fp32, DType::fp32};
  }
  bool needs_loss_scaling() const override { return false; }
  bool uses_scaled_operands() const override { return true; }
  bool wants_current_amax() const override { return current; }
  bool current = false;  // current scaling: the host measures each amax before its cast
  sdk::OperandScaling operand_scaling(const sdk::OperandSlot& slot) override {
    ++asks[slot.name()];
    switch (slot.role()) {
      case OperandRole::input:
        return {DType::fp8_e4m3, 64.0f * boost, 1.0f / (64.0f * boost)};
      case OperandRole::weight:
        return {DType::fp8_e4m3, 128.0f * boost, 1.0f / (128.0f * boost)};
      default:
        return {DType::fp8_e5m2, 4096.0f * boost, 1.0f / (4096.0f * boost)};
    }
  }
  float boost = 1.0f;  // every scale times this (a power of two): saturating or flushing casts
  void record_amax(const sdk::OperandSlot& slot, float amax) override {
    amaxes[slot.name()] = amax;
  }
  std::map<std::string, int> asks;
  std::map<std::string, float> amaxes;
};

// The CPU backend's gemm facet offering its cast_transpose, which the CPU implements but does not
// offer (a GPU's FP8 GEMM wants the layouts, the CPU's reads either), counting its calls; or
// refusing it (a gemm 1.5 backend, a device whose FP8 GEMM does not want it). With
// `offer_gradient`, its cast_transpose_gradient (1.7) too, which the CPU implements as the
// unfused ops in turn.
class CastTransposeGemm final : public sdk::GemmFacet {
 public:
  CastTransposeGemm(sdk::GemmFacet& in, bool offer, bool offer_gradient = false)
      : in_(in), offer_(offer), offer_gradient_(offer_gradient) {}
  bool supports(sdk::GemmOp op, std::span<const DType> d) const override {
    const bool fp8_cast = d.size() == 2 && !sdk::is_fp8(d[0]) && sdk::is_fp8(d[1]);
    if (op == sdk::GemmOp::cast_transpose) return offer_ && fp8_cast;
    if (op == sdk::GemmOp::cast_transpose_gradient) return offer_gradient_ && fp8_cast;
    return in_.supports(op, d);
  }
  void gemm(const sdk::GemmArgs& a) override {
    // The layouts the GEMMs read FP8 operands in: A without a transpose, B with one, is the
    // layout that keeps the reduction dim contiguous.
    if (sdk::is_fp8(a.a.view.dtype) && !a.a.transpose && a.b.transpose) ++contiguous_gemms;
    in_.gemm(a);
  }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& a) override { in_.gemm_strided_batched(a); }
  void gemm_gradient(const sdk::GemmGradientArgs& a) override { in_.gemm_gradient(a); }
  void cast_transpose(const sdk::CastTransposeArgs& a) override {
    ++cast_transpose_calls;
    in_.cast_transpose(a);
  }
  void cast_transpose_gradient(const sdk::CastTransposeGradientArgs& a) override {
    ++gradient_casts;
    if (a.has_activation_grad) ++gelu_casts;
    if (!a.column_sums.empty()) ++summing_casts;
    in_.cast_transpose_gradient(a);
  }
  int cast_transpose_calls = 0, contiguous_gemms = 0;
  int gradient_casts = 0, gelu_casts = 0, summing_casts = 0;

 private:
  sdk::GemmFacet& in_;
  bool offer_, offer_gradient_;
};

class LayoutBackend final : public test_support::ForwardingBackend {
 public:
  explicit LayoutBackend(bool offer, bool offer_gradient = false)
      : gemm(*sdk::facet<sdk::GemmFacet>(*in_), offer, offer_gradient) {}
  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::GemmFacet::kName) return &gemm;
    if (name == sdk::GradientCheckFacet::kName && hide_tally) return nullptr;
    return in_->find_facet(name);
  }
  bool hide_tally = false;  // no gradient_check facet: the casts' statistics counted on the host
  void fill(TensorView x, float value) override {
    if (x.dtype == DType::fp32 && value == 0.0f) ++zero_fills[x.numel()];
    ForwardingBackend::fill(x, value);
  }
  void* allocate(std::size_t bytes) override {
    if (bytes == refuse_bytes) throw sdk::BackendError("out of memory (test)", "free some");
    return ForwardingBackend::allocate(bytes);
  }
  CastTransposeGemm gemm;
  std::size_t refuse_bytes = 0;  // an allocation of exactly these bytes fails
  std::map<std::int64_t, int> zero_fills;  // fp32 fills with 0, by numel
};

constexpr std::int64_t kRows = 12;  // not a multiple of the kernels' tiles

// fc (+gelu) -> proj -> head, every linear in FP8 (head by an override).
std::unique_ptr<Model> model(const std::shared_ptr<LayoutBackend>& backend, Fp8Policy& policy) {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {op("linear", "fc", {{"out", 24}}, {"input"}), op("gelu", "gelu", {}, {"fc"}),
                 op("linear", "proj", {{"out", 20}}, {"gelu"}),
                 op("linear", "head", {{"out", 5}}, {"proj"})};
  auto m = std::make_unique<Model>(backend, spec, 12, 5);
  // head is the logits node, which per-tensor FP8 keeps in 16 bits unless an override names it.
  PrecisionOverride fp8_head;
  fp8_head.pattern = "head";
  fp8_head.gemm_input = DType::fp8_e4m3;
  plan_precision(*m, policy, backend->capabilities(), {fp8_head});
  m->allocate(kRows);
  m->init_parameters(3);
  return m;
}

struct Run {
  std::vector<float> values;  // each micro-batch's loss, then every gradient
  std::shared_ptr<LayoutBackend> backend;
  std::unique_ptr<Model> model;
  Fp8Policy policy;
};

// One optimizer step of two micro-batches (the second accumulates). `prepare` runs on the model
// before the step.
std::unique_ptr<Run> step(bool offer, bool offer_gradient = false,
                          const std::function<void(Model&)>& prepare = {}, bool current = false) {
  auto r = std::make_unique<Run>();
  r->policy.current = current;
  r->backend = std::make_shared<LayoutBackend>(offer, offer_gradient);
  r->model = model(r->backend, r->policy);
  Model& m = *r->model;
  if (prepare) prepare(m);
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<float> x(kRows * 12);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = std::sin(0.41f * static_cast<float>(i) + static_cast<float>(micro)) * 3.0f;
    std::vector<std::int32_t> y(kRows);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((i * 3) % 5);
    r->backend->copy_from_host(m.input(kRows), x.data());
    r->backend->copy_from_host(m.labels(kRows), y.data());
    m.begin_micro_batch(micro, 2);
    m.forward(kRows);
    r->values.push_back(m.loss(kRows, 1.0f, true).loss);
    m.backward(kRows);
  }
  for (auto* p : m.parameters()) {
    const auto g = test_support::read(p->grad.view());
    r->values.insert(r->values.end(), g.begin(), g.end());
  }
  m.flush_operand_amaxes();
  return r;
}

// An FP8 view's values, decoded by the backend.
std::vector<float> decoded(const TensorView& v) {
  std::vector<float> values(static_cast<std::size_t>(v.numel()));
  Tensor scratch;
  copy_to_host_fp32(test_support::cpu(), v, values.data(), scratch);
  return values;
}

OperandScaler& scaler(Model& m, const std::string& name) {
  for (auto& l : m.layers())
    if (l->name() == name) return *l->operand_scaler();
  throw std::runtime_error("no layer " + name);
}

TEST(Fp8OperandLayouts, OneCastWritesBothLayoutsAndTheStepIsTheCastsAlones) {
  const auto both = step(true);
  const auto alone = step(false);
  ASSERT_EQ(both->values.size(), alone->values.size());
  // The same codes reach the GEMMs either way; only the layout a GEMM reads them in differs, so
  // the sums may round in another order: within a few fp32 ulps of the largest value.
  float largest = 0.0f;
  for (float v : alone->values) largest = std::max(largest, std::abs(v));
  for (std::size_t i = 0; i < both->values.size(); ++i)
    EXPECT_NEAR(both->values[i], alone->values[i], 1e-5f * largest) << i;
  // Per linear: x twice (a cast per micro-batch), W once (kept across the micro-batches), dy
  // twice; the same amaxes go back to the policy.
  EXPECT_EQ(both->backend->gemm.cast_transpose_calls, 3 * (2 + 1 + 2));
  EXPECT_EQ(alone->backend->gemm.cast_transpose_calls, 0);
  EXPECT_EQ(both->policy.amaxes, alone->policy.amaxes);
  EXPECT_EQ(both->policy.asks["proj.matmul.weight"], 1);
  // The step's amaxes start from one fill of the whole table (3 slots of 3 linears), not a fill
  // per cast (the table's first fill is at allocation).
  EXPECT_EQ(both->backend->zero_fills[9], 2);
  EXPECT_EQ(both->backend->zero_fills[1], 0);
  // Every FP8 GEMM reads its operands with the reduction dim contiguous: 3 per linear per
  // micro-batch (forward, dgrad, wgrad), but fc has no dgrad (its input is the data).
  EXPECT_EQ(both->backend->gemm.contiguous_gemms, 2 * (3 * 3 - 1));
  EXPECT_LT(alone->backend->gemm.contiguous_gemms, both->backend->gemm.contiguous_gemms);
}

TEST(Fp8OperandLayouts, XTransposedIsKeptForTheWgradAndDyIsOnlyStaged) {
  const auto both = step(true);
  const auto alone = step(false);
  for (const char* name : {"fc", "proj", "head"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const sdk::Shape x_shape{kRows, n == "fc" ? 12 : (n == "proj" ? 24 : 20)};
    OperandScaler& b = scaler(*both->model, name);
    const ScaledLayouts bx = b.kept(OperandRole::input, x_shape);
    EXPECT_EQ(bx.stored.data, nullptr) << "x was only staged";
    ASSERT_NE(bx.transposed.data, nullptr);
    EXPECT_EQ(bx.transposed.shape.rows(), x_shape.cols());
    const ScaledLayouts bw = b.kept(OperandRole::weight, sdk::Shape{1, 1});
    EXPECT_NE(bw.stored.data, nullptr);
    EXPECT_NE(bw.transposed.data, nullptr);
    const ScaledLayouts bdy = b.kept(OperandRole::grad_output, sdk::Shape{kRows, 1});
    EXPECT_EQ(bdy.stored.data, nullptr);
    EXPECT_EQ(bdy.transposed.data, nullptr);

    OperandScaler& a = scaler(*alone->model, name);
    const ScaledLayouts ax = a.kept(OperandRole::input, x_shape);
    EXPECT_NE(ax.stored.data, nullptr) << "without the transpose, x itself is kept";
    EXPECT_EQ(ax.transposed.data, nullptr);
    EXPECT_EQ(a.kept(OperandRole::weight, sdk::Shape{1, 1}).transposed.data, nullptr);
    EXPECT_EQ(a.kept(OperandRole::grad_output, sdk::Shape{kRows, 1}).stored.data, nullptr);
  }
  // xᵀ holds x's codes: decoded, its rows are x's columns, the same values the other model kept
  // for its wgrad.
  const sdk::Shape x_shape{kRows, 24};
  const auto xt =
      decoded(scaler(*both->model, "proj").kept(OperandRole::input, x_shape).transposed);
  const auto x = decoded(scaler(*alone->model, "proj").kept(OperandRole::input, x_shape).stored);
  ASSERT_EQ(xt.size(), x.size());
  for (std::int64_t r = 0; r < kRows; ++r)
    for (std::int64_t c = 0; c < 24; ++c)
      EXPECT_EQ(xt[static_cast<std::size_t>(c * kRows + r)],
                x[static_cast<std::size_t>(r * 24 + c)])
          << r << ", " << c;
}

TEST(Fp8OperandLayouts, AnEvaluationForwardKeepsNoLayoutOfX) {
  const auto both = step(true);
  Model& m = *both->model;
  m.set_mode(Model::Mode::eval);
  const int before = both->backend->gemm.cast_transpose_calls;
  m.forward(kRows);
  EXPECT_EQ(both->backend->gemm.cast_transpose_calls, before) << "no transpose without a backward";
  const ScaledLayouts x = scaler(m, "proj").kept(OperandRole::input, sdk::Shape{kRows, 24});
  EXPECT_EQ(x.stored.data, nullptr);
  EXPECT_EQ(x.transposed.data, nullptr);
}

// gemm 1.7: each linear's dy cast sums its bias gradient, and fc's computes the gradient of the
// gelu it runs as its epilogue, whose backward leaves dy as it is. The CPU's reference is the
// unfused ops in turn, so the step is the unfused one bit for bit: losses, every gradient (the
// bias sums included) and the amaxes the policy gets (dz's, not dy's).
TEST(Fp8OperandLayouts, TheGradientCastFoldsTheBiasGradientAndTheGeluGradient) {
  const auto folded = step(true, true);
  const auto apart = step(true, false);
  ASSERT_EQ(folded->values.size(), apart->values.size());
  for (std::size_t i = 0; i < folded->values.size(); ++i)
    EXPECT_EQ(folded->values[i], apart->values[i]) << i;
  EXPECT_EQ(folded->policy.amaxes, apart->policy.amaxes);
  // Per micro-batch: fc's dy with gelu and its bias, proj's and head's with their biases.
  EXPECT_EQ(folded->backend->gemm.gradient_casts, 2 * 3);
  EXPECT_EQ(folded->backend->gemm.gelu_casts, 2);
  EXPECT_EQ(folded->backend->gemm.summing_casts, 2 * 3);
  // x and W stay plain casts: 3 linears, x per micro-batch, W once.
  EXPECT_EQ(folded->backend->gemm.cast_transpose_calls, 3 * (2 + 1));
  EXPECT_EQ(apart->backend->gemm.gradient_casts, 0);
  // fc reads z in its backward, after the gelu's: the plan keeps it alive until then.
  for (auto& l : folded->model->layers())
    EXPECT_EQ(l->backward_reads_output(), l->name() == "fc") << l->name();
  for (auto& l : apart->model->layers())
    EXPECT_FALSE(l->name() == "fc" && l->backward_reads_output());
}

// Fusion off (the non-finite replay, model.fuse_epilogues = false), statistics (a diagnostic
// that reads what each cast saturated from its source) and current scaling (which measures the
// amax of the very tensor it casts, and dz does not exist apart) all cast dy alone.
TEST(Fp8OperandLayouts, TheGradientCastFoldsNothingUnfusedOrWhileCollectingStatistics) {
  const auto unfused = step(true, true, [](Model& m) { m.set_epilogue_fusion(false); });
  EXPECT_EQ(unfused->backend->gemm.gradient_casts, 0);
  const auto apart = step(true, false, [](Model& m) { m.set_epilogue_fusion(false); });
  for (std::size_t i = 0; i < unfused->values.size(); ++i)
    EXPECT_EQ(unfused->values[i], apart->values[i]) << i;
  const auto stats = step(true, true, [](Model& m) {
    for (auto& l : m.layers()) l->collect_operand_stats(true);
  });
  EXPECT_EQ(stats->backend->gemm.gradient_casts, 0);
  const auto current = step(true, true, {}, true);
  EXPECT_EQ(current->backend->gemm.gradient_casts, 0);
  EXPECT_GT(current->backend->gemm.cast_transpose_calls, 0);
  for (auto& l : current->model->layers()) EXPECT_FALSE(l->backward_reads_output()) << l->name();
}

// A statistics step counts each cast's saturated and flushed values with the backend's tally
// (gradient_check 1.2) over the scaled source, or on the host from the codes the cast wrote: the
// same counts, at scales where casts saturate and where they flush.
TEST(Fp8OperandLayouts, TheBackendsTallyOfACastIsTheHostsCountOfItsCodes) {
  for (const float boost : {8.0f, 1.0f / 65536.0f}) {
    std::vector<Layer::ScaledOperandStats> counted[2];
    for (const bool hide : {false, true}) {
      Fp8Policy policy;
      policy.boost = boost;
      auto backend = std::make_shared<LayoutBackend>(true);
      backend->hide_tally = hide;
      auto m = model(backend, policy);
      for (auto& l : m->layers()) l->collect_operand_stats(true);
      std::vector<float> x(kRows * 12);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.41f * static_cast<float>(i)) * 3;
      const std::vector<std::int32_t> y(kRows, 2);
      backend->copy_from_host(m->input(kRows), x.data());
      backend->copy_from_host(m->labels(kRows), y.data());
      m->forward(kRows);
      m->compute_loss(kRows, 1.0f, true);
      m->backward(kRows);
      for (auto& l : m->layers())
        for (const auto& st : l->operand_stats()) counted[hide ? 1 : 0].push_back(st);
    }
    ASSERT_EQ(counted[0].size(), counted[1].size());
    ASSERT_FALSE(counted[0].empty());
    std::int64_t saturated = 0, underflowed = 0;
    for (std::size_t i = 0; i < counted[0].size(); ++i) {
      const auto &device = counted[0][i], &host = counted[1][i];
      EXPECT_EQ(device.slot, host.slot);
      EXPECT_EQ(device.count, host.count) << device.slot;
      EXPECT_EQ(device.nonzero, host.nonzero) << device.slot;
      EXPECT_EQ(device.saturated, host.saturated) << device.slot;
      EXPECT_EQ(device.underflowed, host.underflowed) << device.slot;
      saturated += device.saturated;
      underflowed += device.underflowed;
    }
    if (boost > 1.0f) {
      EXPECT_GT(saturated, 0);
    } else {
      EXPECT_GT(underflowed, 0);
    }
  }
}

// The staging is one buffer grown to the largest transient request: by fc's backward, its dy and
// dyᵀ, 288 bytes each, the second 256-byte aligned. Out of memory there, the error names it and
// the ways to need less.
TEST(Fp8OperandLayouts, OutOfMemoryForTheStagingNamesItAndTheFix) {
  auto backend = std::make_shared<LayoutBackend>(true);
  backend->refuse_bytes = 512 + 288;
  Fp8Policy policy;
  auto m = model(backend, policy);
  const std::vector<float> x(kRows * 12, 0.5f);
  const std::vector<std::int32_t> y(kRows, 1);
  backend->copy_from_host(m->input(kRows), x.data());
  backend->copy_from_host(m->labels(kRows), y.data());
  m->forward(kRows);
  m->compute_loss(kRows, 1.0f, true);
  try {
    m->backward(kRows);
    FAIL() << "no BackendError";
  } catch (const sdk::BackendError& e) {
    const std::string msg = e.full_message();
    EXPECT_NE(msg.find("the FP8 operand staging (800 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("out of memory (test)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lower data.batch_size"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace mixtrain::core
