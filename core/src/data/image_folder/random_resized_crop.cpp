#include "data/image_folder/random_resized_crop.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "data/portable_math.h"

// Bit-identical boxes need a*b+c rounded twice everywhere (see data/portable_math.cpp).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace mixtrain::core {

PixelBox random_resized_crop_box(std::int64_t height, std::int64_t width,
                                 const RandomResizedCropSpec& spec, DataRng& rng) {
  if (height < 1 || width < 1 || height > kMaxImageSide || width > kMaxImageSide)
    throw std::invalid_argument("random_resized_crop_box: image " + std::to_string(height) + "x" +
                                std::to_string(width) + " is out of range");
  // Written so that NaN fails every check.
  if (!(spec.scale_min > 0.0 && spec.scale_min <= spec.scale_max && spec.scale_max <= 1.0 &&
        spec.ratio_min > 0.0 && spec.ratio_min <= spec.ratio_max && std::isfinite(spec.ratio_max)))
    throw std::invalid_argument(
        "random_resized_crop_box: scale [" + std::to_string(spec.scale_min) + ", " +
        std::to_string(spec.scale_max) + "] must lie in (0, 1] and ratio [" +
        std::to_string(spec.ratio_min) + ", " + std::to_string(spec.ratio_max) +
        "] be positive, each minimum at most its maximum");
  const double area = static_cast<double>(height * width);
  const double log_ratio_min = portable_log(spec.ratio_min);
  const double log_ratio_max = portable_log(spec.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area =
        area * (spec.scale_min + (spec.scale_max - spec.scale_min) * rng.uniform());
    const double aspect_ratio =
        portable_exp(log_ratio_min + (log_ratio_max - log_ratio_min) * rng.uniform());
    // sqrt is correctly rounded (IEEE), and nearbyint is Python's half-to-even round.
    const double w = std::nearbyint(std::sqrt(target_area * aspect_ratio));
    const double h = std::nearbyint(std::sqrt(target_area / aspect_ratio));
    if (w > 0.0 && w <= static_cast<double>(width) && h > 0.0 && h <= static_cast<double>(height)) {
      const auto box_w = static_cast<std::int64_t>(w), box_h = static_cast<std::int64_t>(h);
      const auto top =
          static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(height - box_h + 1)));
      const auto left =
          static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(width - box_w + 1)));
      return {top, left, box_h, box_w};
    }
  }
  // torchvision's fallback: the whole image, its aspect ratio clamped into the range. Its box can
  // round to 0 rows or columns for ratios far beyond the image's; at least one is kept.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  std::int64_t box_w = width, box_h = height;
  if (in_ratio < spec.ratio_min) {
    box_h = static_cast<std::int64_t>(std::nearbyint(static_cast<double>(width) / spec.ratio_min));
  } else if (in_ratio > spec.ratio_max) {
    box_w = static_cast<std::int64_t>(std::nearbyint(static_cast<double>(height) * spec.ratio_max));
  }
  box_h = std::clamp<std::int64_t>(box_h, 1, height);
  box_w = std::clamp<std::int64_t>(box_w, 1, width);
  return {(height - box_h) / 2, (width - box_w) / 2, box_h, box_w};
}

}  // namespace mixtrain::core
