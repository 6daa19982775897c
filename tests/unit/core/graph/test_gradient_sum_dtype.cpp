// model.fp32_gradient_sums = false (memory_plan.h): a tensor read several times sums its gradient
// in the one dtype its readers' contributions come in, as PyTorch AMP's autograd sums bf16
// gradients, instead of FP32. A Bottleneck block's input is read by its first convolution and by
// the shortcut: in bf16 its gradient buffer is bf16, the first contribution goes straight in and
// the later one is added by the residual facet's add in place. Against the FP32 sums: the same
// loss, gradients within bf16 rounding; in fp32 the same bits; readers of two dtypes, and a
// backend without a 16-bit add, keep the FP32 sum.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cnn_test_support.h"
#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "forwarding_backend.h"
#include "mixtrain/core/graph/memory_plan.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/backend_residual.h"

namespace mixtrain::core {
namespace {

using namespace cnn_testing;
using sdk::DType;
using test_support::cpu;

ModelSpec bottleneck_spec(bool fp32_sums) {
  ResNetPreset p;
  // Each stage a projection block, then an identity block. Two contributions, rounded once into a
  // bf16 sum, are the bits a reader that rounds an FP32 sum to bf16 gets: the sums differ where
  // one feeds another unrounded, through an identity block's add (in FP32 its pass-through
  // contribution is the FP32 sum itself).
  p.blocks = {2, 2};
  p.widths = {4, 8};
  p.block = ResNetBlock::bottleneck;
  p.classes = 3;
  ModelSpec spec = graph(resnet_preset(p));
  spec.fp32_gradient_sums = fp32_sums;
  return spec;
}

std::unique_ptr<Model> bottleneck(std::shared_ptr<sdk::DeviceBackend> backend, bool fp32_sums,
                                  DType dtype) {
  auto m = std::make_unique<Model>(std::move(backend), bottleneck_spec(fp32_sums), 3 * 8 * 8, 3,
                                   image(3, 8, 8));
  for (auto& l : m->layers()) l->set_precision(test_support::uniform_precision(dtype));
  m->allocate(4);
  m->init_parameters(5);
  feed(*m, 4, 2);
  return m;
}

// The dtypes of the gradient sums: the slots of tensors read more than once.
std::vector<DType> sum_dtypes(const Model& m) {
  const StepMemoryPlan step = plan_step_memory(m.plan(), m.layers(), 4);
  std::vector<DType> out;
  for (const GradientSlot& g : step.gradients.slots)
    if (g.reads > 1) out.push_back(g.dtype);
  return out;
}

TEST(GradientSumDtype, InBf16TheBlockInputsSumInBf16AndTheStepTracksTheFp32SumsOne) {
  auto sums16 = bottleneck(cpu(), false, DType::bf16);
  auto sums32 = bottleneck(cpu(), true, DType::bf16);
  const std::vector<DType> d16 = sum_dtypes(*sums16), d32 = sum_dtypes(*sums32);
  ASSERT_EQ(d16.size(), 4u) << "the stem's output and the first three blocks' outputs";
  for (DType d : d16) EXPECT_EQ(d, DType::bf16);
  for (DType d : d32) EXPECT_EQ(d, DType::fp32);
  // Half the bytes of each sum: the gradient arena shrinks.
  EXPECT_LT(plan_step_memory(sums16->plan(), sums16->layers(), 4).gradients.planned.arena_bytes,
            plan_step_memory(sums32->plan(), sums32->layers(), 4).gradients.planned.arena_bytes);
  const std::vector<float> a = loss_and_gradients(*sums16, 4);
  const std::vector<float> b = loss_and_gradients(*sums32, 4);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a[0], b[0]) << "the loss precedes every backward";
  // Each sum is rounded to bf16 once more per add (2^-9 relative), carried through the blocks.
  EXPECT_LT(relative_distance(a, b), 2e-2);
  EXPECT_NE(a, b) << "the sums were rounded to bf16";
}

// The CPU's residual facet, counting the adds whose first term is their output (in place).
class CountingResidual final : public sdk::ResidualFacet {
 public:
  explicit CountingResidual(sdk::ResidualFacet& in) : in_(in) {}
  bool supports(sdk::ResidualOp op, std::span<const DType> d) const override {
    return in_.supports(op, d);
  }
  void add(std::span<const sdk::TensorView> xs, bool relu, sdk::TensorView y) override {
    if (!xs.empty() && xs[0].data == y.data) ++in_place;
    in_.add(xs, relu, y);
  }
  void add_backward(sdk::TensorView dy, sdk::TensorView y, bool relu,
                    std::span<const sdk::TensorView> dxs) override {
    in_.add_backward(dy, y, relu, dxs);
  }
  int in_place = 0;

 private:
  sdk::ResidualFacet& in_;
};

class CountingBackend final : public test_support::ForwardingBackend {
 public:
  CountingBackend() : residual(*sdk::facet<sdk::ResidualFacet>(*in_)) {}
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ResidualFacet::kName ? &residual : in_->find_facet(name);
  }
  CountingResidual residual;
};

// Each bf16 sum takes its first contribution straight and adds the second with the residual add
// in place: one call per sum. FP32 sums add theirs with an axpy.
TEST(GradientSumDtype, EachBf16SumAddsItsSecondContributionInPlace) {
  auto b16 = std::make_shared<CountingBackend>();
  loss_and_gradients(*bottleneck(b16, false, DType::bf16), 4);
  EXPECT_EQ(b16->residual.in_place, 4);
  auto b32 = std::make_shared<CountingBackend>();
  loss_and_gradients(*bottleneck(b32, true, DType::bf16), 4);
  EXPECT_EQ(b32->residual.in_place, 0);
}

