// Image files read into 8-bit RGB: JPEG through libjpeg-turbo's libjpeg API, PNG through
// libpng. The pixels are what torchvision's ImageFolder loader gives
// (PIL.Image.open(f).convert("RGB")), so a crop of them can match torchvision's transforms bit for
// bit (data/image_folder/image_resample.h).
//
// Contract:
// - RgbImage is row-major [height, width, 3] uint8, R then G then B; it owns its pixels.
// - JPEG: baseline and progressive, any chroma subsampling, decoded with the accurate integer
//   IDCT and fancy upsampling (libjpeg's defaults, as PIL decodes); gray replicated to R = G = B;
//   CMYK and YCCK converted as PIL converts CMYK to RGB.
// - PNG: 1-16 bits, gray, gray + alpha, RGB, RGBA, palette (transparency included): alpha is
//   dropped, not composited (as convert("RGB") drops it); 16-bit samples become 8-bit as PIL
//   makes them.
// - Anything else is an sdk::DataError naming the file (or `origin`): missing or unreadable,
//   neither format's magic bytes, truncated or corrupt data, a side of 0, or more than
//   kMaxImageSide pixels on a side or kMaxImagePixels in all (no file may make the loader
//   allocate gigabytes; the size is checked from the header, before the pixels are allocated),
//   or a file over 1 GiB. The hint says what to do (convert the file, or remove it).
// - Damage is judged as PIL judges it where the two can differ: a JPEG whose data end before
//   libjpeg has decoded its last row is refused (PIL: "image file is truncated"), and so is one
//   on which libjpeg stops with an error, whatever it warned of before; libjpeg's other warnings
//   (extraneous bytes, corrupt data it can resynchronise from) leave the image accepted as PIL
//   accepts it; a PNG cut after its image data (no IEND) opens. Stricter than PIL: a PNG chunk
//   with a bad CRC is refused, IDAT's included (PIL does not check IDAT's CRC).
// - Functions are thread-safe: the loader decodes a batch on several threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

namespace mixtrain::core {

inline constexpr std::int64_t kMaxImageSide = 32768;
// PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS, 2^30 / 4 / 3), twice over: where PIL,
// and so torchvision, refuses an image, so does the loader.
inline constexpr std::int64_t kMaxImagePixels = 2 * ((std::int64_t{1} << 30) / 4 / 3);

enum class ImageFormat { jpeg, png };

struct ImageHeader {
  ImageFormat format = ImageFormat::jpeg;
  std::int64_t width = 0, height = 0;
};

struct RgbImage {
  std::int64_t width = 0, height = 0;
  std::vector<std::uint8_t> pixels;  // [height, width, 3]
};

// The format and size from the file's header (a few kilobytes read, larger segments skipped),
// with the same checks of magic, size limits and header validity as decoding makes, and the
// segments up to the image data walked by their lengths (a JPEG's to its first scan, a PNG's to
// its first IDAT): a file that ends before its image data is refused here, as PIL refuses to open
// it. The image data are not checked. Whatever decode_image accepts, this accepts.
ImageHeader read_image_header(const std::filesystem::path& file);

RgbImage decode_image(const std::filesystem::path& file);
// The same from bytes already in memory; `origin` names them in errors.
RgbImage decode_image(std::span<const std::uint8_t> bytes, std::string_view origin);

}  // namespace mixtrain::core
