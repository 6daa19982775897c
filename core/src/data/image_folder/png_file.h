// PNG files for data/image_folder/image_file.h (internal): the header (IHDR) read from a file's
// first bytes, and the decode through libpng, converted as PIL's convert("RGB") converts. libpng's
// errors arrive by longjmp, confined to functions that hold only trivially destructible state.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "data/image_folder/image_file_reading.h"

namespace mixtrain::core::image_files {

RgbImage decode_png(std::span<const std::uint8_t> bytes, std::string_view origin);
// From the file's start: the magic, then IHDR (its CRC checked).
ImageHeader read_png_header(ImageFileStream& in);

}  // namespace mixtrain::core::image_files
