// A convolution adds its input gradient into the FP32 sum of a tensor read several times
// (conv2d.h, convolution facet 1.1's conv2d_backward_data_accumulate): a Bottleneck block's input
// is read by its first convolution and by the shortcut. The CPU backend implements the op but does
// not offer it (its fp32 scratch and add move more bytes than the contribution and axpy it
// replaces), so here a facet offers the CPU's implementation and counts its calls. Against the
// CPU as it is (the contribution written apart, added by an axpy): the same step bit for bit in
// fp32, within bf16 rounding in bf16; no call with fusion off or in the non-finite replay.
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
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

using namespace cnn_testing;
using sdk::DType;
using test_support::cpu;
using test_support::read;

// The CPU's convolution facet offering (or refusing) its accumulating data gradient.
class AccumulatingConvolution final : public ForwardingConvolution {
 public:
  AccumulatingConvolution(sdk::ConvolutionFacet& in, bool offer)
      : ForwardingConvolution(in), offer_(offer) {}
  bool supports(sdk::ConvolutionOp op, std::span<const DType> d) const override {
    if (op == sdk::ConvolutionOp::conv2d_backward_data_accumulate)
      return offer_ && d.size() == 3 && d[2] == DType::fp32 &&
             in_.supports(sdk::ConvolutionOp::conv2d_backward_data, d);
    return in_.supports(op, d);
  }
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& a) override {
    ++apart_calls;
    in_.conv2d_backward_data(a);
  }
  void conv2d_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& a) override {
    if (!offer_) ADD_FAILURE() << "called conv2d_backward_data_accumulate, which it refuses";
    ++accumulate_calls;
    in_.conv2d_backward_data_accumulate(a);
  }
  int accumulate_calls = 0, apart_calls = 0;

 private:
  bool offer_;
};

class ConvolutionBackend final : public test_support::ForwardingBackend {
 public:
  explicit ConvolutionBackend(bool offer) : conv(*sdk::facet<sdk::ConvolutionFacet>(*in_), offer) {}
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ConvolutionFacet::kName ? &conv : in_->find_facet(name);
  }
  AccumulatingConvolution conv;
};

std::unique_ptr<Model> bottleneck(std::shared_ptr<sdk::DeviceBackend> backend, bool fuse,
                                  DType dtype) {
  ResNetPreset p;
  p.blocks = {1, 2};  // a projection block and an identity block after it
  p.widths = {4, 8};
  p.block = ResNetBlock::bottleneck;
  p.classes = 3;
  ModelSpec spec = graph(resnet_preset(p));
  spec.fuse_epilogues = fuse;
  auto m = std::make_unique<Model>(std::move(backend), spec, 3 * 8 * 8, 3, image(3, 8, 8));
  for (auto& l : m->layers()) l->set_precision(test_support::uniform_precision(dtype));
  m->allocate(4);
  m->init_parameters(5);
  feed(*m, 4, 2);
  return m;
}

// One training step: the loss and every parameter gradient, flattened.
std::vector<float> step(Model& m) {
  return loss_and_gradients(m, 4);
}

// Readers of a block input: the first convolution and the shortcut (a projection convolution, or
// the add). The backward reaches the shortcut first, so each block's first convolution adds the
// later contribution: one call per block, 3 here.
constexpr int kBlocks = 3;

TEST(ConvGradientSum, TheFirstConvolutionOfEachBlockAddsIntoTheSumBitForBitInFp32) {
  auto offering = std::make_shared<ConvolutionBackend>(true);
  auto apart = std::make_shared<ConvolutionBackend>(false);
  auto fused_model = bottleneck(offering, true, DType::fp32);
  auto apart_model = bottleneck(apart, true, DType::fp32);
  const std::vector<float> fused = step(*fused_model);
  const std::vector<float> plain = step(*apart_model);
  EXPECT_EQ(offering->conv.accumulate_calls, kBlocks);
  EXPECT_EQ(apart->conv.accumulate_calls, 0);
  EXPECT_EQ(offering->conv.apart_calls + kBlocks, apart->conv.apart_calls);
  // In fp32 the contribution the axpy adds is the one the op adds: the same sums.
  ASSERT_EQ(fused.size(), plain.size());
  EXPECT_EQ(fused, plain);
}

TEST(ConvGradientSum, InBf16TheContributionIsNotRoundedAndTheStepTracksTheAxpysOne) {
  auto offering = std::make_shared<ConvolutionBackend>(true);
  auto apart = std::make_shared<ConvolutionBackend>(false);
  const std::vector<float> fused = step(*bottleneck(offering, true, DType::bf16));
  const std::vector<float> plain = step(*bottleneck(apart, true, DType::bf16));
  EXPECT_EQ(offering->conv.accumulate_calls, kBlocks);
  ASSERT_EQ(fused.size(), plain.size());
  // Apart, the contribution is rounded to bf16 before the FP32 add: one rounding (2^-9 relative)
  // of one of two terms, carried through the blocks before it.
  EXPECT_LT(relative_distance(fused, plain), 2e-2);
  EXPECT_EQ(fused[0], plain[0]) << "the loss precedes every backward";
  EXPECT_NE(fused, plain) << "the added contribution was rounded to bf16 first, as apart";
}

TEST(ConvGradientSum, FusionOffAndTheNonFiniteReplayWriteTheContributionApart) {
  auto offering = std::make_shared<ConvolutionBackend>(true);
  const std::vector<float> off = step(*bottleneck(offering, false, DType::fp32));
  EXPECT_EQ(offering->conv.accumulate_calls, 0);

  auto again = std::make_shared<ConvolutionBackend>(true);
  auto m = bottleneck(again, true, DType::fp32);
  const std::vector<float> fused = step(*m);
  EXPECT_EQ(off, fused);
  const int before = again->conv.accumulate_calls;
  // The replay reads each contribution apart (a backward with a visitor): no accumulating call,
  // every tensor finite, and the gradients it leaves those of the step.
  EXPECT_EQ(locate_first_nonfinite(*m, 4, 1.0f).where, "");
  EXPECT_EQ(again->conv.accumulate_calls, before);
  std::vector<float> replayed{fused[0]};
  for (auto* t : m->parameters()) {
    const auto g = read(t->grad.view());
    replayed.insert(replayed.end(), g.begin(), g.end());
  }
  EXPECT_EQ(replayed, fused);
}

// A backend built against the SDK before 1.1, or one that does not override the op, keeps the
// SDK's default: supports() false and a call that names what to do.
TEST(ConvGradientSum, TheSdksDefaultRefusesTheOp) {
  sdk::ConvolutionFacet& conv = *sdk::facet<sdk::ConvolutionFacet>(*cpu());
  EXPECT_FALSE(conv.sdk::ConvolutionFacet::supports(
      sdk::ConvolutionOp::conv2d_backward_data_accumulate,
      std::vector<DType>{DType::fp32, DType::fp32, DType::fp32}));
  try {
    conv.sdk::ConvolutionFacet::conv2d_backward_data_accumulate({});
    ADD_FAILURE() << "the default ran";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("no conv2d_backward_data_accumulate"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mixtrain::core
