// The max pool of a ResNet stem reads the gradient of its output, which two convolutions read and
// so is summed in FP32 (memory_plan.h), as it is where the convolution facet offers an fp32 dy
// into a 16-bit dx (backend_convolution.h, pool2d_backward): no cast into a scratch of the pool's
// own. A facet standing in for such a backend (the CPU's pooling, after the same cast the layer
// would make) gives the step's bits of the cast path; it sees fp32 dy where it offers the mix and
// the layer's bf16 copy where it does not.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "cnn_test_support.h"
#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::core {
namespace {

using namespace cnn_testing;
using sdk::DType;
using test_support::cpu;

// The CPU's convolution facet, offering (or not) pool2d_backward from an fp32 dy into a bf16 dx:
// it rounds dy to bf16 and runs the CPU's pooling, which is what the layer does when the mix is
// not offered, so both give the same bits.
class MixedPoolConvolution final : public ForwardingConvolution {
 public:
  MixedPoolConvolution(std::shared_ptr<sdk::DeviceBackend> backend, bool offer)
      : ForwardingConvolution(*sdk::facet<sdk::ConvolutionFacet>(*backend)),
        backend_(std::move(backend)),
        offer_(offer) {}
  bool supports(sdk::ConvolutionOp op, std::span<const DType> d) const override {
    if (op == sdk::ConvolutionOp::pool2d_backward && d.size() == 2 && d[0] == DType::fp32 &&
        d[1] == DType::bf16)
      return offer_;
    return in_.supports(op, d);
  }
  void pool2d_backward(const sdk::Pool2dGeometry& g, sdk::TensorView dy, sdk::TensorView x,
                       sdk::TensorView y, sdk::TensorView ws, sdk::TensorView dx) override {
    dy_dtypes.push_back(dy.dtype);
    if (dy.dtype == dx.dtype) return in_.pool2d_backward(g, dy, x, y, ws, dx);
    if (!offer_) ADD_FAILURE() << "an fp32 dy reached a facet that does not offer it";
    Tensor rounded(backend_, dx.dtype, dy.shape);
    backend_->cast(dy, rounded.view());
    in_.pool2d_backward(g, rounded.view(), x, y, ws, dx);
  }
  std::vector<DType> dy_dtypes;

 private:
  std::shared_ptr<sdk::DeviceBackend> backend_;
  bool offer_;
};

class MixedPoolBackend final : public test_support::ForwardingBackend {
 public:
  explicit MixedPoolBackend(bool offer) : conv(in_, offer) {}
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ConvolutionFacet::kName ? &conv : in_->find_facet(name);
  }
  MixedPoolConvolution conv;
};

// A bottleneck ResNet with the ImageNet stem (7x7 convolution, 3x3 max pool), in bf16: the pool's
// output is read by the first block's convolution and its projection shortcut.
std::vector<float> bf16_step(const std::shared_ptr<sdk::DeviceBackend>& backend) {
  ResNetPreset p;
  p.blocks = {1};
  p.widths = {4};
  p.block = ResNetBlock::bottleneck;
  p.stem = ResNetStem::imagenet;
  p.classes = 3;
  Model m(backend, graph(resnet_preset(p)), 3 * 16 * 16, 3, image(3, 16, 16));
  for (auto& l : m.layers()) l->set_precision(test_support::uniform_precision(DType::bf16));
  m.allocate(4);
  m.init_parameters(5);
  feed(m, 4, 2);
  return loss_and_gradients(m, 4);
}

TEST(PoolGradient, AnFp32GradientReachesAFacetThatOffersItUncastWithTheSameStep) {
  auto offering = std::make_shared<MixedPoolBackend>(true);
  auto plain = std::make_shared<MixedPoolBackend>(false);
  const std::vector<float> mixed = bf16_step(offering);
  const std::vector<float> cast = bf16_step(plain);
  // The head's global average pool first (read once: a bf16 gradient), then the stem's max pool.
  EXPECT_EQ(offering->conv.dy_dtypes, (std::vector<DType>{DType::bf16, DType::fp32}));
  EXPECT_EQ(plain->conv.dy_dtypes, (std::vector<DType>{DType::bf16, DType::bf16}));
  ASSERT_EQ(mixed.size(), cast.size());
  EXPECT_EQ(mixed, cast);
}

}  // namespace
}  // namespace mixtrain::core
