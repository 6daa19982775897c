// Decoding of image files (data/image_folder/image_file.h): JPEG round trips through libjpeg's
// encoder, PNG round trips through a PNG writer of the test's own (every color type, bit depth,
// tRNS, Adam7 interlacing), and every damaged or foreign file is a DataError naming it.
// Bit-for-bit agreement with PIL is test_image_transforms_parity.cpp's.
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/image_folder/image_file.h"
#include "data_test_util.h"
#include "jpeg_test_writer.h"

namespace mixtrain::test {
namespace {

using core::decode_image;
using core::ImageFormat;
using core::read_image_header;
using core::RgbImage;

// A smooth pattern (so JPEG at quality 100 stays within a few levels) with per-channel phases.
std::vector<std::uint8_t> pattern(int height, int width, int channels) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(height * width * channels));
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c)
        out[static_cast<std::size_t>((y * width + x) * channels + c)] =
            static_cast<std::uint8_t>((x * 5 + y * 3 + c * 60) % 256 / 2 + 60);
  return out;
}

Bytes jpeg_bytes(const std::vector<std::uint8_t>& pixels, int height, int width, JpegPixels in,
                 JpegSampling sampling, int quality = 100,
                 const std::vector<jpeg_scan_info>* scans = nullptr) {
  return test::jpeg_bytes(pixels.data(), width, height, in, sampling, quality, scans);
}

void append_be32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(v >> shift));
}

void append_chunk(Bytes& out, const char* kind, const Bytes& data) {
  append_be32(out, static_cast<std::uint32_t>(data.size()));
  Bytes body(kind, kind + 4);
  body.insert(body.end(), data.begin(), data.end());
  out.insert(out.end(), body.begin(), body.end());
  append_be32(out,
              static_cast<std::uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size()))));
}

struct PngSpec {
  int height = 0, width = 0, color_type = 0, bit_depth = 8;
  bool interlaced = false;
  std::vector<unsigned> samples;  // [height, width, channels]
  Bytes plte, trns;
};

int png_channels(int color_type) {
  switch (color_type) {
    case 2:
      return 3;
    case 4:
      return 2;
    case 6:
      return 4;
    default:
      return 1;
  }
}

// A PNG writer independent of libpng: filter type 0 rows, samples packed MSB first.
Bytes png_bytes(const PngSpec& s) {
  const int channels = png_channels(s.color_type);
  static constexpr int kAdam7[7][4] = {{0, 0, 8, 8}, {0, 4, 8, 8}, {4, 0, 8, 4}, {0, 2, 4, 4},
                                       {2, 0, 4, 2}, {0, 1, 2, 2}, {1, 0, 2, 1}};
  static constexpr int kWhole[1][4] = {{0, 0, 1, 1}};
  Bytes raw;
  const int passes = s.interlaced ? 7 : 1;
  for (int p = 0; p < passes; ++p) {
    const int* pass = s.interlaced ? kAdam7[p] : kWhole[0];
    for (int y = pass[0]; y < s.height; y += pass[2]) {
      if (pass[1] >= s.width) break;
      raw.push_back(0);
      unsigned acc = 0;
      int bits = 0;
      for (int x = pass[1]; x < s.width; x += pass[3])
        for (int c = 0; c < channels; ++c) {
          const unsigned v = s.samples[static_cast<std::size_t>((y * s.width + x) * channels + c)];
          if (s.bit_depth == 16) {
            raw.push_back(static_cast<unsigned char>(v >> 8));
            raw.push_back(static_cast<unsigned char>(v & 255));
          } else {
            acc = (acc << s.bit_depth) | v;
            bits += s.bit_depth;
            if (bits == 8) {
              raw.push_back(static_cast<unsigned char>(acc));
              acc = 0;
              bits = 0;
            }
          }
        }
      if (bits > 0) raw.push_back(static_cast<unsigned char>(acc << (8 - bits)));
    }
  }
  Bytes out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  Bytes ihdr;
  append_be32(ihdr, static_cast<std::uint32_t>(s.width));
  append_be32(ihdr, static_cast<std::uint32_t>(s.height));
  ihdr.insert(ihdr.end(),
              {static_cast<unsigned char>(s.bit_depth), static_cast<unsigned char>(s.color_type), 0,
               0, static_cast<unsigned char>(s.interlaced ? 1 : 0)});
  append_chunk(out, "IHDR", ihdr);
  if (!s.plte.empty()) append_chunk(out, "PLTE", s.plte);
  if (!s.trns.empty()) append_chunk(out, "tRNS", s.trns);
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  Bytes packed(packed_size);
  EXPECT_EQ(compress2(packed.data(), &packed_size, raw.data(), static_cast<uLong>(raw.size()), 6),
            Z_OK);
  packed.resize(packed_size);
  append_chunk(out, "IDAT", packed);
  append_chunk(out, "IEND", {});
  return out;
}

