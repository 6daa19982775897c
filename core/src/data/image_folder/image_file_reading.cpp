#include "data/image_folder/image_file_reading.h"

#include "mixtrain/sdk/error.h"

namespace mixtrain::core::image_files {

[[noreturn]] void fail(std::string_view origin, const std::string& what, const std::string& hint) {
  throw sdk::DataError("image file '" + std::string(origin) + "': " + what, hint);
}

void check_size(std::string_view origin, std::int64_t width, std::int64_t height) {
  const std::string size = std::to_string(width) + "x" + std::to_string(height);
  if (width <= 0 || height <= 0)
    fail(origin, "has a side of 0 pixels (" + size + ")", kRewriteHint);
  if (width > kMaxImageSide || height > kMaxImageSide || width * height > kMaxImagePixels)
    fail(origin,
         "is " + size + " pixels, more than the loader accepts (" + std::to_string(kMaxImageSide) +
             " on a side, " + std::to_string(kMaxImagePixels) + " in all)",
         "scale the image down before training, or remove it from the image folder");
}

std::vector<std::uint8_t> read_whole(ImageFileStream& in) {
  if (in.size() > kMaxImageFileBytes)
    fail(in.name(),
         "is " + std::to_string(in.size()) + " bytes, more than an image file may be (" +
             std::to_string(kMaxImageFileBytes) + ")",
         "scale the image down or recompress it, or remove it from the image folder");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(in.size()));
  in.read_exact(bytes.data(), bytes.size(), "image data");
  return bytes;
}

}  // namespace mixtrain::core::image_files
