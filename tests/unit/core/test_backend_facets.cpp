// Backend facets at plan time: a backend that omits a facet, or answers supports() = false for a
// dtype, stops Model::allocate before anything runs, with a ConfigError naming the node, the op,
// the dtypes and the backend at the node's config line. A backend with every facet plans and runs.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/model.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using sdk::TensorView;

// The CPU backend's core and facets, minus the normalization facet, and with bf16 refused by the
// GEMM facet's supports() when `refuse_bf16_gemm`.
class PartialBackend final : public sdk::DeviceBackend, public sdk::GemmFacet {
 public:
  explicit PartialBackend(bool refuse_bf16_gemm) : refuse_bf16_(refuse_bf16_gemm) {}

  sdk::BackendCapabilities capabilities() const override { return in_->capabilities(); }
  void* allocate(std::size_t bytes) override { return in_->allocate(bytes); }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(TensorView dst, const void* src) override { in_->copy_from_host(dst, src); }
  void copy_to_host(void* dst, TensorView src) override { in_->copy_to_host(dst, src); }
  void copy(TensorView dst, TensorView src) override { in_->copy(dst, src); }
  void synchronize() override { in_->synchronize(); }
  void cast(TensorView s, TensorView d, const sdk::CastArgs& a) override { in_->cast(s, d, a); }
  void fill(TensorView x, float v) override { in_->fill(x, v); }

  sdk::GemmFacet* gemm_facet() override { return this; }
  sdk::ElementwiseFacet* elementwise_facet() override { return in_->elementwise_facet(); }
  sdk::LossFacet* loss_facet() override { return in_->loss_facet(); }
  sdk::OptimizerFacet* optimizer_facet() override { return in_->optimizer_facet(); }
  // normalization_facet(): the default, nullptr.

  bool supports(sdk::GemmOp op, std::span<const DType> dtypes) const override {
    for (DType t : dtypes)
      if (refuse_bf16_ && t == DType::bf16) return false;
    return in_->gemm_facet()->supports(op, dtypes);
  }
  void gemm(const sdk::GemmArgs& a) override { in_->gemm_facet()->gemm(a); }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& a) override {
    in_->gemm_facet()->gemm_strided_batched(a);
  }

 private:
  std::shared_ptr<sdk::DeviceBackend> in_ = test_support::cpu();
  bool refuse_bf16_;
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
  EXPECT_NE(msg.find("normalization.layernorm_forward on fp32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("backend 'cpu'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("it has no normalization facet"), std::string::npos) << msg;
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
  ASSERT_NE(b->elementwise_facet(), nullptr);
  EXPECT_TRUE(b->elementwise_facet()->supports(sdk::ForeachOp::foreach_addcmul, f32));
  EXPECT_FALSE(b->elementwise_facet()->supports(sdk::ForeachOp::foreach_sqrt, i32));
  // More dtypes than the op has tensors: a question about another op.
  EXPECT_FALSE(b->elementwise_facet()->supports(sdk::ForeachOp::foreach_sign, f32));
  EXPECT_EQ(b->gemm_facet()->version(), sdk::GemmFacet::kVersion);
  EXPECT_EQ(unmet(*b, {sdk::LossOp::softmax_cross_entropy, {DType::bf16}}), std::nullopt);
}

}  // namespace
}  // namespace mixtrain::core