// What PIL's convert("RGB") gives for the spec's samples.
std::vector<std::uint8_t> expected_rgb(const PngSpec& s) {
  const int channels = png_channels(s.color_type);
  std::vector<std::uint8_t> out;
  for (int i = 0; i < s.height * s.width; ++i) {
    const unsigned* v = s.samples.data() + static_cast<std::size_t>(i * channels);
    auto to8 = [&](unsigned x) -> std::uint8_t {
      if (s.bit_depth == 16) return static_cast<std::uint8_t>(x >> 8);
      return static_cast<std::uint8_t>(x * 255 / ((1u << s.bit_depth) - 1));
    };
    if (s.color_type == 3) {
      for (int c = 0; c < 3; ++c) out.push_back(s.plte[v[0] * 3 + static_cast<unsigned>(c)]);
    } else if (s.color_type == 0 && s.bit_depth == 16) {
      out.insert(out.end(), 3, static_cast<std::uint8_t>(std::min(v[0], 255u)));
    } else if (s.color_type == 0 || s.color_type == 4) {
      out.insert(out.end(), 3, to8(v[0]));
    } else {
      for (int c = 0; c < 3; ++c) out.push_back(to8(v[c]));
    }
  }
  return out;
}

PngSpec png_spec(int height, int width, int color_type, int bit_depth, bool interlaced,
                 unsigned seed) {
  PngSpec s{height, width, color_type, bit_depth, interlaced, {}, {}, {}};
  std::mt19937 gen(seed);
  const unsigned limit = color_type == 3 ? 1u << std::min(bit_depth, 4) : 1u << bit_depth;
  if (color_type == 3) {
    for (unsigned i = 0; i < limit * 3; ++i) s.plte.push_back(static_cast<unsigned char>(gen()));
    s.trns = {0, 77, 255};
  }
  const auto n = static_cast<std::size_t>(height * width * png_channels(color_type));
  for (std::size_t i = 0; i < n; ++i) s.samples.push_back(static_cast<unsigned>(gen() % limit));
  // 16-bit gray: PIL clips rather than scales, so values around 255 show which rule applies.
  if (color_type == 0 && bit_depth == 16)
    for (auto& v : s.samples) v %= 300;
  return s;
}

TEST(ImageFile, PngOfEveryColorTypeAndDepthDecodesExactly) {
  ScratchDir dir;
  struct Kind {
    int color_type, bit_depth;
  };
  const Kind kinds[] = {{0, 1}, {0, 2}, {0, 4}, {0, 8}, {0, 16}, {2, 8}, {2, 16}, {3, 1},
                        {3, 2}, {3, 4}, {3, 8}, {4, 8}, {4, 16}, {6, 8}, {6, 16}};
  unsigned seed = 1;
  for (const Kind& k : kinds)
    for (bool interlaced : {false, true}) {
      const PngSpec spec = png_spec(11, 13, k.color_type, k.bit_depth, interlaced, seed++);
      const std::string name = "t" + std::to_string(k.color_type) + "_" +
                               std::to_string(k.bit_depth) + (interlaced ? "i" : "") + ".png";
      write_file(dir / name, png_bytes(spec));
      const RgbImage image = decode_image(dir / name);
      EXPECT_EQ(image.height, 11);
      EXPECT_EQ(image.width, 13);
      EXPECT_EQ(image.pixels, expected_rgb(spec)) << name;
      const auto header = read_image_header(dir / name);
      EXPECT_EQ(header.format, ImageFormat::png);
      EXPECT_EQ(header.width, 13);
      EXPECT_EQ(header.height, 11);
    }
}

