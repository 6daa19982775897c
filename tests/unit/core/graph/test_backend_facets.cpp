// Backend facets at plan time: a backend that omits a facet, or answers supports() = false for a
// dtype, stops Model::allocate before anything runs, with a ConfigError naming the node, the op,
// the dtypes and the backend at the node's config line. A backend with every facet plans and runs.
#include <gtest/gtest.h>

#include <initializer_list>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/graph/tensor.h"
#include "mixtrain/core/profiling/profiling_backend.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using sdk::TensorView;

// The CPU backend's core and facets, minus the layer-norm facet, and with bf16 refused by the
// GEMM facet's supports() when `refuse_bf16_gemm`.
class PartialBackend final : public test_support::ForwardingBackend, public sdk::GemmFacet {
 public:
  explicit PartialBackend(bool refuse_bf16_gemm) : refuse_bf16_(refuse_bf16_gemm) {}

  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::GemmFacet::kName) return static_cast<sdk::GemmFacet*>(this);
    if (name == sdk::LayerNormFacet::kName) return nullptr;
    return in_->find_facet(name);
  }

  bool supports(sdk::GemmOp op, std::span<const DType> dtypes) const override {
    for (DType t : dtypes)
      if (refuse_bf16_ && t == DType::bf16) return false;
    return sdk::facet<sdk::GemmFacet>(*in_)->supports(op, dtypes);
  }
  void gemm(const sdk::GemmArgs& a) override { sdk::facet<sdk::GemmFacet>(*in_)->gemm(a); }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& a) override {
    sdk::facet<sdk::GemmFacet>(*in_)->gemm_strided_batched(a);
  }
  void gemm_gradient(const sdk::GemmGradientArgs& a) override {
    sdk::facet<sdk::GemmFacet>(*in_)->gemm_gradient(a);
  }

 private:
  bool refuse_bf16_;
};

// A facet that answers to the GEMM facet's name at another major: what a backend built against an
// older (0.x) or a newer (2.0) SDK would return. The host must refuse it by its version before
// casting it: its methods are not GemmFacet's.
class OtherMajorGemm final : public sdk::Facet {
 public:
  explicit OtherMajorGemm(sdk::FacetVersion v) : v_(v) {}
  std::string_view name() const override { return sdk::GemmFacet::kName; }
  sdk::FacetVersion version() const override { return v_; }

 private:
  sdk::FacetVersion v_;
};

class OtherMajorGemmBackend final : public test_support::ForwardingBackend {
 public:
  explicit OtherMajorGemmBackend(sdk::FacetVersion v = {0, 3}) : gemm_(v) {}
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::GemmFacet::kName ? &gemm_ : in_->find_facet(name);
  }

 private:
  OtherMajorGemm gemm_;
};

LayerSpec node(const char* type, const char* name, std::vector<std::string> inputs,
               std::int64_t out, std::uint32_t line) {
  LayerSpec l;
  l.type = type;
  l.name = name;
  l.inputs = std::move(inputs);
  l.where = {"facets.toml", line, 3};
  if (out > 0) l.options.push_back({"out", out, l.where});
  return l;
}

ModelSpec spec_with_layernorm() {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {node("linear", "fc1", {"input"}, 8, 4), node("layernorm", "norm1", {"fc1"}, 0, 7),
                 node("linear", "head", {"norm1"}, 3, 10)};
  return spec;
}

std::string plan_error(const std::shared_ptr<sdk::DeviceBackend>& backend, const ModelSpec& spec,
                       const sdk::OpPrecision* precision = nullptr) {
  Model m(backend, spec, 5, 3);
  if (precision != nullptr)
    for (auto& l : m.layers()) l->set_precision(*precision);
  try {
    m.allocate(4);
  } catch (const sdk::ConfigError& e) {
    return e.where().to_string() + " " + e.key() + ": " + e.full_message();
  }
  return "(no error)";
}

