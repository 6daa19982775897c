// RandomResizedCrop's box, drawn from a DataRng by torchvision's algorithm
// (RandomResizedCrop.get_params): up to 10 tries of an area fraction uniform in [scale_min,
// scale_max] and an aspect ratio log-uniform in [ratio_min, ratio_max], the box's sides
// round(sqrt(area · ratio)) and round(sqrt(area / ratio)) (half to even, as Python rounds); a
// try whose box fits is placed uniformly (rng.below over the free rows, then the free columns);
// when none fits, the whole image's center crop with the aspect ratio clamped into the range
// (where torchvision's rounding would give a side of 0, for ratio ranges far from the image's,
// the side is 1).
//
// Contract:
// - Draws only from `rng`, with DataRng's portable arithmetic (no libm: the logarithm and the
//   exponential are data/portable_math.h's), so a box is the same on every machine for the same
//   generator state. The distribution is torchvision's; the draws are not torch's generator's.
// - The box lies inside the image, at least 1×1. height, width in [1, kMaxImageSide]
//   (std::invalid_argument otherwise).
// - A spec with scale_min <= 0, scale_min > scale_max, scale_max > 1, ratio_min <= 0 or
//   ratio_min > ratio_max is std::invalid_argument (the config reader refuses it first).
#pragma once

#include <cstdint>

#include "data/image_folder/image_resample.h"
#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core {

struct RandomResizedCropSpec {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};

PixelBox random_resized_crop_box(std::int64_t height, std::int64_t width,
                                 const RandomResizedCropSpec& spec, DataRng& rng);

}  // namespace mixtrain::core