TEST(ImageFile, PngWithTransparentColorKeepsItsColors) {
  ScratchDir dir;
  PngSpec spec = png_spec(5, 4, 2, 8, false, 9);
  spec.trns = {0, 1, 0, 2, 0, 3};
  write_file(dir / "k.png", png_bytes(spec));
  EXPECT_EQ(decode_image(dir / "k.png").pixels, expected_rgb(spec));
}

int max_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(int{a[i]} - int{b[i]}));
  return worst;
}

TEST(ImageFile, JpegRoundTripsAtQuality100) {
  ScratchDir dir;
  const auto rgb = pattern(37, 23, 3);
  write_file(dir / "c.jpg", jpeg_bytes(rgb, 37, 23, JpegPixels::rgb, JpegSampling::s444));
  const RgbImage image = decode_image(dir / "c.jpg");
  EXPECT_EQ(image.height, 37);
  EXPECT_EQ(image.width, 23);
  EXPECT_LE(max_difference(image.pixels, rgb), 3);

  const auto gray = pattern(9, 30, 1);
  write_file(dir / "g.jpg", jpeg_bytes(gray, 9, 30, JpegPixels::gray, JpegSampling::gray));
  const RgbImage g = decode_image(dir / "g.jpg");
  std::vector<std::uint8_t> gray_rgb;
  for (auto v : gray) gray_rgb.insert(gray_rgb.end(), 3, v);
  EXPECT_LE(max_difference(g.pixels, gray_rgb), 2);
  const auto header = read_image_header(dir / "g.jpg");
  EXPECT_EQ(header.format, ImageFormat::jpeg);
  EXPECT_EQ(header.width, 30);
  EXPECT_EQ(header.height, 9);
}

// The writer writes CMYK as YCCK with an Adobe marker; PIL reads the samples as Adobe's inverted
// ink and converts them to RGB as (255 − K)·(1 − C/255).
TEST(ImageFile, CmykJpegConvertsAsPilDoes) {
  ScratchDir dir;
  const auto cmyk = pattern(16, 24, 4);
  write_file(dir / "k.jpg", jpeg_bytes(cmyk, 16, 24, JpegPixels::cmyk, JpegSampling::s444));
  std::vector<std::uint8_t> expected;
  for (std::size_t i = 0; i < cmyk.size(); i += 4) {
    const double not_k = cmyk[i + 3];
    for (int c = 0; c < 3; ++c)
      expected.push_back(
          static_cast<std::uint8_t>(not_k * cmyk[i + static_cast<std::size_t>(c)] / 255.0 + 0.5));
  }
  EXPECT_LE(max_difference(decode_image(dir / "k.jpg").pixels, expected), 4);
}

// The frame header may follow large application segments (EXIF thumbnails, ICC profiles).
TEST(ImageFile, JpegHeaderAfterLargeSegments) {
  ScratchDir dir;
  Bytes jpeg = jpeg_bytes(pattern(8, 8, 3), 8, 8, JpegPixels::rgb, JpegSampling::s420);
  Bytes app;
  for (int i = 0; i < 3; ++i) {
    app.insert(app.end(), {0xff, 0xe2, 0xff, 0xff});
    app.insert(app.end(), 0xfffd, static_cast<unsigned char>(i));
  }
  jpeg.insert(jpeg.begin() + 2, app.begin(), app.end());
  write_file(dir / "a.jpg", jpeg);
  const auto header = read_image_header(dir / "a.jpg");
  EXPECT_EQ(header.width, 8);
  EXPECT_EQ(header.height, 8);
  EXPECT_EQ(decode_image(dir / "a.jpg").pixels.size(), 8u * 8u * 3u);
}

void expect_refused(const fs::path& file, const std::vector<std::string>& contains = {}) {
  const std::string name = file.string();
  expect_data_error([&] { (void)decode_image(file); }, name, contains);
  const Bytes bytes = read_file(file);
  if (fs::exists(file)) expect_data_error([&] { (void)decode_image(bytes, name); }, name, contains);
}

