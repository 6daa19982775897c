#include "ops/view.h"

#include <algorithm>

#include "ops/op_registry.h"
#include "ops/op_support.h"

namespace mixtrain::core {

ViewLayer::ViewLayer(std::string name, std::string type, std::int64_t in, std::int64_t out)
    : Layer(std::move(name), std::move(type), in, out) {}

// --- Definitions ---------------------------------------------------------------------------------

OpDefinition flatten_op() {
  OpDefinition op;
  op.type = "flatten";
  op.summary = "view of the input as one dimension per sample";
  op.build = [](const OpNode& node) {
    const auto& in = node.inputs;
    const std::int64_t numel = ops::checked_product(in[0]);
    return BuiltOp{std::make_unique<ViewLayer>(node.name, "flatten", in[0].back(), numel),
                   PerSampleShape{numel}};
  };
  return op;
}

OpDefinition reshape_op() {
  OpDefinition op;
  op.type = "reshape";
  op.summary = "view of the input with another per-sample shape (one size may be -1)";
  op.takes_shape = true;
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
    return BuiltOp{std::make_unique<ViewLayer>(node.name, "reshape", in.back(), shape.back()),
                   shape};
  };
  return op;
}

}  // namespace mixtrain::core
