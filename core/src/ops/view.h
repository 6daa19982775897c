// reshape and flatten: views of their input with another per-sample shape.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "mixtrain/core/layer.h"

namespace mixtrain::core {

// reshape / flatten: a view. `in` and `out` are the last dimensions before and after.
class ViewLayer final : public Layer {
 public:
  ViewLayer(std::string name, std::string type, std::int64_t in, std::int64_t out);
  bool is_view() const override { return true; }
  std::int64_t forward_flops_per_row() const override { return 0; }
  bool backward_reads_inputs() const override { return false; }
  void forward(sdk::TensorView, std::int64_t) override {}
  void backward(sdk::TensorView, sdk::TensorView, sdk::TensorView, std::int64_t) override {}

 protected:
  bool output_deferred() const override { return true; }  // never allocated: the input's memory
};

}  // namespace mixtrain::core
