// Bit-for-bit parity with torchvision's ImageFolder pipeline: tests/integration/
// image_transforms_reference.py (under Debian's /usr/bin/python3 with Pillow 9.4 and torchvision
// 0.14) writes JPEGs and PNGs of many kinds and sizes with what PIL decodes and what
// F.resized_crop and Resize + CenterCrop give for many boxes; decode_image, resized_crop and
// resize_then_center_crop must give the same bytes. Skipped where that Python cannot import
// torchvision. Damaged files PIL refuses must be refused too; those it opens must decode alike.

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/image_folder/image_file.h"
#include "data/image_folder/image_resample.h"
#include "data_test_util.h"
#include "jpeg_test_writer.h"

namespace mixtrain::test {
namespace {

// Where the bytes first differ, for the failure message.
std::string first_difference(const std::vector<std::uint8_t>& got, const Bytes& want) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  std::size_t count = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && count++ == 0) first = i;
  if (count == 0) return "";
  return std::to_string(count) + " bytes differ, first at " + std::to_string(first) + ": " +
         std::to_string(got[first]) + " vs torchvision's " + std::to_string(want[first]);
}

// libjpeg writes 4-component JPEGs as YCCK here (jpeg_test_writer.h), which PIL cannot write:
// the script decodes it.
void write_ycck(const fs::path& file) {
  const int width = 45, height = 30;
  std::vector<std::uint8_t> cmyk(static_cast<std::size_t>(width * height * 4));
  for (std::size_t i = 0; i < cmyk.size(); ++i)
    cmyk[i] = static_cast<std::uint8_t>((i * 37 + (i / 180) * 11) % 256);
  const auto jpeg =
      jpeg_bytes(cmyk.data(), width, height, JpegPixels::cmyk, JpegSampling::s420, 90);
  ASSERT_FALSE(jpeg.empty());
  write_file(file, jpeg);
}

TEST(ImageTransformsParity, DecodeAndTransformsMatchTorchvisionBitForBit) {
  ScratchDir dir;
  write_ycck(dir / "cpp_ycck.jpg");
  const std::string script =
      std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/tests/integration/image_transforms_reference.py";
  const std::string cmd = "/usr/bin/python3 " + script + " " + dir.path().string() + " > " +
                          (dir / "log.txt").string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  const std::string log = [&] {
    const Bytes b = read_file(dir / "log.txt");
    return std::string(b.begin(), b.end());
  }();
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) == 127 || WEXITSTATUS(status) == 77)
    GTEST_SKIP() << "/usr/bin/python3 with Pillow, numpy and torchvision is needed (Debian: apt "
                    "install python3-torchvision python3-pil python3-numpy): "
                 << log;
  ASSERT_EQ(WEXITSTATUS(status), 0) << log;

  std::ifstream manifest(dir / "manifest.txt");
  std::string line;
  int images = 0, crops = 0, centers = 0, refused = 0, swept = 0, swept_refused = 0;
  core::RgbImage image;
  std::string current;
  while (std::getline(manifest, line)) {
    std::istringstream in(line);
    std::string kind, name;
    in >> kind >> name;
    if (kind == "refused") {
      expect_data_error([&] { (void)core::decode_image(dir / name); }, name);
      ++refused;
      if (name.starts_with("sweep")) ++swept_refused;
      continue;
    }
    if (kind == "decoded") {  // the damage sweep's files PIL opens: the same pixels
      std::int64_t h = 0, w = 0;
      in >> h >> w;
      try {
        const core::RgbImage swept_image = core::decode_image(dir / name);
        EXPECT_EQ(swept_image.height, h) << name;
        EXPECT_EQ(swept_image.width, w) << name;
        EXPECT_EQ(first_difference(swept_image.pixels, read_file(dir / (name + ".decoded"))), "")
            << "decoding " << name;
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << ": PIL opens it, the loader refused it: " << e.what();
      }
      ++swept;
      continue;
    }
    if (kind == "image") {
      std::int64_t h = 0, w = 0;
      in >> h >> w;
      image = core::decode_image(dir / name);
      current = name;
      ASSERT_EQ(image.height, h) << name;
      ASSERT_EQ(image.width, w) << name;
      EXPECT_EQ(first_difference(image.pixels, read_file(dir / (name + ".decoded"))), "")
          << "decoding " << name;
      ++images;
      continue;
    }
    ASSERT_EQ(name, current) << line;
    int k = 0, mirror = 0;
    std::int64_t oh = 0, ow = 0;
    std::vector<std::uint8_t> out;
    std::string file;
    if (kind == "crop") {
      core::PixelBox box;
      in >> k >> box.top >> box.left >> box.height >> box.width >> oh >> ow >> mirror;
      out.resize(static_cast<std::size_t>(3 * oh * ow));
      core::resized_crop(image, box, oh, ow, mirror != 0, out.data());
      file = name + ".crop" + std::to_string(k);
      ++crops;
    } else {
      ASSERT_EQ(kind, "center") << line;
      std::int64_t s = 0;
      in >> k >> s >> oh >> ow >> mirror;
      out.resize(static_cast<std::size_t>(3 * oh * ow));
      core::resize_then_center_crop(image, s, oh, ow, mirror != 0, out.data());
      file = name + ".center" + std::to_string(k);
      ++centers;
    }
    EXPECT_EQ(first_difference(out, read_file(dir / file)), "") << line;
  }
  EXPECT_GE(images, 25);
  EXPECT_GE(refused, 3);
  // The sweep holds both verdicts: the cuts PIL refuses, the flips and the last cuts it opens.
  EXPECT_GE(swept_refused, 100);
  EXPECT_GE(swept, 20);
  EXPECT_GE(crops, 25 * 12);
  EXPECT_GE(centers, 25 * 4);
}

}  // namespace
}  // namespace mixtrain::test
