// Image files for the image-folder tests, written with the encoders (libjpeg's, libpng) rather
// than the decoders under test: a JPEG or PNG of a given size whose pixels follow a fixed pattern
// of (x, y, seed), so that two images differ and a crop's position shows in its pixels.
#pragma once

#include <png.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "jpeg_test_writer.h"

namespace mixtrain::test {

// [height, width, 3] RGB: smooth ramps plus a seed-dependent offset.
inline std::vector<unsigned char> pattern_rgb(int width, int height, int seed) {
  std::vector<unsigned char> rgb(static_cast<std::size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      unsigned char* p = rgb.data() + (static_cast<std::size_t>(y) * width + x) * 3;
      p[0] = static_cast<unsigned char>((x * 255) / std::max(1, width - 1));
      p[1] = static_cast<unsigned char>((y * 255) / std::max(1, height - 1));
      p[2] = static_cast<unsigned char>((x + 2 * y + 37 * seed) % 256);
    }
  return rgb;
}

// A baseline JPEG (4:4:4, quality 95) of pattern_rgb(width, height, seed).
inline void write_jpeg(const std::filesystem::path& path, int width, int height, int seed) {
  const auto rgb = pattern_rgb(width, height, seed);
  const auto jpeg = jpeg_bytes(rgb.data(), width, height, JpegPixels::rgb, JpegSampling::s444, 95);
  ASSERT_FALSE(jpeg.empty());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
  ASSERT_TRUE(out.good()) << path;
}

// An 8-bit RGB PNG of pattern_rgb(width, height, seed).
inline void write_png(const std::filesystem::path& path, int width, int height, int seed) {
  const auto rgb = pattern_rgb(width, height, seed);
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGB;
  ASSERT_NE(png_image_write_to_file(&image, path.c_str(), 0, rgb.data(), 0, nullptr), 0)
      << image.message;
}

}  // namespace mixtrain::test
