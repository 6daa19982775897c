// Fuzzes the image decoders (data/image_folder/image_file.h: JPEG through libjpeg's setjmp error
// path with the frame header read by hand, PNG through libpng's) and what is done with what
// they accept: the header read from a file of the same bytes, torchvision's Resize + CenterCrop
// and a RandomResizedCrop drawn from the input. Input: the file's bytes; its last byte, when
// present, also seeds the crop's generator. sdk::DataError is an expected rejection; an image
// that breaks its contract, or a header that disagrees with the decode, is a finding (abort).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "data/image_folder/image_file.h"
#include "data/image_folder/image_resample.h"
#include "data/image_folder/random_resized_crop.h"
#include "fuzz_support.h"
#include "mixtrain/sdk/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace core = mixtrain::core;
  const std::span<const std::uint8_t> bytes(data, size);
  core::RgbImage image;
  try {
    image = core::decode_image(bytes, "fuzz input");
  } catch (const mixtrain::sdk::DataError&) {
    return 0;
  }
  if (image.width < 1 || image.height < 1 || image.width > core::kMaxImageSide ||
      image.height > core::kMaxImageSide || image.width * image.height > core::kMaxImagePixels ||
      image.pixels.size() != static_cast<std::size_t>(image.width * image.height * 3))
    std::abort();
  // The header of an image that decodes says its size.
  const auto file = mixtrain::fuzz::scratch_file("image", mixtrain::fuzz::as_view(data, size));
  try {
    const auto header = core::read_image_header(file);
    if (header.width != image.width || header.height != image.height) std::abort();
  } catch (const mixtrain::sdk::DataError&) {
    std::abort();  // decoded from the same bytes, refused by the header reader
  }
  // Keep the transforms' work small: the decoders are what is fuzzed.
  if (image.width * image.height > (1 << 20)) return 0;
  std::vector<std::uint8_t> out(3 * 13 * 17);
  core::resize_then_center_crop(image, 19, 13, 17, size % 2 == 1, out.data());
  core::DataRng rng(size > 0 ? data[size - 1] : 0, 7);
  const core::PixelBox box =
      core::random_resized_crop_box(image.height, image.width, core::RandomResizedCropSpec{}, rng);
  if (box.top < 0 || box.left < 0 || box.height < 1 || box.width < 1 ||
      box.top + box.height > image.height || box.left + box.width > image.width)
    std::abort();
  core::resized_crop(image, box, 13, 17, /*mirror=*/true, out.data());
  return 0;
}
