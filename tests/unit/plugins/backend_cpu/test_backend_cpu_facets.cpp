// The CPU backend's facets as registered objects: find_facet serves every facet its source files
// registered (all fifteen of the header's contract, each at the version the host asks for), and
// FacetSet refuses a second registration of one facet name, naming it.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "backend_test_util.h"
#include "cpu_backend.h"
#include "cpu_context.h"
#include "mixtrain/sdk/backend_dropout.h"
#include "mixtrain/sdk/backend_plan_report.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu::testing {
namespace {

template <class... Fs>
std::vector<std::string_view> facets_served(sdk::DeviceBackend& backend) {
  std::vector<std::string_view> served;
  ((sdk::facet<Fs>(backend) != nullptr ? served.push_back(Fs::kName) : void()), ...);
  return served;
}

TEST(CpuFacets, FindFacetServesEveryRegisteredFacet) {
  CpuBackend backend(1);
  const auto& registered = sdk::FacetRegistry<CpuContext>::entries();
  for (const auto& entry : registered) {
    sdk::Facet* f = backend.find_facet(entry.name);
    ASSERT_NE(f, nullptr) << entry.name;
    EXPECT_EQ(f->name(), entry.name);
  }
  const std::vector<std::string_view> all = {
      "gemm",       "activation", "residual",         "gradient_check", "foreach",    "layer_norm",
      "batch_norm", "loss",       "optimizer",        "attention",      "embedding",  "convolution",
      "dropout",    "scratch",    "quantized_weight", "image_input",    "plan_report"};
  EXPECT_EQ(registered.size(), all.size());
  const auto served = facets_served<sdk::GemmFacet, sdk::ActivationFacet, sdk::ResidualFacet,
                                    sdk::GradientCheckFacet, sdk::ForeachFacet, sdk::LayerNormFacet,
                                    sdk::BatchNormFacet, sdk::LossFacet, sdk::OptimizerFacet,
                                    sdk::AttentionFacet, sdk::EmbeddingFacet, sdk::ConvolutionFacet,
                                    sdk::DropoutFacet, sdk::ScratchFacet, sdk::QuantizedWeightFacet,
                                    sdk::ImageInputFacet, sdk::PlanReportFacet>(backend);
  EXPECT_EQ(served, all);
  EXPECT_EQ(backend.find_facet("no_such_facet"), nullptr);
  EXPECT_EQ(sdk::facet<sdk::StepGraphFacet>(backend), nullptr);  // a CUDA-only facet
}

// Two fake dropout implementations registered over one (test) context.
struct TwoDropoutsContext {};
struct OneDropoutContext {};

template <int kTag>
class FakeDropout final : public sdk::DropoutFacet {
 public:
  template <class Context>
  explicit FakeDropout(Context&) {}
  void dropout_forward(sdk::TensorView, sdk::TensorView, float, sdk::DropoutKey) override {}
  void dropout_backward(sdk::TensorView, sdk::TensorView, float, sdk::DropoutKey) override {}
};

const sdk::FacetRegistration<TwoDropoutsContext, sdk::DropoutFacet, FakeDropout<1>> kFirst;
const sdk::FacetRegistration<TwoDropoutsContext, sdk::DropoutFacet, FakeDropout<2>> kSecond;
const sdk::FacetRegistration<OneDropoutContext, sdk::DropoutFacet, FakeDropout<3>> kOnly;

TEST(CpuFacets, FacetSetRefusesASecondRegistrationOfOneFacet) {
  TwoDropoutsContext context;
  try {
    (void)sdk::make_facets(context);
    FAIL() << "make_facets accepted two dropout facets";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("'dropout'"), std::string::npos) << e.what();
  }
}

TEST(CpuFacets, FacetSetServesItsOneRegistration) {
  OneDropoutContext context;
  const sdk::FacetSet set = sdk::make_facets(context);
  EXPECT_EQ(set.size(), 1u);
  ASSERT_NE(set.find("dropout"), nullptr);
  EXPECT_EQ(set.find("gemm"), nullptr);
  EXPECT_EQ(static_cast<sdk::Facet*>(static_cast<sdk::DropoutFacet*>(&set.get<FakeDropout<3>>())),
            set.find("dropout"));
  EXPECT_THROW((void)set.get<FakeDropout<1>>(), sdk::BackendError);
}

// The scratch facet is the emulation's memory: an fp16 GEMM decodes A and B to fp32 and stages
// the fp32 product of its fp16 C, each in a grow-only buffer; that is all memory_stats() counts
// beyond the caller's tensors, and a second GEMM of the same shape, or an fp32 one, adds nothing.
TEST(CpuFacets, ScratchFacetReportsTheFp32CopiesOfAnEmulatedGemm) {
  CpuBackend backend(1);
  auto* scratch = sdk::facet<sdk::ScratchFacet>(backend);
  auto* gemm = sdk::facet<sdk::GemmFacet>(backend);
  ASSERT_NE(scratch, nullptr);
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(scratch->scratch_bytes(), 0u);
  const std::int64_t m = 64, n = 32, k = 48;  // every buffer a multiple of 64 bytes
  auto run = [&](DType in, DType out) {
    DeviceTensor a(backend, in, Shape{m, k}, std::vector<float>(m * k, 0.5f));
    DeviceTensor b(backend, in, Shape{k, n}, std::vector<float>(k * n, 0.25f));
    DeviceTensor c(backend, out, Shape{m, n});
    sdk::GemmArgs g;
    g.a.view = a.view();
    g.b.view = b.view();
    g.c = c.view();
    gemm->gemm(g);
    const std::size_t callers = a.view().bytes() + b.view().bytes() + c.view().bytes();
    EXPECT_EQ(backend.memory_stats().current_bytes, callers + scratch->scratch_bytes());
  };
  run(DType::fp16, DType::fp16);
  const std::size_t decoded = (m * k + k * n + m * n) * sizeof(float);
  EXPECT_EQ(scratch->scratch_bytes(), decoded);
  run(DType::fp16, DType::fp16);
  run(DType::fp32, DType::fp32);
  EXPECT_EQ(scratch->scratch_bytes(), decoded);
  EXPECT_EQ(backend.memory_stats().current_bytes, decoded);
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