TEST(BackendFacets, AnOmittedFacetStopsThePlanAtTheNodeThatNeedsIt) {
  const std::string msg =
      plan_error(std::make_shared<PartialBackend>(false), spec_with_layernorm());
  EXPECT_NE(msg.find("facets.toml:7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.nodes[1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'norm1' (layernorm)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_norm.layernorm_forward on fp32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("backend 'cpu'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("it has no layer_norm facet (this host needs 1.0 or a later 1.x)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("HINT:"), std::string::npos) << msg;
}

TEST(BackendFacets, ADtypeTheFacetRefusesStopsThePlanNamingTheDtypes) {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {node("linear", "fc1", {"input"}, 8, 4), node("relu", "act", {"fc1"}, 0, 5),
                 node("linear", "head", {"act"}, 3, 6)};
  sdk::OpPrecision bf16;
  bf16.weight = bf16.gemm_input = bf16.activation = bf16.activation_grad = DType::bf16;
  const std::string msg = plan_error(std::make_shared<PartialBackend>(true), spec, &bf16);
  EXPECT_NE(msg.find("facets.toml:4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'fc1' (linear) needs gemm.gemm on bf16, bf16, bf16"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("backend 'cpu'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not support gemm on bf16"), std::string::npos) << msg;
  // The same model in fp32 plans on the same backend: only the refused dtype is missing.
  EXPECT_EQ(plan_error(std::make_shared<PartialBackend>(true), spec), "(no error)");
}

TEST(BackendFacets, EveryFacetPresentPlansAndRuns) {
  Model m(test_support::cpu(), spec_with_layernorm(), 5, 3);
  EXPECT_NO_THROW(m.allocate(4));
  EXPECT_NO_THROW(m.check_backend());
}

TEST(BackendFacets, TheCpuBackendAnswersItsOpsAndRefusesOthers) {
  auto b = test_support::cpu();
  const DType f32[] = {DType::fp32, DType::fp32, DType::fp32};
  const DType i32[] = {DType::int32};
  auto* foreach = sdk::facet<sdk::ForeachFacet>(*b);
  ASSERT_NE(foreach, nullptr);
  EXPECT_TRUE(foreach->supports(sdk::ForeachOp::foreach_addcmul, f32));
  EXPECT_FALSE(foreach->supports(sdk::ForeachOp::foreach_sqrt, i32));
  // More dtypes than the op has tensors: a question about another op.
  EXPECT_FALSE(foreach->supports(sdk::ForeachOp::foreach_sign, f32));
  EXPECT_EQ(sdk::facet<sdk::GemmFacet>(*b)->version(), sdk::GemmFacet::kVersion);
  EXPECT_EQ(unmet(*b, {sdk::LossOp::softmax_cross_entropy, {DType::bf16}}), std::nullopt);
}

TEST(BackendFacets, FacetsAreFoundByNameAndAtLeastAVersion) {
  auto b = test_support::cpu();
  for (std::string_view name :
       {"gemm", "activation", "residual", "gradient_check", "foreach", "layer_norm", "batch_norm",
        "loss", "optimizer", "attention", "embedding", "convolution", "dropout"}) {
    sdk::Facet* f = b->find_facet(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(f->name(), name);
  }
  EXPECT_EQ(b->find_facet("elementwise"), nullptr);  // split in SDK ABI 8
  EXPECT_EQ(b->find_facet("no_such_facet"), nullptr);
  // The typed lookup casts back to the facet's own class: its ops are the backend's.
  EXPECT_EQ(static_cast<sdk::Facet*>(sdk::facet<sdk::LayerNormFacet>(*b)),
            b->find_facet("layer_norm"));
  EXPECT_NE(sdk::facet<sdk::BatchNormFacet>(*b, 1), nullptr);
  EXPECT_EQ(sdk::facet<sdk::BatchNormFacet>(*b, sdk::BatchNormFacet::kVersion.minor + 1), nullptr);
}

// A facet of another major, older or newer, is refused by name, naming both versions and the fix,
// before anything is cast; the binding leaves it out, so a call through it is a host bug.
TEST(BackendFacets, AFacetOfAnotherMajorIsRefusedNamingBothVersions) {
  const std::vector<DType> f32{DType::fp32, DType::fp32, DType::fp32};
  for (auto [v, which] : {std::pair{sdk::FacetVersion{0, 3}, "an older"},
                          std::pair{sdk::FacetVersion{2, 0}, "a newer"}}) {
    OtherMajorGemmBackend b(v);
    EXPECT_EQ(sdk::facet<sdk::GemmFacet>(b), nullptr);
    EXPECT_EQ(sdk::facet<sdk::GemmFacet>(b, 0), nullptr);
    EXPECT_NE(b.find_facet(sdk::GemmFacet::kName), nullptr);  // there, at another major
    const auto why = unmet(b, {sdk::GemmOp::gemm, f32});
    ASSERT_TRUE(why.has_value());
    EXPECT_NE(why->find("its gemm facet is version " + sdk::to_string(v) + ", built against " +
                        which + " SDK"),
              std::string::npos)
        << *why;
    EXPECT_NE(why->find("this host speaks gemm 1."), std::string::npos) << *why;
    EXPECT_NE(why->find("rebuild the backend plugin"), std::string::npos) << *why;
    const BoundFacets bound(b);
    EXPECT_EQ(bound.find<sdk::GemmFacet>(), nullptr);
    EXPECT_THROW((void)bound.call(sdk::GemmOp::gemm), std::logic_error);
    EXPECT_NE(bound.find<sdk::ActivationFacet>(), nullptr);  // the others stay bound
  }
}

// The profiler offers exactly the inner backend's facets (step_graph aside) and times every call
// BoundFacets makes through them, under the op's name: no facet needs profiling code.
TEST(BackendFacets, TheProfilerTimesEveryFacetCallMadeThroughTheBinding) {
  auto partial = make_profiling_backend(std::make_shared<PartialBackend>(false));
  EXPECT_EQ(partial->find_facet("layer_norm"), nullptr);
  EXPECT_EQ(partial->find_facet("no_such_facet"), nullptr);
  auto cpu = test_support::cpu();
  auto full = make_profiling_backend(cpu);
  for (std::string_view name :
       {"gemm", "activation", "residual", "gradient_check", "foreach", "layer_norm", "batch_norm",
        "loss", "optimizer", "attention", "embedding", "convolution", "dropout"})
    EXPECT_EQ(full->find_facet(name), cpu->find_facet(name)) << name << " passes through";
  EXPECT_EQ(full->find_facet("step_graph"), nullptr);  // a graph would hide the ops it times
  // Over a facet of another major the inner answer passes, so the plan names its version.
  auto old = make_profiling_backend(std::make_shared<OtherMajorGemmBackend>());
  const auto why = unmet(*old, {sdk::GemmOp::gemm, {DType::fp32}});
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("version 0.3"), std::string::npos) << *why;

  std::vector<float> h = {1, -2, 3, -4};
  Tensor x(full, DType::fp32, sdk::Shape{4});
  full->copy_from_host(x.view(), h.data());
  const BoundFacets bound(*full);
  bound.call(sdk::ActivationOp::activation_forward)
      ->activation_forward(sdk::Activation::relu, x.view(), x.view());
  const TensorView xs[] = {x.view()};
  bound.get<sdk::ForeachFacet>("named_by_the_caller")->foreach_mul_scalar(xs, 2.0f);
  int timed = 0;
  for (const auto& e : full->entries())
    timed += (e.op == "activation_forward" || e.op == "named_by_the_caller") && e.calls == 1;
  EXPECT_EQ(timed, 2);
  // Unprofiled, the same binding times nothing and costs no wait.
  const BoundFacets plain(*cpu);
  plain.call(sdk::ActivationOp::activation_forward)
      ->activation_forward(sdk::Activation::relu, x.view(), x.view());
  std::vector<float> out(4);
  full->copy_to_host(out.data(), x.view());
  EXPECT_EQ(out, (std::vector<float>{2, 0, 6, 0}));
}

// supports() now answers from the SDK's signature table; every answer must be the one the CPU
// backend gave when it wrote its own rules (copied here from the CPU backend before the SDK took
// the table), for every op and every dtype list of up to four entries.
namespace old_cpu {

bool storage(DType t) {
  return t == DType::fp32 || t == DType::tf32 || t == DType::bf16 || t == DType::fp16;
}
bool fp32(DType t) {
  return t == DType::fp32 || t == DType::tf32;
}
bool gemm_operand(DType t) {
  return storage(t) || sdk::is_fp8(t);
}
bool matches(std::span<const DType> dtypes, std::initializer_list<bool (*)(DType)> rules) {
  if (dtypes.size() > rules.size()) return false;
  auto rule = rules.begin();
  for (DType t : dtypes)
    if (!(*rule++)(t)) return false;
  return true;
}

}  // namespace old_cpu

template <class Visit>
void every_dtype_list(Visit visit) {
  std::vector<DType> d;
  auto rec = [&](auto& self, std::size_t depth) -> void {
    visit(std::span<const DType>(d));
    if (depth == 4) return;
    for (DType t : sdk::kAllDTypes) {
      d.push_back(t);
      self(self, depth + 1);
      d.pop_back();
    }
  };
  rec(rec, 0);
}

TEST(BackendFacets, TheSignatureTableAnswersAsTheCpuBackendDidBeforeIt) {
  using namespace old_cpu;
  auto b = test_support::cpu();
  auto* gemm = sdk::facet<sdk::GemmFacet>(*b);
  auto* act = sdk::facet<sdk::ActivationFacet>(*b);
  auto* res = sdk::facet<sdk::ResidualFacet>(*b);
  auto* gc = sdk::facet<sdk::GradientCheckFacet>(*b);
  auto* fe = sdk::facet<sdk::ForeachFacet>(*b);
  auto* ln = sdk::facet<sdk::LayerNormFacet>(*b);
  auto* bn = sdk::facet<sdk::BatchNormFacet>(*b);
  auto* loss = sdk::facet<sdk::LossFacet>(*b);
  auto* opt = sdk::facet<sdk::OptimizerFacet>(*b);
  auto* attn = sdk::facet<sdk::AttentionFacet>(*b);
  auto* emb = sdk::facet<sdk::EmbeddingFacet>(*b);
  auto* conv = sdk::facet<sdk::ConvolutionFacet>(*b);
  int lists = 0;
  every_dtype_list([&](std::span<const DType> d) {
    ++lists;
    const std::string at = need_dtypes({sdk::GemmOp::gemm, {d.begin(), d.end()}});
    for (auto op : {sdk::GemmOp::gemm, sdk::GemmOp::gemm_strided_batched})
      EXPECT_EQ(gemm->supports(op, d), matches(d, {gemm_operand, gemm_operand, storage})) << at;
    using A = sdk::ActivationOp;
    EXPECT_EQ(act->supports(A::bias_grad, d), matches(d, {storage, fp32})) << at;
    EXPECT_EQ(act->supports(A::activation_forward, d), matches(d, {storage, storage})) << at;
    EXPECT_EQ(act->supports(A::activation_backward, d), matches(d, {storage, storage, storage}))
        << at;
    EXPECT_EQ(act->supports(A::axpy, d), matches(d, {storage, fp32})) << at;
    EXPECT_EQ(res->supports(sdk::ResidualOp::add, d), matches(d, {storage, storage})) << at;
    using G = sdk::GradientCheckOp;
    EXPECT_EQ(gc->supports(G::unscale_and_check_finite, d), matches(d, {fp32})) << at;
    EXPECT_EQ(gc->supports(G::unscale_check_and_sum_squares, d), matches(d, {fp32})) << at;
    EXPECT_EQ(gc->supports(G::first_nonfinite, d), matches(d, {storage})) << at;
    using F = sdk::ForeachOp;
    for (auto op : {F::foreach_mul_scalar, F::foreach_add_scalar, F::foreach_sqrt, F::foreach_sign,
                    F::foreach_clamp})
      EXPECT_EQ(fe->supports(op, d), matches(d, {fp32})) << at;
    for (auto op : {F::foreach_mul, F::foreach_add, F::foreach_lerp})
      EXPECT_EQ(fe->supports(op, d), matches(d, {fp32, fp32})) << at;
    EXPECT_EQ(fe->supports(F::foreach_addcmul, d), matches(d, {fp32, fp32, fp32})) << at;
    for (auto op : {sdk::LayerNormOp::layernorm_forward, sdk::LayerNormOp::layernorm_backward})
      EXPECT_EQ(ln->supports(op, d), matches(d, {storage})) << at;
    for (auto op :
         {sdk::BatchNormOp::batchnorm_forward_training,
          sdk::BatchNormOp::batchnorm_forward_inference, sdk::BatchNormOp::batchnorm_backward,
          sdk::BatchNormOp::batchnorm_statistics, sdk::BatchNormOp::batchnorm_backward_reduce,
          sdk::BatchNormOp::batchnorm_backward_elementwise})
      EXPECT_EQ(bn->supports(op, d), matches(d, {storage})) << at;
    EXPECT_EQ(loss->supports(sdk::LossOp::softmax_cross_entropy, d), matches(d, {storage})) << at;
    for (auto op : {sdk::OptimizerOp::sgd_update, sdk::OptimizerOp::adamw_update})
      EXPECT_EQ(opt->supports(op, d), matches(d, {fp32, storage})) << at;
    for (auto op : {sdk::AttentionOp::split_heads, sdk::AttentionOp::merge_heads})
      EXPECT_EQ(attn->supports(op, d), matches(d, {storage, storage})) << at;
    for (auto op : {sdk::AttentionOp::softmax_forward, sdk::AttentionOp::softmax_backward})
      EXPECT_EQ(attn->supports(op, d), matches(d, {fp32})) << at;
    EXPECT_EQ(emb->supports(sdk::EmbeddingOp::gather, d), matches(d, {storage, storage})) << at;
    EXPECT_EQ(emb->supports(sdk::EmbeddingOp::scatter_add, d), matches(d, {storage})) << at;
    using C = sdk::ConvolutionOp;
    for (auto op : {C::conv2d_forward, C::conv2d_backward_data})
      EXPECT_EQ(conv->supports(op, d), matches(d, {gemm_operand, gemm_operand, storage})) << at;
    EXPECT_EQ(conv->supports(C::conv2d_backward_weights, d),
              matches(d, {gemm_operand, gemm_operand}))
        << at;
    for (auto op : {C::pool2d_forward, C::pool2d_backward})
      EXPECT_EQ(conv->supports(op, d),
                matches(d, {storage, storage}) &&
                    (d.size() < 2 || d[0] == d[1] || (fp32(d[0]) && fp32(d[1]))))
          << at;
    for (auto op : {C::to_channels_last, C::to_channels_first})
      EXPECT_EQ(conv->supports(op, d), matches(d, {storage, storage})) << at;
  });
  EXPECT_EQ(lists, 1 + 7 + 49 + 343 + 2401);
}

}  // namespace
}  // namespace mixtrain::core
