// decode_images' argument rule (ImageInputFacet, sdk/backend_image_input.h): plain C++ over the
// ByteImages and two TensorViews, whose data is never read, so the host tests check every message
// without a GPU; the facet runs it before it enqueues anything.
//
// Contract
// - check_decode_images throws sdk::BackendError "backend_cuda.decode_images: ..." naming the
//   argument (its dtype and shape for a tensor) with a hint, for: a negative rows, channels or
//   plane; a batch of more than 2^63 - 1 pixels; a table that is not fp32 (a tf32 view is fp32
//   storage) of shape [channels, 256], or has no data while it has elements; a y that is not a
//   storage float (fp32, tf32 view, bf16, fp16) with rows·channels·plane elements (any shape:
//   [rows, channels·plane] as the facet says, or [rows, channels, H, W]), or overlaps the table;
//   null pixels with rows > 0.
// - On success it returns the sizes the upload and the kernel need; bytes == 0 (no rows, no
//   channels or an empty plane) means there is nothing to copy or decode.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mixtrain/sdk/backend_image_input.h"

namespace mixtrain::backend_cuda::image_input {

struct DecodeSizes {
  std::int64_t planes =
      0;  // rows·channels planes of `plane` pixels; plane q is channel q % channels
  std::int64_t channels = 0;
  std::int64_t plane = 0;
  std::size_t bytes = 0;  // rows·channels·plane: one byte a pixel, as many elements of y
};

DecodeSizes check_decode_images(const sdk::ByteImages& images, const sdk::TensorView& table,
                                const sdk::TensorView& y);

}  // namespace mixtrain::backend_cuda::image_input