TEST(ImageFile, BadFilesAreDataErrorsNamingThem) {
  ScratchDir dir;
  expect_refused(dir / "missing.jpg", {"no such file"});
  expect_data_error([&] { (void)read_image_header(dir / "missing.jpg"); }, "missing.jpg");

  write_file(dir / "empty.png", {});
  expect_refused(dir / "empty.png", {"empty"});

  Bytes noise(500);
  std::mt19937 gen(3);
  for (auto& b : noise) b = static_cast<unsigned char>(gen());
  noise[0] = 0x42;
  write_file(dir / "noise.jpg", noise);
  expect_refused(dir / "noise.jpg", {"neither a JPEG nor a PNG"});

  const std::string text = "this is not an image\n";
  write_file(dir / "text.jpg", Bytes(text.begin(), text.end()));
  expect_refused(dir / "text.jpg", {"neither a JPEG nor a PNG", "convert"});
  expect_data_error([&] { (void)read_image_header(dir / "text.jpg"); }, "text.jpg");

  // JPEG magic, then garbage.
  Bytes fake = {0xff, 0xd8, 0xff, 0xe0, 0x00};
  fake.insert(fake.end(), noise.begin(), noise.end());
  write_file(dir / "fake.jpg", fake);
  expect_refused(dir / "fake.jpg");

  const Bytes jpeg =
      jpeg_bytes(pattern(64, 64, 3), 64, 64, JpegPixels::rgb, JpegSampling::s420, 90);
  write_file(dir / "cut.jpg",
             Bytes(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2)));
  expect_refused(dir / "cut.jpg", {"truncated"});
  write_file(dir / "cut_header.jpg", Bytes(jpeg.begin(), jpeg.begin() + 100));
  expect_refused(dir / "cut_header.jpg");
  expect_data_error([&] { (void)read_image_header(dir / "cut_header.jpg"); }, "cut_header.jpg");

  const Bytes png = png_bytes(png_spec(30, 30, 2, 8, false, 4));
  write_file(dir / "cut.png", Bytes(png.begin(), png.begin() + static_cast<long>(png.size() / 2)));
  expect_refused(dir / "cut.png", {"truncated"});
  write_file(dir / "cut_header.png", Bytes(png.begin(), png.begin() + 20));
  expect_refused(dir / "cut_header.png");
  expect_data_error([&] { (void)read_image_header(dir / "cut_header.png"); }, "cut_header.png");

  Bytes bad_crc = png;
  bad_crc[bad_crc.size() - 20] ^= 0x40;  // inside the IDAT chunk's data or CRC
  write_file(dir / "crc.png", bad_crc);
  expect_refused(dir / "crc.png");
  Bytes bad_ihdr = png;
  bad_ihdr[17] ^= 1;  // the width, under the IHDR CRC
  write_file(dir / "ihdr.png", bad_ihdr);
  expect_refused(dir / "ihdr.png");
  expect_data_error([&] { (void)read_image_header(dir / "ihdr.png"); }, "ihdr.png", {"CRC"});

  fs::create_directories(dir / "folder.png");
  expect_data_error([&] { (void)decode_image(dir / "folder.png"); }, "folder.png");
}

// The offset just past a JPEG marker's segment (its two marker bytes and its length field's).
std::size_t segment_end(const Bytes& jpeg, unsigned char marker) {
  for (std::size_t i = 2; i + 3 < jpeg.size(); ++i)
    if (jpeg[i] == 0xff && jpeg[i + 1] == marker)
      return i + 2 + ((std::size_t{jpeg[i + 2]} << 8) | jpeg[i + 3]);
  ADD_FAILURE() << "no marker 0xff" << std::hex << int{marker};
  return 0;
}

