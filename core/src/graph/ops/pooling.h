// Pooling of images [C, H, W]: maxpool2d, avgpool2d (PyTorch's MaxPool2d / AvgPool2d, floor
// arithmetic) and global_avgpool ([C, H, W] → [C], AdaptiveAvgPool2d(1) + flatten).
//
// Contract
// - Options (max / avg): kernel, stride (default: the kernel), padding (at most half the kernel,
//   as PyTorch requires); avg also count_include_pad (true). global_avgpool has none.
// - Layout: max / avg outputs are channels-last images; global_avgpool's [C] is plain, so a
//   linear can follow. A plain input is permuted first (ops/image_input.h).
// - Max pooling keeps the argmax in a backend workspace from the training forward to backward.
// - No parameters; the output is stored in the plan's activation dtype (pooling only selects or
//   averages, FP32 inside).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/ops/image_input.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::core {

class Pool2dLayer final : public Layer {
 public:
  // `geometry.batch` is ignored; `global` marks a global average pool (plain [C] output).
  Pool2dLayer(std::string name, std::string type, const sdk::Pool2dGeometry& geometry, bool global,
              bool plain_input);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;

 private:
  sdk::Pool2dGeometry at_rows(std::int64_t rows) const;
  sdk::DType dtype() const;

  sdk::Pool2dGeometry geometry_;
  bool global_;
  ChannelsLastInput input_;
  sdk::TensorView x_cl_;
  BatchWorkspace workspace_;
  Tensor dy_scratch_, dx_scratch_;
};

}  // namespace mixtrain::core
