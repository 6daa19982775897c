// JPEG files for data/image_folder/image_file.h (internal): the frame header read by hand (sizes
// and components, for headers and for the decode's buffers, checked before libjpeg allocates)
// and the decode through libjpeg's API with PIL's settings and PIL's verdicts on damage.
// image_file.h states what is accepted and what is refused.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "data/image_folder/image_file_reading.h"

namespace mixtrain::core::image_files {

struct JpegFrame {
  ImageHeader header;
  int components = 0;
};

// The frame header (SOF) holds the size; application segments (EXIF thumbnails, ICC profiles)
// may come first and be large, so segments are skipped by their lengths rather than read. Bytes
// between segments that are not markers are skipped, as libjpeg and PIL skip them.
template <class Reader>
JpegFrame read_jpeg_frame(Reader& in) {
  std::uint8_t b[8];
  in.skip(2, "JPEG start marker");
  for (;;) {
    in.read_exact(b, 1, "JPEG markers before the frame header");
    if (b[0] != 0xff) continue;
    std::uint8_t marker = 0xff;
    while (marker == 0xff) in.read_exact(&marker, 1, "JPEG markers before the frame header");
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xd0 && marker <= 0xd8))
      continue;  // no length field
    if (marker == 0xda || marker == 0xd9)
      fail(in.name(), "is not a valid JPEG: no frame header before the image data", kRewriteHint);
    in.read_exact(b, 2, "JPEG segment length");
    const unsigned length = (unsigned{b[0]} << 8) | b[1];
    if (length < 2)
      fail(in.name(), "is not a valid JPEG: segment length " + std::to_string(length),
           kRewriteHint);
    const bool is_frame =
        marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 && marker != 0xcc;
    if (!is_frame) {
      in.skip(length - 2, "JPEG segment");
      continue;
    }
    if (length < 8) fail(in.name(), "is not a valid JPEG: frame header too short", kRewriteHint);
    in.read_exact(b, 6, "JPEG frame header");
    const std::int64_t height = (std::int64_t{b[1]} << 8) | b[2];
    const std::int64_t width = (std::int64_t{b[3]} << 8) | b[4];
    const int components = b[5];
    if (components != 1 && components != 3 && components != 4)
      fail(in.name(),
           "is a JPEG with " + std::to_string(components) +
               " color components; only gray (1), color (3) and CMYK (4) are read",
           kReplaceHint);
    check_size(in.name(), width, height);
    return {{ImageFormat::jpeg, width, height}, components};
  }
}

RgbImage decode_jpeg(std::span<const std::uint8_t> bytes, std::string_view origin);

}  // namespace mixtrain::core::image_files
