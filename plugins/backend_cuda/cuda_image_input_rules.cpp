// decode_images' argument rule (contract in the header).
#include "cuda_image_input_rules.h"

#include <string>

#include "cuda_access.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"

namespace mixtrain::backend_cuda::image_input {

namespace {

constexpr const char* kOp = "decode_images";

void non_negative(const char* name, std::int64_t value) {
  if (value < 0)
    fail(kOp, std::string("images.") + name + " = " + std::to_string(value) + " is negative",
         "describe the batch as rows images of channels planes of plane pixels, each >= 0");
}

}  // namespace

DecodeSizes check_decode_images(const sdk::ByteImages& images, const sdk::TensorView& table,
                                const sdk::TensorView& y) {
  non_negative("rows", images.rows);
  non_negative("channels", images.channels);
  non_negative("plane", images.plane);
  const std::int64_t pixels = checks().checked_product(
      kOp, "the batch (rows·channels·plane pixels)", {images.rows, images.channels, images.plane});

  if (!sdk::is_fp32_storage(table.dtype) || table.shape.rank != 2 ||
      table.shape[0] != images.channels || table.shape[1] != 256)
    fail(kOp,
         "table is " + describe(table) + " but must be fp32 [" + std::to_string(images.channels) +
             ", 256]: one row of 256 values per channel",
         "pass the decode table as fp32 [channels, 256] (entry [c, b] is what byte b of channel c "
         "stands for)");
  require_present(kOp, "table", table);

  require_storage(kOp, "y", y);
  if (y.numel() != pixels)
    fail(kOp,
         "y is " + describe(y) + " (" + std::to_string(y.numel()) +
             " elements) but the batch has rows·channels·plane = " + std::to_string(images.rows) +
             "·" + std::to_string(images.channels) + "·" + std::to_string(images.plane) + " = " +
             std::to_string(pixels) + " pixels",
         "allocate y as [rows, channels·plane], one element per pixel");
  checks().require_disjoint(kOp, "y", y, "table", table);

  if (images.pixels == nullptr && images.rows > 0)
    fail(kOp, "images.pixels is null but images.rows = " + std::to_string(images.rows),
         "point pixels at the batch's rows·channels·plane bytes in host memory");

  DecodeSizes sizes;
  sizes.planes = images.rows * images.channels;
  sizes.channels = images.channels;
  sizes.plane = images.plane;
  sizes.bytes = static_cast<std::size_t>(pixels);
  return sizes;
}

}  // namespace mixtrain::backend_cuda::image_input
