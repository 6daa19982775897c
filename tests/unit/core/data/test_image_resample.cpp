// Properties of the image transforms (data/image_folder/image_resample.h) and of
// RandomResizedCrop's box (random_resized_crop.h) that hold without a reference: identity,
// constants, mirroring, argument checks, torchvision's resized sizes, and the box's bounds,
// determinism, fallback and distribution. Agreement with torchvision to the bit is
// test_image_transforms_parity.cpp's.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "data/image_folder/image_resample.h"
#include "data/image_folder/random_resized_crop.h"
#include "data/portable_math.h"

namespace mixtrain::test {
namespace {

using core::PixelBox;
using core::RgbImage;

RgbImage noise_image(std::int64_t height, std::int64_t width, unsigned seed) {
  RgbImage img{width, height,
               std::vector<std::uint8_t>(static_cast<std::size_t>(height * width * 3))};
  std::mt19937 gen(seed);
  for (auto& v : img.pixels) v = static_cast<std::uint8_t>(gen());
  return img;
}

std::vector<std::uint8_t> planar(const RgbImage& img, PixelBox box) {
  std::vector<std::uint8_t> out;
  for (int c = 0; c < 3; ++c)
    for (std::int64_t y = box.top; y < box.top + box.height; ++y)
      for (std::int64_t x = box.left; x < box.left + box.width; ++x)
        out.push_back(img.pixels[static_cast<std::size_t>((y * img.width + x) * 3 + c)]);
  return out;
}

std::vector<std::uint8_t> crop(const RgbImage& img, PixelBox box, std::int64_t h, std::int64_t w,
                               bool mirror = false) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(3 * h * w));
  core::resized_crop(img, box, h, w, mirror, out.data());
  return out;
}

TEST(ImageResample, SameSizeIsTheCropItself) {
  const RgbImage img = noise_image(17, 23, 1);
  const PixelBox whole{0, 0, 17, 23}, part{3, 5, 9, 11};
  EXPECT_EQ(crop(img, whole, 17, 23), planar(img, whole));
  EXPECT_EQ(crop(img, part, 9, 11), planar(img, part));
}

TEST(ImageResample, ConstantStaysConstant) {
  for (std::uint8_t value :
       {std::uint8_t{0}, std::uint8_t{1}, std::uint8_t{128}, std::uint8_t{255}}) {
    RgbImage img{40, 30, std::vector<std::uint8_t>(40 * 30 * 3, value)};
    for (auto [h, w] : {std::pair{224, 224}, std::pair{7, 3}, std::pair{1, 1}, std::pair{31, 97}}) {
      const auto out = crop(img, PixelBox{2, 3, 25, 33}, h, w);
      EXPECT_EQ(out, std::vector<std::uint8_t>(out.size(), value))
          << int{value} << " " << h << "x" << w;
    }
  }
}

TEST(ImageResample, MirrorReversesEachRow) {
  const RgbImage img = noise_image(30, 41, 2);
  const PixelBox box{1, 2, 25, 37};
  const auto plain = crop(img, box, 13, 19);
  const auto mirrored = crop(img, box, 13, 19, true);
  for (int row = 0; row < 3 * 13; ++row)
    for (int x = 0; x < 19; ++x)
      ASSERT_EQ(mirrored[static_cast<std::size_t>(row * 19 + x)],
                plain[static_cast<std::size_t>(row * 19 + 18 - x)]);
}

TEST(ImageResample, BoxesOutsideTheImageAreInvalid) {
  const RgbImage img = noise_image(10, 12, 3);
  std::vector<std::uint8_t> out(3 * 4 * 4);
  for (const PixelBox box :
       {PixelBox{-1, 0, 5, 5}, PixelBox{0, -1, 5, 5}, PixelBox{6, 0, 5, 5}, PixelBox{0, 8, 5, 5},
        PixelBox{0, 0, 0, 5}, PixelBox{0, 0, 5, 0}, PixelBox{0, 0, 11, 12}})
    EXPECT_THROW(core::resized_crop(img, box, 4, 4, false, out.data()), std::invalid_argument);
  EXPECT_THROW(core::resized_crop(img, PixelBox{0, 0, 5, 5}, 0, 4, false, out.data()),
               std::invalid_argument);
  EXPECT_THROW(core::resize_then_center_crop(img, 8, 4, 0, false, out.data()),
               std::invalid_argument);
  EXPECT_THROW((void)core::resized_size(10, 12, 0), std::invalid_argument);
}

TEST(ImageResample, ResizedSizeIsTorchvisions) {
  using P = std::pair<std::int64_t, std::int64_t>;
  EXPECT_EQ(core::resized_size(375, 500, 256), (P{256, 341}));  // 341.33 truncated
  EXPECT_EQ(core::resized_size(500, 375, 256), (P{341, 256}));
  EXPECT_EQ(core::resized_size(100, 100, 256), (P{256, 256}));
  EXPECT_EQ(core::resized_size(333, 517, 224), (P{224, 347}));  // 347.77 truncated
  EXPECT_EQ(core::resized_size(3, 7, 2), (P{2, 4}));
  EXPECT_EQ(core::resized_size(1, 1000, 5), (P{5, 5000}));
  EXPECT_EQ(core::resized_size(256, 400, 256), (P{256, 400}));
}

