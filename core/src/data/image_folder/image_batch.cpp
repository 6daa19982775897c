#include "data/image_folder/image_batch.h"

#include <stdexcept>
#include <string>

#include "data/byte_images.h"
#include "data/image_folder/image_file.h"
#include "data/image_folder/image_resample.h"
#include "data/image_folder/parallel_rows.h"
#include "data/image_folder/random_resized_crop.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

void decode_image_rows(const Dataset& data, std::span<const std::int64_t> rows,
                       std::optional<std::uint64_t> training_batch, std::uint64_t seed,
                       std::uint64_t first_row, bool flip, std::uint8_t* pixels_out,
                       std::int32_t* y_out) {
  if (!data.is_image_files())
    throw std::logic_error("decode_image_rows: the dataset holds no image files");
  for (const std::int64_t row : rows)
    if (row < 0 || row >= data.rows)
      throw std::out_of_range("decode_image_rows: row " + std::to_string(row) + " outside [0, " +
                              std::to_string(data.rows) + ")");
  const std::int64_t height = data.height(), width = data.width();
  const auto sample = static_cast<std::size_t>(data.features);
  const ImageFileSpec& spec = data.image_spec;
  const RandomResizedCropSpec crop{spec.scale_min, spec.scale_max, spec.ratio_min, spec.ratio_max};
  // out is [rows, 3, H, W]; sample i's crop is [3, H, W] at i·3·H·W.
  parallel_rows(static_cast<std::int64_t>(rows.size()), spec.threads, [&](std::int64_t i) {
    const auto row = static_cast<std::size_t>(rows[static_cast<std::size_t>(i)]);
    std::uint8_t* out = pixels_out + static_cast<std::size_t>(i) * sample;
    RgbImage image;
    try {
      image = decode_image(data.image_files[row]);
    } catch (const sdk::DataError& e) {
      throw sdk::DataError(
          std::string(e.what()) + " (row " + std::to_string(row) + " of the split)", e.hint());
    }
    if (!training_batch) {
      resize_then_center_crop(image, spec.resize, height, width, /*mirror=*/false, out);
      return;
    }
    DataRng rng(seed, augment_stream(*training_batch, first_row + static_cast<std::uint64_t>(i)));
    const PixelBox box = random_resized_crop_box(image.height, image.width, crop, rng);
    const bool mirror = flip && rng.uniform() < 0.5;
    resized_crop(image, box, height, width, mirror, out);
  });
  if (y_out != nullptr)
    for (std::size_t i = 0; i < rows.size(); ++i)
      y_out[i] = data.y[static_cast<std::size_t>(rows[i])];
}

void decode_image_rows_as_floats(const Dataset& data, std::span<const std::int64_t> rows,
                                 std::optional<std::uint64_t> training_batch, std::uint64_t seed,
                                 std::uint64_t first_row, bool flip, float* x_out,
                                 std::int32_t* y_out) {
  const auto width = static_cast<std::size_t>(data.features);
  std::vector<std::uint8_t> bytes(rows.size() * width);
  decode_image_rows(data, rows, training_batch, seed, first_row, flip, bytes.data(), y_out);
  decode_bytes(data.pixel_values, data.channels(), width, rows.size(), bytes.data(), x_out);
}

Dataset decoded_sample(const Dataset& data, std::int64_t most) {
  if (!data.is_image_files())
    throw std::logic_error("decoded_sample: the dataset holds no image files");
  const std::int64_t n = std::min(most, data.rows);
  std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) rows[static_cast<std::size_t>(k)] = k * data.rows / n;
  Dataset out;
  out.rows = n;
  out.features = data.features;
  out.classes = data.classes;
  out.sample_shape = data.sample_shape;
  out.pixel_values = data.pixel_values;
  out.pixels.resize(static_cast<std::size_t>(n * data.features));
  out.y.resize(static_cast<std::size_t>(n));
  decode_image_rows(data, rows, std::nullopt, 0, 0, false, out.pixels.data(), out.y.data());
  return out;
}

}  // namespace mixtrain::core
