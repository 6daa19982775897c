// How an image op (conv2d, batchnorm2d, pooling) reads its input, and the workspace that grows
// with its batch. The input: a channels-last image as it is,
// or a plain [C, H, W] one (the batch of an image data source) permuted once into a scratch.
//
// Contract
// - configure() once at build time; the scratch grows on first use to the largest batch seen.
// - forward() returns the channels-last view of x [N, H, W, C] in `dtype` (the permute rounds
//   once when x's dtype differs); x itself when it already is channels-last and in `dtype`, else a
//   cast. The view stays valid until the next forward() (backward reads it again).
// - grad_target(dx) is where an op writes its input gradient: dx itself for a channels-last input,
//   else a scratch that finish_grad(dx) permutes into the plain dx.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/graph/tensor.h"

namespace mixtrain::core {

class ChannelsLastInput {
 public:
  void configure(bool plain, std::int64_t channels, std::int64_t height, std::int64_t width) {
    plain_ = plain;
    c_ = channels;
    h_ = height;
    w_ = width;
  }
  bool plain() const { return plain_; }

  sdk::TensorView forward(const std::shared_ptr<sdk::DeviceBackend>& backend,
                          const BoundFacets& facets, sdk::TensorView x, std::int64_t batch,
                          sdk::DType dtype) {
    const sdk::Shape shape{batch, h_, w_, c_};
    if (!plain_ && x.dtype == dtype) return {x.data, dtype, shape};
    const sdk::TensorView dst = grow(backend, fwd_, dtype, shape);
    if (plain_)
      facets.call(sdk::ConvolutionOp::to_channels_last)->to_channels_last(x, c_, h_, w_, dst);
    else
      backend->cast({x.data, x.dtype, shape}, dst);
    return dst;
  }
  sdk::TensorView grad_target(const std::shared_ptr<sdk::DeviceBackend>& backend,
                              sdk::TensorView dx, std::int64_t batch) {
    const sdk::Shape shape{batch, h_, w_, c_};
    if (!plain_) return {dx.data, dx.dtype, shape};
    return grow(backend, bwd_, dx.dtype, shape);
  }
  void finish_grad(const BoundFacets& facets, sdk::TensorView target, sdk::TensorView dx) {
    if (plain_)
      facets.call(sdk::ConvolutionOp::to_channels_first)->to_channels_first(target, c_, h_, w_, dx);
  }

 private:
  static sdk::TensorView grow(const std::shared_ptr<sdk::DeviceBackend>& backend, Tensor& t,
                              sdk::DType dtype, const sdk::Shape& shape) {
    if (t.empty() || t.dtype() != dtype || t.shape().numel() < shape.numel()) {
      // The old contents are dead (every caller writes the whole view): freed first, or the step
      // that grows it (an evaluation batch larger than the step's) would peak holding both, past
      // what `check` rehearses.
      t = Tensor();
      t = Tensor(backend, dtype, sdk::Shape{shape.numel()});
    }
    return {t.view().data, dtype, shape};
  }
  bool plain_ = false;
  std::int64_t c_ = 1, h_ = 1, w_ = 1;
  Tensor fwd_, bwd_;
};

// A backend workspace of a layer (batch norm's ReLU data, max pooling's argmax): allocated once
// for the largest batch and passed whole to every call, since a backend never asks for more for
// fewer images (the backend checks it gets at least what it asked for).
class BatchWorkspace {
 public:
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::size_t bytes) {
    tensor_ = Tensor();
    if (bytes == 0) return;
    tensor_ =
        Tensor(backend, sdk::DType::fp32, sdk::Shape{static_cast<std::int64_t>((bytes + 3) / 4)});
  }
  // Empty when the backend needs none.
  sdk::TensorView view() const { return tensor_.empty() ? sdk::TensorView{} : tensor_.view(); }

 private:
  Tensor tensor_;
};

}  // namespace mixtrain::core
