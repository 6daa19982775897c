#include "data/image_folder/jpeg_file.h"

#include <turbojpeg.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace mixtrain::core::image_files {
namespace {

struct TjHandle {
  tjhandle handle = tjInitDecompress();
  TjHandle() = default;
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
  ~TjHandle() {
    if (handle != nullptr) tjDestroy(handle);
  }
};

// PIL reads CMYK JPEGs as Adobe writes them, inverted ("CMYK;I"), then converts to RGB with
// R = (255 − K') − C'·(255 − K')/255 in its rounded integer form, where C', K' are the inverted
// samples.
void cmyk_to_rgb(const std::uint8_t* cmyk, std::size_t pixels, std::uint8_t* rgb) {
  for (std::size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int not_k = cmyk[3];  // 255 − inverted K
    for (int c = 0; c < 3; ++c) {
      const int ink = 255 - cmyk[c];
      const int t = ink * not_k + 128;
      const int v = not_k - (((t >> 8) + t) >> 8);
      rgb[c] = static_cast<std::uint8_t>(std::clamp(v, 0, 255));
    }
  }
}

}  // namespace

RgbImage decode_jpeg(std::span<const std::uint8_t> bytes, std::string_view origin) {
  TjHandle tj;
  if (tj.handle == nullptr)
    throw std::runtime_error(std::string("TurboJPEG could not start: ") + tjGetErrorStr2(nullptr));
  // TurboJPEG takes a non-const pointer but does not write through it.
  auto* data = const_cast<unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  // The frame header is parsed here rather than by tjDecompressHeader3, which refuses sampling
  // factors outside TurboJPEG's named subsamplings that libjpeg (and so PIL) decodes.
  ByteReader reader(bytes, origin);
  const JpegFrame frame = read_jpeg_frame(reader);
  const int width = static_cast<int>(frame.header.width);
  const int height = static_cast<int>(frame.header.height);

  RgbImage image;
  image.width = width;
  image.height = height;
  const auto pixels = static_cast<std::size_t>(width) * static_cast<std::size_t>(height);
  image.pixels.resize(pixels * 3);
  // Four components are CMYK or YCCK (libjpeg converts YCCK to CMYK), one gray; three are
  // YCbCr or RGB, both of which TJPF_RGB receives.
  const bool cmyk = frame.components == 4;
  const bool gray = frame.components == 1;
  const int format = cmyk ? TJPF_CMYK : gray ? TJPF_GRAY : TJPF_RGB;
  std::vector<std::uint8_t> staging(cmyk ? pixels * 4 : gray ? pixels : 0);
  std::uint8_t* target = cmyk || gray ? staging.data() : image.pixels.data();
  // libjpeg's defaults, which PIL keeps: the accurate integer IDCT (no TJFLAG_FASTDCT) and fancy
  // upsampling (no TJFLAG_FASTUPSAMPLE). TJFLAG_LIMITSCANS refuses progressive files with more
  // than 500 scans, which only a hostile file has and which would take minutes to decode.
  const int flags = TJFLAG_LIMITSCANS;
  if (tjDecompress2(tj.handle, data, size, target, width, 0, height, format, flags) != 0) {
    const std::string message = tjGetErrorStr2(tj.handle);
    // A warning leaves the image decoded; PIL accepts all but one: data ending before the image
    // does (libjpeg fills the rest with gray; PIL raises "image file is truncated"). TurboJPEG
    // keeps the first warning's text only, so a premature end after an earlier warning passes
    // as that warning; where PIL stands on such files depends on how far its decoder got (the
    // parity test samples both kinds).
    const bool truncated = message.find("Premature end") != std::string::npos;
    if (tjGetErrorCode(tj.handle) != TJERR_WARNING || truncated)
      fail(origin, (truncated ? "is truncated (" : "is not a readable JPEG (") + message + ")",
           kRewriteHint);
  }
  if (cmyk) {
    cmyk_to_rgb(staging.data(), pixels, image.pixels.data());
  } else if (gray) {
    for (std::size_t i = 0; i < pixels; ++i)
      std::fill_n(image.pixels.data() + 3 * i, 3, staging[i]);
  }
  return image;
}

}  // namespace mixtrain::core::image_files