// Resized smaller than the crop: torchvision pads with 0, (crop − size) // 2 before.
TEST(ImageResample, CenterCropPadsSmallImagesWithZeros) {
  RgbImage img{4, 4, std::vector<std::uint8_t>(4 * 4 * 3, 200)};
  std::vector<std::uint8_t> out(3 * 7 * 6);
  core::resize_then_center_crop(img, 4, 7, 6, false, out.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 7; ++y)
      for (int x = 0; x < 6; ++x) {
        const bool inside = y >= 1 && y < 5 && x >= 1 && x < 5;
        EXPECT_EQ(out[static_cast<std::size_t>((c * 7 + y) * 6 + x)], inside ? 200 : 0)
            << c << " " << y << " " << x;
      }
}

TEST(PortableMath, LogAndExpAreAccurate) {
  for (double x : {1e-300, 1e-9, 0.1, 0.75, 1.0, 4.0 / 3.0, 2.0, 1234.5, 1e300}) {
    EXPECT_NEAR(core::portable_log(x), std::log(x), 4e-16 * std::max(1.0, std::fabs(std::log(x))))
        << x;
  }
  for (double x : {-700.0, -20.0, -1.0, -0.2876820724517809, 0.0, 1e-10, 0.5, 1.0, 3.0, 700.0})
    EXPECT_NEAR(core::portable_exp(x), std::exp(x), 4e-16 * std::exp(x)) << x;
}

TEST(RandomResizedCropBox, InsideTheImageAndDeterministic) {
  const core::RandomResizedCropSpec spec;
  for (auto [h, w] :
       {std::pair{375, 500}, std::pair{1, 1}, std::pair{3, 500}, std::pair{517, 333}}) {
    core::DataRng a(7, 1), b(7, 1);
    for (int i = 0; i < 200; ++i) {
      const PixelBox box = core::random_resized_crop_box(h, w, spec, a);
      const PixelBox again = core::random_resized_crop_box(h, w, spec, b);
      EXPECT_EQ(box.top, again.top);
      EXPECT_EQ(box.left, again.left);
      EXPECT_EQ(box.height, again.height);
      EXPECT_EQ(box.width, again.width);
      ASSERT_GE(box.height, 1);
      ASSERT_GE(box.width, 1);
      ASSERT_GE(box.top, 0);
      ASSERT_GE(box.left, 0);
      ASSERT_LE(box.top + box.height, h);
      ASSERT_LE(box.left + box.width, w);
    }
  }
}

// No try fits a 1000 × 10 image (the narrowest box of 3:4 over 8% of it is 24 wide), so the box
// is the center crop with the ratio clamped to 3/4: 10 wide, round(10 / 0.75) = 13 high.
TEST(RandomResizedCropBox, FallsBackToTheCenterCrop) {
  core::DataRng rng(3);
  const PixelBox box = core::random_resized_crop_box(1000, 10, {}, rng);
  EXPECT_EQ(box.top, (1000 - 13) / 2);
  EXPECT_EQ(box.left, 0);
  EXPECT_EQ(box.height, 13);
  EXPECT_EQ(box.width, 10);
  const PixelBox wide = core::random_resized_crop_box(10, 1000, {}, rng);
  EXPECT_EQ(wide.height, 10);
  EXPECT_EQ(wide.width, 13);  // round(10 · 4/3)
  EXPECT_EQ(wide.left, (1000 - 13) / 2);
  // A ratio range far from the image's rounds the fallback to 0 rows; one is kept.
  const PixelBox thin = core::random_resized_crop_box(1000, 1, {0.08, 1.0, 3.0, 4.0}, rng);
  EXPECT_EQ(thin.height, 1);
  EXPECT_EQ(thin.width, 1);
}

TEST(RandomResizedCropBox, AreaAndRatioFollowTheSpec) {
  core::DataRng rng(11);
  const core::RandomResizedCropSpec spec;
  double area_sum = 0.0, log_ratio_sum = 0.0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const PixelBox box = core::random_resized_crop_box(1000, 1000, spec, rng);
    area_sum += static_cast<double>(box.height * box.width) / 1e6;
    log_ratio_sum += std::log(static_cast<double>(box.width) / static_cast<double>(box.height));
  }
  // Uniform in [0.08, 1] has mean 0.54; tries whose box does not fit (large areas away from
  // ratio 1) are redrawn, which lowers it: torchvision's get_params averages 0.478 here (2·10^5
  // draws of its algorithm in Python).
  EXPECT_NEAR(area_sum / n, 0.478, 0.015);
  EXPECT_NEAR(log_ratio_sum / n, 0.0, 0.02);
}

TEST(RandomResizedCropBox, InvalidSpecsAreRefused) {
  core::DataRng rng(1);
  for (const core::RandomResizedCropSpec spec : {core::RandomResizedCropSpec{0.0, 1.0, 0.75, 1.33},
                                                 core::RandomResizedCropSpec{0.5, 0.4, 0.75, 1.33},
                                                 core::RandomResizedCropSpec{0.08, 1.5, 0.75, 1.33},
                                                 core::RandomResizedCropSpec{0.08, 1.0, 0.0, 1.33},
                                                 core::RandomResizedCropSpec{0.08, 1.0, 2.0, 1.0}})
    EXPECT_THROW((void)core::random_resized_crop_box(10, 10, spec, rng), std::invalid_argument);
}

}  // namespace
}  // namespace mixtrain::test