// The CPU's convolution facet offering its accumulating data gradient into a 16-bit sum, which
// the CPU implements but does not offer (convolution facet 1.1, a dtype pair added through
// supports()), counting its calls.
class Accumulating16Convolution final : public ForwardingConvolution {
 public:
  explicit Accumulating16Convolution(sdk::ConvolutionFacet& in) : ForwardingConvolution(in) {}
  bool supports(sdk::ConvolutionOp op, std::span<const DType> d) const override {
    if (op == sdk::ConvolutionOp::conv2d_backward_data_accumulate)
      return d.size() == 3 && d[2] == d[0] && (d[0] == DType::bf16 || d[0] == DType::fp16);
    return in_.supports(op, d);
  }
  void conv2d_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& a) override {
    ++calls;
    in_.conv2d_backward_data_accumulate(a);
  }
  int calls = 0;
};

class Accumulating16Backend final : public test_support::ForwardingBackend {
 public:
  Accumulating16Backend() : conv(*sdk::facet<sdk::ConvolutionFacet>(*in_)) {}
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ConvolutionFacet::kName ? &conv : in_->find_facet(name);
  }
  Accumulating16Convolution conv;
};

// Where the backend adds a convolution's contribution into a 16-bit sum itself, each block's first
// convolution does (one call per sum, no residual add): the sum rounded once, from the unrounded
// contribution, so the step is within bf16 rounding of the residual add's.
TEST(GradientSumDtype, AConvolutionAddsItsContributionIntoTheBf16SumWhereOffered) {
  auto offering = std::make_shared<Accumulating16Backend>();
  const std::vector<float> a = loss_and_gradients(*bottleneck(offering, false, DType::bf16), 4);
  EXPECT_EQ(offering->conv.calls, 4);
  auto counting = std::make_shared<CountingBackend>();
  const std::vector<float> b = loss_and_gradients(*bottleneck(counting, false, DType::bf16), 4);
  EXPECT_EQ(counting->residual.in_place, 4);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a[0], b[0]);
  EXPECT_LT(relative_distance(a, b), 2e-2);
  // FP32 sums keep their own route: the 16-bit op is never asked for them.
  auto fp32_sums = std::make_shared<Accumulating16Backend>();
  loss_and_gradients(*bottleneck(fp32_sums, true, DType::bf16), 4);
  EXPECT_EQ(fp32_sums->conv.calls, 0);
}

TEST(GradientSumDtype, InFp32TheSumsAreFp32EitherWayAndTheStepIsTheSameBits) {
  auto a = bottleneck(cpu(), false, DType::fp32);
  auto b = bottleneck(cpu(), true, DType::fp32);
  for (DType d : sum_dtypes(*a)) EXPECT_EQ(d, DType::fp32);
  EXPECT_EQ(loss_and_gradients(*a, 4), loss_and_gradients(*b, 4));
}

TEST(GradientSumDtype, ReadersOfTwoDtypesKeepTheFp32Sum) {
  auto m = std::make_unique<Model>(cpu(), bottleneck_spec(false), 3 * 8 * 8, 3, image(3, 8, 8));
  for (auto& l : m->layers()) l->set_precision(test_support::uniform_precision(DType::bf16));
  // The last reader of the stem's output (its block's shortcut, a projection) contributes in fp32.
  const GraphPlan& plan = m->plan();
  const StepMemoryPlan before = plan_step_memory(plan, m->layers(), 4);
  std::size_t stem = 0, reader = 0;
  for (std::size_t r = 0; r < before.gradients.slots.size(); ++r)
    if (before.gradients.slots[r].reads > 1) {
      stem = r;
      break;
    }
  for (std::size_t q = stem + 1; q < plan.size(); ++q)
    for (TensorId t : plan.node(q).inputs)
      if (plan.root(t) == TensorId::node(stem)) reader = q;
  ASSERT_GT(reader, stem);
  m->layers()[reader]->set_precision(test_support::uniform_precision(DType::fp32));
  const StepMemoryPlan after = plan_step_memory(plan, m->layers(), 4);
  EXPECT_EQ(before.gradients.slots[stem].dtype, DType::bf16);
  EXPECT_EQ(after.gradients.slots[stem].dtype, DType::fp32);
}

// A backend whose residual facet is missing cannot add 16-bit gradients: the model keeps FP32
// sums, and its step is the FP32-sum step's.
class NoResidualBackend final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ResidualFacet::kName ? nullptr : in_->find_facet(name);
  }
};

TEST(GradientSumDtype, ABackendWithoutA16BitAddKeepsFp32Sums) {
  auto m = bottleneck(std::make_shared<NoResidualBackend>(), false, DType::bf16);
  EXPECT_TRUE(m->plan().fp32_gradient_sums());
  for (DType d : sum_dtypes(*m)) EXPECT_EQ(d, DType::fp32);
  auto reference = bottleneck(std::make_shared<NoResidualBackend>(), true, DType::bf16);
  EXPECT_EQ(loss_and_gradients(*m, 4), loss_and_gradients(*reference, 4));
}

}  // namespace
}  // namespace mixtrain::core
