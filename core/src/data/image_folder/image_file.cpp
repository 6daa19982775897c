#include "data/image_folder/image_file.h"

#include <algorithm>
#include <array>
#include <string>

#include "data/image_folder/image_file_reading.h"
#include "data/image_folder/jpeg_file.h"
#include "data/image_folder/png_file.h"

namespace mixtrain::core {
namespace {

using namespace image_files;
namespace fs = std::filesystem;

constexpr std::array<std::uint8_t, 8> kPngMagic = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

std::string hex_bytes(const std::uint8_t* p, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += ' ';
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

bool is_jpeg(const std::uint8_t* p, std::size_t n) {
  return n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff;
}

bool is_png(const std::uint8_t* p, std::size_t n) {
  return n >= kPngMagic.size() && std::equal(kPngMagic.begin(), kPngMagic.end(), p);
}

[[noreturn]] void fail_unknown_format(std::string_view origin, const std::uint8_t* p,
                                      std::size_t n) {
  if (n == 0) fail(origin, "is empty", kRewriteHint);
  // macOS writes "._name" beside a file copied to a foreign disk: its metadata, not an image.
  static constexpr std::uint8_t kAppleDouble[4] = {0x00, 0x05, 0x16, 0x07};
  if (n >= 4 && std::equal(kAppleDouble, kAppleDouble + 4, p))
    fail(origin,
         "is a macOS AppleDouble file (the metadata macOS writes beside a copied file as "
         "\"._name\"), not an image",
         "delete them: find FOLDER -name '._*' -delete");
  fail(origin,
       "is neither a JPEG nor a PNG (it starts with bytes " +
           hex_bytes(p, std::min<std::size_t>(n, 8)) + ")",
       kReplaceHint);
}

}  // namespace

ImageHeader read_image_header(const fs::path& file) {
  ImageFileStream in(file);
  std::uint8_t magic[8] = {};
  const std::size_t n = in.read_some(magic, sizeof magic);
  if (is_png(magic, n) || is_jpeg(magic, n)) {
    in.rewind();
    if (is_png(magic, n)) return read_png_header(in);
    const JpegFrame frame = read_jpeg_frame(in);
    read_to_jpeg_scan(in);
    return frame.header;
  }
  fail_unknown_format(in.name(), magic, n);
}

RgbImage decode_image(const fs::path& file) {
  ImageFileStream in(file);
  const auto bytes = read_whole(in);
  return decode_image(bytes, in.name());
}

RgbImage decode_image(std::span<const std::uint8_t> bytes, std::string_view origin) {
  if (bytes.size() > kMaxImageFileBytes)
    fail(origin, "is " + std::to_string(bytes.size()) + " bytes, more than an image file may be",
         "scale the image down or recompress it");
  if (is_png(bytes.data(), bytes.size())) return decode_png(bytes, origin);
  if (is_jpeg(bytes.data(), bytes.size())) return decode_jpeg(bytes, origin);
  fail_unknown_format(origin, bytes.data(), bytes.size());
}

}  // namespace mixtrain::core
