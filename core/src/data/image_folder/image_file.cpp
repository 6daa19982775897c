#include "data/image_folder/image_file.h"

#include <png.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;

// A compressed image larger than this is no photograph a loader should hold in memory; reading
// it whole would be the allocation the size limits exist to prevent.
constexpr std::uint64_t kMaxImageFileBytes = std::uint64_t{1} << 30;

constexpr std::array<std::uint8_t, 8> kPngMagic = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

const char* const kReplaceHint =
    "convert the file to a baseline JPEG or a PNG (e.g. with ImageMagick: convert in out.png), or "
    "remove it from the image folder";
const char* const kRewriteHint =
    "the file is damaged or incomplete; copy or download it again, or remove it from the image "
    "folder";

[[noreturn]] void fail(std::string_view origin, const std::string& what, const std::string& hint) {
  throw sdk::DataError("image file '" + std::string(origin) + "': " + what, hint);
}

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
  fail(origin,
       "is neither a JPEG nor a PNG (it starts with bytes " +
           hex_bytes(p, std::min<std::size_t>(n, 8)) + ")",
       kReplaceHint);
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

// ---- reading files ---------------------------------------------------------------------------

class ImageFileStream {
 public:
  explicit ImageFileStream(const fs::path& file) : name_(file.string()) {
    std::error_code ec;
    const auto status = fs::status(file, ec);
    if (!fs::exists(status)) fail(name_, "no such file", "check the image folder's path");
    if (fs::is_directory(status))
      fail(name_, "is a directory, expected an image file", "remove it from the image folder");
    size_ = fs::file_size(file, ec);
    if (ec)
      fail(name_, "cannot determine the file size (" + ec.message() + ")",
           "check that the file is readable by this user");
    errno = 0;
    stream_.open(file, std::ios::binary);
    if (!stream_) {
      const int err = errno;
      fail(name_, std::string("cannot open: ") + (err != 0 ? std::strerror(err) : "unknown error"),
           "check that the file is readable by this user");
    }
  }

  const std::string& name() const { return name_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t offset() const { return offset_; }

  // Up to n bytes (fewer only at the end of the file).
  std::size_t read_some(std::uint8_t* out, std::size_t n) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(n, size_ - offset_));
    if (want == 0) return 0;
    stream_.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(want));
    const auto got = static_cast<std::size_t>(stream_.gcount());
    if (got != want)
      fail(name_, "read error at offset " + std::to_string(offset_),
           "the file may have changed while it was read, or the disk has an error");
    offset_ += got;
    return got;
  }

  void read_exact(std::uint8_t* out, std::size_t n, std::string_view what) {
    if (read_some(out, n) != n)
      fail(name_, "is truncated: it ends inside the " + std::string(what), kRewriteHint);
  }

  void rewind() {
    stream_.clear();
    stream_.seekg(0);
    offset_ = 0;
  }

  void skip(std::uint64_t n, std::string_view what) {
    if (n > size_ - offset_)
      fail(name_, "is truncated: it ends inside the " + std::string(what), kRewriteHint);
    offset_ += n;
    stream_.seekg(static_cast<std::streamoff>(offset_));
  }

 private:
  std::string name_;
  std::ifstream stream_;
  std::uint64_t size_ = 0, offset_ = 0;
};

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

// ---- JPEG ------------------------------------------------------------------------------------

// Bytes already in memory with ImageFileStream's reading interface, so the header parser is one
// for files and buffers.
class ByteReader {
 public:
  ByteReader(std::span<const std::uint8_t> bytes, std::string_view name)
      : bytes_(bytes), name_(name) {}
  const std::string& name() const { return name_; }
  std::uint64_t offset() const { return offset_; }
  void read_exact(std::uint8_t* out, std::size_t n, std::string_view what) {
    if (n > bytes_.size() - offset_)
      fail(name_, "is truncated: it ends inside the " + std::string(what), kRewriteHint);
    std::memcpy(out, bytes_.data() + offset_, n);
    offset_ += n;
  }
  void skip(std::uint64_t n, std::string_view what) {
    if (n > bytes_.size() - offset_)
      fail(name_, "is truncated: it ends inside the " + std::string(what), kRewriteHint);
    offset_ += static_cast<std::size_t>(n);
  }

 private:
  std::span<const std::uint8_t> bytes_;
  std::string name_;
  std::size_t offset_ = 0;
};

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

// ---- PNG -------------------------------------------------------------------------------------

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

// From the file's start: the magic, then IHDR: length 13, "IHDR", width, height, bit depth, color
// type, compression, filter, interlace, CRC.
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
  return {ImageFormat::png, width, height};
}

}  // namespace

ImageHeader read_image_header(const fs::path& file) {
  ImageFileStream in(file);
  std::uint8_t magic[8] = {};
  const std::size_t n = in.read_some(magic, sizeof magic);
  if (is_png(magic, n) || is_jpeg(magic, n)) {
    in.rewind();
    return is_png(magic, n) ? read_png_header(in) : read_jpeg_frame(in).header;
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
