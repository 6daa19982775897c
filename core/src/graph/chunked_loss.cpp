// The chunked loss: see chunked_loss.h for the contract.
#include "mixtrain/core/graph/chunked_loss.h"

#include <algorithm>
#include <stdexcept>

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {

// Rows [first, first + rows) of a [R, C] view.
TensorView row_block(const TensorView& v, std::int64_t first, std::int64_t rows) {
  const std::int64_t cols = v.shape.cols();
  return {static_cast<std::byte*>(v.data) +
              static_cast<std::size_t>(first * cols) * sdk::dtype_size(v.dtype),
          v.dtype, sdk::Shape{rows, cols}};
}

// Element i of a 1-D view, as a [1] view.
TensorView element(const TensorView& v, std::int64_t i) {
  return {static_cast<std::byte*>(v.data) + static_cast<std::size_t>(i) * sdk::dtype_size(v.dtype),
          v.dtype, sdk::Shape{1}};
}

}  // namespace

std::int64_t compute_loss_in_blocks(Layer& head, sdk::DeviceBackend& backend,
                                    const BoundFacets& facets, const LossBlockMemory& blocks,
                                    const LossBlockPass& pass, TensorView loss,
                                    const LossBlockVisitor& visit) {
  // x is [R, in]; z and dz are one block [b, classes]; labels [R].
  const std::int64_t total = pass.x.shape.rows();
  const std::int64_t classes = blocks.logits.shape.cols();
  const auto labels = [&](std::int64_t first, std::int64_t rows) {
    return TensorView{static_cast<std::int32_t*>(pass.labels.data) + first, DType::int32,
                      sdk::Shape{rows}};
  };
  if (pass.label_smoothing != 0.0f && classes != head.out_features())
    throw std::logic_error("compute_loss_in_blocks: padded classes with label smoothing");
  head.begin_loss_blocks();
  std::int64_t count = 0;
  for (std::int64_t first = 0; first < total; first += blocks.rows, ++count) {
    const std::int64_t rows = std::min(blocks.rows, total - first);
    const TensorView x = row_block(pass.x, first, rows);
    const TensorView z{blocks.logits.data, blocks.logits.dtype, sdk::Shape{rows, classes}};
    head.forward_rows(x, z);
    if (visit && !visit(LossBlockPart::logits, first, z)) {
      head.end_loss_blocks();
      return count + 1;
    }
    const float share = static_cast<float>(rows) / static_cast<float>(total);
    TensorView dz;
    if (pass.with_grad)
      dz = {blocks.logits_grad.data, blocks.logits_grad.dtype, sdk::Shape{rows, classes}};
    facets.call(sdk::LossOp::softmax_cross_entropy)
        ->softmax_cross_entropy(z, labels(first, rows), pass.grad_scale * share,
                                pass.label_smoothing, element(blocks.loss_parts, count),
                                element(blocks.correct_parts, count), dz);
    if (!pass.with_grad) continue;
    if (visit && !visit(LossBlockPart::logits_grad, first, dz)) {
      head.end_loss_blocks();
      return count + 1;
    }
    const TensorView dx = pass.dx.empty() ? TensorView{} : row_block(pass.dx, first, rows);
    head.backward(x, dz, dx, rows);
  }
  head.end_loss_blocks();
  // The mean over all rows: each block's mean weighted by its share, in block order.
  backend.fill(loss, 0.0f);
  for (std::int64_t b = 0; b < count; ++b) {
    const std::int64_t rows = std::min(blocks.rows, total - b * blocks.rows);
    facets.call(sdk::ActivationOp::axpy)
        ->axpy(static_cast<float>(rows) / static_cast<float>(total), element(blocks.loss_parts, b),
               loss);
  }
  return count;
}

}  // namespace mixtrain::core
