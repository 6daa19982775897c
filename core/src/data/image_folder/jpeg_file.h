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

// The next marker's code, past bytes that are not markers (skipped, as libjpeg and PIL skip
// them), fill bytes and the markers without a length field (RSTn, TEM, SOI); `what` names the
// part a truncation ends in.
template <class Reader>
std::uint8_t next_jpeg_marker(Reader& in, std::string_view what) {
  std::uint8_t b = 0;
  for (;;) {
    in.read_exact(&b, 1, what);
    if (b != 0xff) continue;
    std::uint8_t marker = 0xff;
    while (marker == 0xff) in.read_exact(&marker, 1, what);
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xd0 && marker <= 0xd8)) continue;
    return marker;
  }
}

// A segment's length field (its 2 bytes included).
template <class Reader>
unsigned jpeg_segment_length(Reader& in, std::string_view what) {
  std::uint8_t b[2];
  in.read_exact(b, 2, what);
  return (unsigned{b[0]} << 8) | b[1];
}

// The frame header (SOF) holds the size; application segments (EXIF thumbnails, ICC profiles)
// may come first and be large, so segments are skipped by their lengths rather than read. A
// length below 2 skips nothing, as libjpeg and PIL read it.
template <class Reader>
JpegFrame read_jpeg_frame(Reader& in) {
  std::uint8_t b[6];
  in.skip(2, "JPEG start marker");
  for (;;) {
    const std::uint8_t marker = next_jpeg_marker(in, "JPEG markers before the frame header");
    if (marker == 0xda || marker == 0xd9)
      fail(in.name(), "is not a valid JPEG: no frame header before the image data", kRewriteHint);
    const unsigned length = jpeg_segment_length(in, "JPEG segment length");
    const bool is_frame =
        marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 && marker != 0xcc;
    if (!is_frame) {
      if (length > 2) in.skip(length - 2, "JPEG segment");
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
    in.skip(length - 8, "JPEG frame header");
    return {{ImageFormat::jpeg, width, height}, components};
  }
}

// After the frame header, the segments up to the first scan's data (the tables, a restart
// interval, comments, the scan's header), skipped by their lengths: a file that ends before its
// image data, or holds none, is refused by a header check, as PIL refuses to open it, rather than
// when its batch is drawn.
template <class Reader>
void read_to_jpeg_scan(Reader& in) {
  for (;;) {
    const std::uint8_t marker = next_jpeg_marker(in, "JPEG tables before the image data");
    if (marker == 0xd9)
      fail(in.name(), "is not a valid JPEG: it ends before any image data", kRewriteHint);
    const unsigned length = jpeg_segment_length(in, "JPEG tables before the image data");
    if (length > 2) in.skip(length - 2, "JPEG tables before the image data");
    if (marker == 0xda) return;  // the scan's header read: its data follow
  }
}

RgbImage decode_jpeg(std::span<const std::uint8_t> bytes, std::string_view origin);

}  // namespace mixtrain::core::image_files
