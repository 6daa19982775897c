// reshape and flatten: views of their input with another per-sample shape — or, of a channels-last
// image, a copy into PyTorch's [C, H, W] order first.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

// reshape / flatten: a view. `in` and `out` are the last dimensions before and after.
class ViewLayer final : public Layer {
 public:
  ViewLayer(std::string name, std::string type, std::int64_t in, std::int64_t out);
  void forward(sdk::TensorView, std::int64_t) override {}
  void backward(sdk::TensorView, sdk::TensorView, sdk::TensorView, std::int64_t) override {}
};

// reshape / flatten of a channels-last image [C, H, W]: permutes it to plain [C, H, W] order (so
// what follows sees what PyTorch's flatten gives), then has the new shape. Backward permutes the
// gradient back to channels-last.
class ChannelsFirstLayer final : public Layer {
 public:
  ChannelsFirstLayer(std::string name, std::string type, std::int64_t channels, std::int64_t height,
                     std::int64_t width, std::int64_t out);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;

 private:
  std::int64_t channels_, height_, width_;
};

}  // namespace mixtrain::core
