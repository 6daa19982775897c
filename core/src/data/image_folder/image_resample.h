// torchvision's image transforms on 8-bit RGB, bit for bit: resized_crop (RandomResizedCrop's
// second half) and resize-then-center-crop (the usual evaluation transform, Resize(s) then
// CenterCrop). Resampling is PIL's bilinear filter as Image.resize(size, BILINEAR) computes it
// for 8-bit images (torchvision 0.14 resizes PIL images with it): a separable triangle filter
// whose support widens by the scale when shrinking (antialiased), coefficients normalised per
// output pixel and rounded to fixed point, the horizontal pass first into an 8-bit intermediate,
// then the vertical. No library offers PIL's exact arithmetic, and without it a model trained
// here would see other pixels than torchvision's (docs/architecture.md, "Image folders").
//
// Contract:
// - `out` receives channels-first [3, out_height, out_width] uint8 (the byte-image form of
//   core/data/dataset.h), R plane first.
// - out_height, out_width >= 1; a box must lie inside the image and be at least 1×1
//   (std::invalid_argument otherwise: the callers compute boxes).
// - Pure functions, thread-safe.
#pragma once

#include <cstdint>

#include "data/image_folder/image_file.h"

namespace mixtrain::core {

// Rows [top, top + height), columns [left, left + width) of an image.
struct PixelBox {
  std::int64_t top = 0, left = 0, height = 0, width = 0;
};

// torchvision.transforms.functional.resized_crop(img, top, left, height, width,
// [out_height, out_width], BILINEAR): the box cropped, then resized; mirrored left-right after
// when `mirror` (RandomHorizontalFlip applied to the result).
void resized_crop(const RgbImage& src, PixelBox box, std::int64_t out_height,
                  std::int64_t out_width, bool mirror, std::uint8_t* out);

// The size torchvision's Resize(shorter_side) gives an image of height × width: the shorter
// side becomes shorter_side, the longer int(shorter_side · longer / shorter) (truncated, as
// torchvision computes it in Python floats). {height, width}. Sides and shorter_side must be
// in [1, kMaxImageSide] (std::invalid_argument otherwise).
std::pair<std::int64_t, std::int64_t> resized_size(std::int64_t height, std::int64_t width,
                                                   std::int64_t shorter_side);

// Resize(shorter_side) then CenterCrop([out_height, out_width]), as torchvision composes them:
// the crop's top is int(round((resized_height − out_height) / 2.0)) with Python's round (half to
// even), likewise its left; where the resized image is smaller than the crop, the missing
// pixels are 0, as torchvision pads before cropping. `mirror` as above.
void resize_then_center_crop(const RgbImage& src, std::int64_t shorter_side,
                             std::int64_t out_height, std::int64_t out_width, bool mirror,
                             std::uint8_t* out);

}  // namespace mixtrain::core