// Data that end between the frame header and the image data are the case TurboJPEG reported as
// a warning (the source's "Premature end" came first, the fatal "missing SOS" after): it gave
// zero pixels, and the image trained as black. Every cut from the frame header to the last byte
// of the image data is refused as truncated, as PIL refuses them ("image file is truncated": its
// decoder waits for the data). Where the data end only after libjpeg has read the last row (the
// end marker alone missing, or junk that ends the scan early before the cut), PIL opens the file
// and so does the loader: the parity test's xjpeg_no_eoi and xjpeg_junk_then_cut decide that.
TEST(ImageFile, JpegCutBeforeTheEndOfItsImageDataIsRefused) {
  ScratchDir dir;
  for (const auto sampling : {JpegSampling::s444, JpegSampling::s420}) {
    const Bytes jpeg = jpeg_bytes(pattern(24, 40, 3), 24, 40, JpegPixels::rgb, sampling, 90);
    write_file(dir / "whole.jpg", jpeg);
    EXPECT_EQ(decode_image(dir / "whole.jpg").pixels.size(), std::size_t{24 * 40 * 3});
    const std::size_t frame = segment_end(jpeg, 0xc0), scan = segment_end(jpeg, 0xda);
    ASSERT_LT(frame, scan);
    // Every byte between the frame header and the scan's start, then every 7th of the image data,
    // and its last byte (the end marker's two follow it).
    std::vector<std::size_t> cuts;
    for (std::size_t cut = frame; cut + 3 < jpeg.size(); cut += cut < scan ? 1 : 7)
      cuts.push_back(cut);
    cuts.push_back(jpeg.size() - 3);
    for (const std::size_t cut : cuts) {
      const std::string name = "cut" + std::to_string(cut) + ".jpg";
      write_file(dir / name, Bytes(jpeg.begin(), jpeg.begin() + static_cast<long>(cut)));
      expect_refused(dir / name, {"truncated"});
      // The header check walks to the scan: a cut before it is refused there too, before any
      // batch draws the file; one inside the image data shows only when the file is decoded.
      if (cut < scan)
        expect_data_error([&] { (void)read_image_header(dir / name); }, name,
                          {"before the image data"});
      else
        EXPECT_EQ(read_image_header(dir / name).width, 40) << name;
    }
    EXPECT_GT(cuts.size(), std::size_t{40});
  }
}

// A fatal error after a warning is an error. The JFIF segment's length, 32 bytes too long,
// swallows the start of the first quantization table: libjpeg warns of the rest of it
// ("extraneous bytes before marker"), then stops where table 0 is used ("Quantization table 0x00
// was not defined"). TurboJPEG called that a warning, and the loader took zero pixels for an
// image; PIL refuses the file ("broken data stream"), and so does the loader, with libjpeg's
// message.
TEST(ImageFile, JpegFatalErrorAfterAWarningIsRefused) {
  ScratchDir dir;
  Bytes jpeg = jpeg_bytes(pattern(24, 40, 3), 24, 40, JpegPixels::rgb, JpegSampling::s444, 90);
  ASSERT_EQ(jpeg[3], 0xe0);  // SOI, then APP0 (JFIF) and its length
  const unsigned length = (unsigned{jpeg[4]} << 8) | jpeg[5];
  ASSERT_EQ(jpeg[4 + length + 1], 0xdb);  // the first DQT follows
  jpeg[4] = static_cast<unsigned char>((length + 32) >> 8);
  jpeg[5] = static_cast<unsigned char>((length + 32) & 0xff);
  write_file(dir / "swallowed.jpg", jpeg);
  expect_refused(dir / "swallowed.jpg", {"not a readable JPEG", "Quantization table"});
}

// A progressive file may hold any number of scans, each of which re-reads the whole coefficient
// image: more than 500 (as TurboJPEG's TJFLAG_LIMITSCANS, which only a hostile file needs) are
// refused rather than decoded for minutes. A gray image in 568 valid scans: DC, then each AC
// coefficient alone, first at a point transform of 8, then refined bit by bit.
TEST(ImageFile, ProgressiveJpegOfMoreThan500ScansIsRefused) {
  ScratchDir dir;
  std::vector<jpeg_scan_info> scans;
  scans.push_back({1, {0, 0, 0, 0}, 0, 0, 0, 0});
  for (int k = 1; k < 64; ++k) {
    scans.push_back({1, {0, 0, 0, 0}, k, k, 0, 8});
    for (int a = 8; a > 0; --a) scans.push_back({1, {0, 0, 0, 0}, k, k, a, a - 1});
  }
  ASSERT_GT(scans.size(), std::size_t{500});
  const auto gray = pattern(16, 16, 1);
  write_file(dir / "many.jpg",
             jpeg_bytes(gray, 16, 16, JpegPixels::gray, JpegSampling::gray, 90, &scans));
  expect_refused(dir / "many.jpg", {"500 scans"});
  // The same script cut to 500 scans decodes.
  scans.resize(500);
  write_file(dir / "fewer.jpg",
             jpeg_bytes(gray, 16, 16, JpegPixels::gray, JpegSampling::gray, 90, &scans));
  EXPECT_EQ(decode_image(dir / "fewer.jpg").width, 16);
}

