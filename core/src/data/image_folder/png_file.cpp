#include "data/image_folder/png_file.h"

#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace mixtrain::core::image_files {
namespace {

// libpng reports errors by longjmp. Every function that calls setjmp below holds only trivially
// destructible locals and calls no C++ code that could own resources across the jump; the C++
// state (buffers, the png_struct's owner) lives in the callers.
struct PngJob {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0, offset = 0;
  char message[256] = {};
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, channels = 0;
  std::size_t row_bytes = 0;
  png_color palette[256] = {};
};

void png_error_to_job(png_structp png, png_const_charp message) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->message, sizeof job->message, "%s", message != nullptr ? message : "error");
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

void png_read_from_job(png_structp png, png_bytep out, png_size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (n > job->size - job->offset) png_error(png, "the file ends inside the image data");
  std::memcpy(out, job->data + job->offset, n);
  job->offset += n;
}

// Reads the header and sets the transformations to 8-bit gray, gray+alpha, RGB or RGBA
// (16-bit gray stays 16-bit: PIL clips it rather than scaling). False with job->message set on
// an error.
bool png_start(png_structp png, png_infop info, PngJob* job) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, job, png_read_from_job);
  // PIL checks every chunk's CRC before the image data; a damaged ancillary chunk is refused too.
  png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
  png_read_info(png, info);
  job->width = png_get_image_width(png, info);
  job->height = png_get_image_height(png, info);
  job->bit_depth = png_get_bit_depth(png, info);
  job->color_type = png_get_color_type(png, info);
  const bool gray = (job->color_type & PNG_COLOR_MASK_COLOR) == 0;
  if (job->color_type == PNG_COLOR_TYPE_PALETTE) {
    // Indices past a short palette are gray (i, i, i) in PIL, whose palettes start as the gray
    // ramp; libpng would give black. The palette is completed to the bit depth's size.
    png_colorp given = nullptr;
    int count = 0;
    const int full = 1 << job->bit_depth;
    if (png_get_PLTE(png, info, &given, &count) != 0 && count < full) {
      for (int i = 0; i < full; ++i) {
        const auto gray = static_cast<png_byte>(i);
        job->palette[i] = i < count ? given[i] : png_color{gray, gray, gray};
      }
      png_set_PLTE(png, info, job->palette, full);
    }
    png_set_palette_to_rgb(png);
  }
  // PIL scales 1-, 2- and 4-bit gray to 0..255 (×255, ×85, ×17), as libpng's expansion does.
  if (gray && job->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  // PIL keeps the high byte of 16-bit samples (its "RGB;16B" unpackers); strip_16 does the
  // same, where scale_16 would round. 16-bit gray alone opens in PIL's 32-bit mode "I".
  if (job->bit_depth == 16 && job->color_type != PNG_COLOR_TYPE_GRAY) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  job->channels = png_get_channels(png, info);
  job->row_bytes = png_get_rowbytes(png, info);
  return true;
}

// The rows of the whole image. png_read_end is not called: PIL reads no further than the image
// data either, so a file cut after its last IDAT still opens in both.
bool png_rows(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  return true;
}

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;
  explicit PngReader(PngJob* job) {
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, job, png_error_to_job, png_ignore_warning);
    if (png != nullptr) info = png_create_info_struct(png);
    if (png == nullptr || info == nullptr) throw std::bad_alloc();
  }
  ~PngReader() { png_destroy_read_struct(&png, &info, nullptr); }
};

}  // namespace

