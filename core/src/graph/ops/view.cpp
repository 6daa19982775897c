#include "graph/ops/view.h"

#include <algorithm>

#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

namespace mixtrain::core {

ViewLayer::ViewLayer(std::string name, std::string type, std::int64_t in, std::int64_t out)
    : Layer(std::move(name), std::move(type), in, out) {
  traits_.view = true;
  traits_.output_deferred = true;  // never allocated: the input's memory
  traits_.forward_flops_per_row = 0;
  traits_.backward_reads_inputs = false;
}

ChannelsFirstLayer::ChannelsFirstLayer(std::string name, std::string type, std::int64_t channels,
                                       std::int64_t height, std::int64_t width, std::int64_t out)
    : Layer(std::move(name), std::move(type), width, out),
      channels_(channels),
      height_(height),
      width_(width) {
  traits_.forward_flops_per_row = 0;
  traits_.backward_reads_inputs = false;
}

std::vector<BackendNeed> ChannelsFirstLayer::backend_needs(sdk::DType input) const {
  return {
      {sdk::ConvolutionOp::to_channels_first, {input, ops::storage_of(precision_.activation)}},
      {sdk::ConvolutionOp::to_channels_last,
       {sdk::DType::fp32, ops::storage_of(precision_.activation_grad)}},
      {sdk::ConvolutionOp::to_channels_last,
       {ops::storage_of(precision_.activation_grad), ops::storage_of(precision_.activation_grad)}}};
}

void ChannelsFirstLayer::forward(sdk::TensorView x, std::int64_t rows) {
  facets()
      .call(sdk::ConvolutionOp::to_channels_first)
      ->to_channels_first(x, channels_, height_, width_, output(rows));
}

void ChannelsFirstLayer::backward(sdk::TensorView, sdk::TensorView dy, sdk::TensorView dx,
                                  std::int64_t) {
  if (!dx.empty())
    facets()
        .call(sdk::ConvolutionOp::to_channels_last)
        ->to_channels_last(dy, channels_, height_, width_, dx);
}

namespace {
// The output of a flatten / reshape to `shape`: a view, or the permute of a channels-last image.
BuiltOp view_or_permute(const OpNode& node, const char* type, PerSampleShape shape) {
  const PerSampleShape& in = node.inputs[0];
  if (node.layouts[0] == TensorLayout::channels_last)
    return BuiltOp{
        std::make_unique<ChannelsFirstLayer>(node.name, type, in[0], in[1], in[2], shape.back()),
        std::move(shape)};
  return BuiltOp{std::make_unique<ViewLayer>(node.name, type, in.back(), shape.back()),
                 std::move(shape)};
}
}  // namespace

// --- Definitions ---------------------------------------------------------------------------------

OpDefinition flatten_op() {
  OpDefinition op;
  op.type = "flatten";
  op.summary = "view of the input as one dimension per sample (an image in PyTorch's order)";
  op.reads_images = true;
  op.build = [](const OpNode& node) {
    return view_or_permute(node, "flatten", PerSampleShape{ops::checked_product(node.inputs[0])});
  };
  return op;
}

OpDefinition reshape_op() {
  OpDefinition op;
  op.type = "reshape";
  op.summary = "view of the input with another per-sample shape (one size may be -1)";
  op.takes_shape = true;
  op.reads_images = true;
  op.build = [](const OpNode& node) {
    const PerSampleShape& in = node.inputs[0];
    const std::int64_t numel = ops::checked_product(in);
    PerSampleShape shape = node.shape;
    if (shape.empty())
      throw OpSpecError("shape", "a reshape needs a shape",
                        "shape is per sample, without the batch: e.g. shape = [4, 16]");
    int unknown = -1;
    for (std::size_t k = 0; k < shape.size(); ++k) {
      if (shape[k] == -1 && unknown < 0) {
        unknown = static_cast<int>(k);
      } else if (shape[k] <= 0) {
        throw OpSpecError(
            "shape",
            "shape " + ops::shape_text(node.shape) + " needs positive sizes and at most one -1",
            "shape is per sample, without the batch: e.g. [4, -1]");
      }
    }
    if (unknown >= 0) {
      const std::int64_t known = -ops::checked_product(shape);
      if (known > 0 && numel % known == 0) shape[static_cast<std::size_t>(unknown)] = numel / known;
    }
    if (ops::checked_product(shape) != numel ||
        shape[static_cast<std::size_t>(std::max(unknown, 0))] <= 0)
      throw OpSpecError("shape",
                        "cannot reshape " + ops::shape_text(in) + " (" + std::to_string(numel) +
                            " values per sample) into " + ops::shape_text(node.shape),
                        "the shapes must hold the same number of values");
    return view_or_permute(node, "reshape", std::move(shape));
  };
  return op;
}

}  // namespace mixtrain::core