// The PNG header check walks the chunks to the first IDAT: a file cut before its image data
// (here inside a text chunk between IHDR and IDAT) is refused there, one cut inside it only when
// decoded; a file whose IEND comes before any IDAT holds no image.
TEST(ImageFile, PngHeaderCheckReachesTheImageData) {
  ScratchDir dir;
  const Bytes png = png_bytes(png_spec(12, 10, 2, 8, false, 6));
  Bytes text;
  append_chunk(text, "tEXt", Bytes(300, 'x'));
  Bytes with_text(png.begin(), png.begin() + 33);  // the signature and IHDR
  with_text.insert(with_text.end(), text.begin(), text.end());
  const std::size_t idat = with_text.size();
  with_text.insert(with_text.end(), png.begin() + 33, png.end());
  write_file(dir / "whole.png", with_text);
  EXPECT_EQ(read_image_header(dir / "whole.png").width, 10);
  EXPECT_EQ(decode_image(dir / "whole.png").width, 10);

  write_file(dir / "cut_text.png", Bytes(with_text.begin(), with_text.begin() + 200));
  expect_data_error([&] { (void)read_image_header(dir / "cut_text.png"); }, "cut_text.png",
                    {"before the image data"});
  write_file(dir / "cut_idat.png",
             Bytes(with_text.begin(), with_text.begin() + static_cast<long>(idat + 20)));
  EXPECT_EQ(read_image_header(dir / "cut_idat.png").height, 12);
  expect_refused(dir / "cut_idat.png", {"truncated"});

  Bytes no_image(png.begin(), png.begin() + 33);
  append_chunk(no_image, "IEND", {});
  write_file(dir / "no_image.png", no_image);
  expect_data_error([&] { (void)read_image_header(dir / "no_image.png"); }, "no_image.png",
                    {"before any image data"});
  expect_refused(dir / "no_image.png");
}

// A header claiming a huge image is refused from the header alone: nothing of its size is
// allocated (the PNG's IDAT holds a few bytes; reading rows of 100000 pixels would fail later).
TEST(ImageFile, HugeSizesAreRefusedFromTheHeader) {
  ScratchDir dir;
  PngSpec spec = png_spec(1, 1, 2, 8, false, 5);
  Bytes png = png_bytes(spec);
  Bytes ihdr;
  append_be32(ihdr, 100000);
  append_be32(ihdr, 100000);
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
  Bytes huge = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  append_chunk(huge, "IHDR", ihdr);
  huge.insert(huge.end(), png.begin() + 33, png.end());
  write_file(dir / "huge.png", huge);
  expect_refused(dir / "huge.png", {"100000x100000"});
  expect_data_error([&] { (void)read_image_header(dir / "huge.png"); }, "huge.png",
                    {"100000x100000"});

  Bytes jpeg = jpeg_bytes(pattern(8, 8, 3), 8, 8, JpegPixels::rgb, JpegSampling::s444);
  // SOF0's height and width: 60000 × 60000 is 3.6 Gpixel, beyond kMaxImagePixels and the side.
  for (std::size_t i = 2; i + 8 < jpeg.size(); ++i)
    if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0) {
      jpeg[i + 5] = 0xea;
      jpeg[i + 6] = 0x60;
      jpeg[i + 7] = 0xea;
      jpeg[i + 8] = 0x60;
      break;
    }
  write_file(dir / "huge.jpg", jpeg);
  expect_refused(dir / "huge.jpg", {"60000x60000"});
  expect_data_error([&] { (void)read_image_header(dir / "huge.jpg"); }, "huge.jpg",
                    {"60000x60000"});
}

}  // namespace
}  // namespace mixtrain::test