RgbImage decode_png(std::span<const std::uint8_t> bytes, std::string_view origin) {
  PngJob job;
  job.data = bytes.data();
  job.size = bytes.size();
  PngReader reader(&job);
  auto fail_png = [&](const char* when) {
    const bool truncated = std::strstr(job.message, "ends inside") != nullptr ||
                           std::strstr(job.message, "Not enough image data") != nullptr;
    fail(origin,
         std::string(truncated ? "is truncated" : "is not a readable PNG") + " (" + when + ": " +
             job.message + ")",
         kRewriteHint);
  };
  // The size is checked after libpng has read the header and before any image row exists
  // (libpng itself holds no more than a row until then).
  if (!png_start(reader.png, reader.info, &job)) fail_png("header");
  check_size(origin, job.width, job.height);
  const auto width = static_cast<std::size_t>(job.width);
  const auto height = static_cast<std::size_t>(job.height);
  const int bytes_per_sample = job.bit_depth == 16 && job.color_type == PNG_COLOR_TYPE_GRAY ? 2 : 1;
  if (job.channels < 1 || job.channels > 4 ||
      job.row_bytes != width * static_cast<std::size_t>(job.channels * bytes_per_sample))
    fail(origin,
         "is a PNG of an unexpected layout (" + std::to_string(job.channels) + " channels, " +
             std::to_string(job.row_bytes) + " bytes a row)",
         kReplaceHint);

  std::vector<std::uint8_t> raw(job.row_bytes * height);
  std::vector<png_bytep> rows(height);
  for (std::size_t y = 0; y < height; ++y) rows[y] = raw.data() + y * job.row_bytes;
  if (!png_rows(reader.png, rows.data())) fail_png("image data");

  RgbImage image;
  image.width = static_cast<std::int64_t>(width);
  image.height = static_cast<std::int64_t>(height);
  const std::size_t pixels = width * height;
  image.pixels.resize(pixels * 3);
  std::uint8_t* out = image.pixels.data();
  const std::uint8_t* in = raw.data();
  if (bytes_per_sample == 2) {
    // PIL's "I" to "RGB" clips to 0..255 instead of scaling: only values below 256 survive.
    for (std::size_t i = 0; i < pixels; ++i, in += 2, out += 3) {
      const unsigned v = (unsigned{in[0]} << 8) | in[1];
      std::fill_n(out, 3, static_cast<std::uint8_t>(std::min(v, 255u)));
    }
    return image;
  }
  // Alpha is dropped, not composited, as convert("RGB") drops it.
  switch (job.channels) {
    case 1:
    case 2:
      for (std::size_t i = 0; i < pixels; ++i, in += job.channels, out += 3)
        std::fill_n(out, 3, in[0]);
      break;
    default:
      for (std::size_t i = 0; i < pixels; ++i, in += job.channels, out += 3)
        std::memcpy(out, in, 3);
      break;
  }
  return image;
}

// IHDR: length 13, "IHDR", width, height, bit depth, color type, compression, filter,
// interlace, CRC.
ImageHeader read_png_header(ImageFileStream& in) {
  std::uint8_t b[33];
  in.read_exact(b, sizeof b, "PNG header");
  auto be32 = [](const std::uint8_t* p) {
    return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
           p[3];
  };
  if (be32(b + 8) != 13 || std::memcmp(b + 12, "IHDR", 4) != 0)
    fail(in.name(), "is not a valid PNG: no IHDR chunk after the signature", kRewriteHint);
  if (crc32(crc32(0, nullptr, 0), b + 12, 17) != be32(b + 29))
    fail(in.name(), "is not a valid PNG: IHDR CRC error", kRewriteHint);
  const std::int64_t width = be32(b + 16), height = be32(b + 20);
  const int depth = b[24], color = b[25];
  const bool valid =
      (color == 0 && (depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16)) ||
      (color == 3 && (depth == 1 || depth == 2 || depth == 4 || depth == 8)) ||
      ((color == 2 || color == 4 || color == 6) && (depth == 8 || depth == 16));
  if (!valid || b[26] != 0 || b[27] != 0 || b[28] > 1)
    fail(in.name(),
         "is not a valid PNG: bit depth " + std::to_string(depth) + ", color type " +
             std::to_string(color) + " or its methods are invalid",
         kRewriteHint);
  check_size(in.name(), width, height);
  // The chunks up to the image data (palette, transparency, profiles, text), skipped by their
  // lengths: a file that ends before its image data, or holds none, is refused by a header
  // check, as PIL refuses to open it, rather than when its batch is drawn.
  for (;;) {
    std::uint8_t chunk[8];
    in.read_exact(chunk, sizeof chunk, "PNG chunks before the image data");
    const std::uint32_t length = be32(chunk);
    if (length > 0x7fffffffu)
      fail(in.name(), "is not a valid PNG: a chunk of " + std::to_string(length) + " bytes",
           kRewriteHint);
    if (std::memcmp(chunk + 4, "IDAT", 4) == 0) break;
    if (std::memcmp(chunk + 4, "IEND", 4) == 0)
      fail(in.name(), "is not a valid PNG: it ends before any image data", kRewriteHint);
    in.skip(std::uint64_t{length} + 4, "PNG chunks before the image data");  // data and CRC
  }
  return {ImageFormat::png, width, height};
}

}  // namespace mixtrain::core::image_files
