// ConvolutionFacet (backend_convolution.h): its out-of-line anchor, its ops' names in messages, their rows
// of the signature table and the default supports() that answers from them.
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/error.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

ConvolutionFacet::~ConvolutionFacet() = default;

std::string_view op_name(ConvolutionOp op) noexcept {
  switch (op) {
    case ConvolutionOp::conv2d_forward:
      return "conv2d_forward";
    case ConvolutionOp::conv2d_backward_data:
      return "conv2d_backward_data";
    case ConvolutionOp::conv2d_backward_weights:
      return "conv2d_backward_weights";
    case ConvolutionOp::pool2d_forward:
      return "pool2d_forward";
    case ConvolutionOp::pool2d_backward:
      return "pool2d_backward";
    case ConvolutionOp::to_channels_last:
      return "to_channels_last";
    case ConvolutionOp::to_channels_first:
      return "to_channels_first";
    case ConvolutionOp::conv2d_backward_data_accumulate:
      return "conv2d_backward_data_accumulate";
  }
  return "?";
}

OpSignature op_signature(ConvolutionOp op) noexcept {
  switch (op) {
    case ConvolutionOp::conv2d_forward:
    case ConvolutionOp::conv2d_backward_data:
      return {kOperandx2Out};  // {x, w, y} and {dy, w, dx}
    case ConvolutionOp::conv2d_backward_weights:
      return {kOperandx2};  // {x, dy}
    case ConvolutionOp::pool2d_forward:
    case ConvolutionOp::pool2d_backward:
      return {kStorex2, true};  // {x, y}, {dy, dx}: one dtype
    case ConvolutionOp::to_channels_last:
    case ConvolutionOp::to_channels_first:
      return {kStorex2};  // {src, dst}: either mix, rounded once
    case ConvolutionOp::conv2d_backward_data_accumulate:  // 1.1
      return {};  // no row: offered only by a backend that answers for it
  }
  return {};
}

void ConvolutionFacet::conv2d_backward_data_accumulate(const Conv2dBackwardDataArgs&) {
  throw BackendError("this backend's convolution facet has no conv2d_backward_data_accumulate",
                     "report this: the host asks supports(conv2d_backward_data_accumulate) before "
                     "it calls it and runs conv2d_backward_data and a sum where the answer is "
                     "false");
}

std::size_t ConvolutionFacet::conv2d_workspace_bytes(const Conv2dWorkspaceQuery&) const {
  return 0;
}

// A backend that wants no workspace of its caller's runs the calls without it.
void ConvolutionFacet::conv2d_forward_with_workspace(const Conv2dForwardArgs& args, TensorView) {
  conv2d_forward(args);
}

void ConvolutionFacet::conv2d_backward_data_with_workspace(const Conv2dBackwardDataArgs& args,
                                                           TensorView) {
  conv2d_backward_data(args);
}

void ConvolutionFacet::conv2d_backward_data_accumulate_with_workspace(
    const Conv2dBackwardDataArgs& args, TensorView) {
  conv2d_backward_data_accumulate(args);
}

void ConvolutionFacet::conv2d_backward_weights_with_workspace(const Conv2dBackwardWeightsArgs& args,
                                                              TensorView) {
  conv2d_backward_weights(args);
}

bool ConvolutionFacet::supports(ConvolutionOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
