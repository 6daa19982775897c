// conv2d: 2-D convolution of images [C, H, W] → [O, OH, OW], PyTorch's Conv2d.
//
// Contract
// - Options: out (O), kernel, stride, padding, dilation (one int, or [h, w]), groups, bias, init.
//   C and O must be multiples of groups; the dilated kernel must fit the padded input. Violations
//   are plan-time errors naming the node.
// - Layout: the output is channels-last (ops/op_registry.h, TensorLayout); a plain input (the
//   batch) is permuted once per step into a scratch (ops/image_input.h).
// - Weight: fp32 master [O, C/groups, KH, KW] (PyTorch's layout, decayed), optional bias [O] (not
//   decayed); a working copy in the plan's weight dtype. Init: PyTorch's default (kaiming uniform,
//   a = √5) or, with init = "kaiming_normal", N(0, 2 / (O·KH·KW)) as torchvision's ResNets.
// - Precision: one GEMM-like product "conv" with operands input, weight and grad_output, planned
//   by the policy as a linear's matmul; FP8 slots are "<node>.conv.<role>". Accumulation FP32.
// - Input gradient into a sum: where its input is read by other ops too (a ResNet block's input,
//   read by the first convolution and by the shortcut) and the executor hands it the FP32 sum
//   (layer.h, can_accumulate_input_gradient), the data gradient is added into it by the
//   convolution itself (convolution facet 1.1, conv2d_backward_data_accumulate): no contribution
//   written apart, no axpy. Only for a channels-last input, operands not FP8-scaled, fusion on
//   (set_fusion) and a backend that offers the op (choose_kernels, logged once otherwise); the
//   sum differs from the unfused one only by the contribution's rounding, which it skips. Into a
//   16-bit sum (model.fp32_gradient_sums = false) likewise, where the backend offers the op with a
//   dx of the operands' 16-bit dtype (can_accumulate_input_gradient_in): the sum rounded once.
// - Workspace: where the backend's convolution facet is 1.2 or later, the op asks it for each
//   pass's workspace (conv2d_workspace_bytes: the forward's; the largest of the backward calls
//   the plan's WorkspaceAsk says it will make) and runs the *_with_workspace calls on the step
//   workspace the executor binds (layer.h), so the backend's scratch for the call (cuDNN's
//   workspace, the CPU's decoded operands) lives in the step's arena at the op's step only. A
//   query the backend refuses plans none; the call, if it comes, says why.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/ops/image_input.h"
#include "graph/ops/operand_scaler.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::core {

class Conv2dLayer final : public Layer {
 public:
  static constexpr const char* kGemm = "conv";
  enum class Init { pytorch, kaiming_normal };

  // `geometry.batch` is ignored (each call's comes from its rows).
  Conv2dLayer(std::string name, const sdk::Conv2dGeometry& geometry, bool bias, Init init,
              bool plain_input);
  const sdk::Conv2dGeometry& geometry() const { return geometry_; }
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;
  void choose_kernels(sdk::DeviceBackend& backend) override;
  void set_fusion(bool on) override { fusion_on_ = on; }
  bool can_accumulate_input_gradient(std::size_t k) const override;
  bool can_accumulate_input_gradient_in(std::size_t k, sdk::DType dtype) const override;
  std::size_t step_workspace_bytes(const WorkspaceAsk& ask) const override;

 private:
  sdk::Conv2dGeometry at_batch(std::int64_t rows) const;
  sdk::DType compute() const;
  std::vector<std::int64_t> weight_shape() const;

  sdk::Conv2dGeometry geometry_;
  bool bias_;
  Init init_;
  ChannelsLastInput input_;
  sdk::TensorView x_operand_;  // the forward's input operand (channels-last), for backward
  float x_scale_inv_ = 1.0f;
  Tensor dy_scratch_;
  OperandScaler scaler_;
  bool fusion_on_ = true;
  bool accumulate_offered_ = false;  // conv2d_backward_data_accumulate (choose_kernels)
  bool accumulate16_offered_ = false;  // the same into a 16-bit sum of the operands' dtype
  // The backend's convolution facet where it takes a caller's workspace (1.2; choose_kernels).
  const sdk::ConvolutionFacet* workspace_facet_ = nullptr;
};

}  // namespace mixtrain::core
