// Byte images (dataset.h): images whose pixels stay bytes, with a per-channel table of what each
// byte stands for. Why: an image file's pixels are bytes, and held as floats they take four times
// the host memory and cross the host-device link at four times the bytes. The table carries the
// scaling and the normalisation, so decoding is one lookup, on the host or on the device
// (sdk/backend_image_input.h), and gives the floats the float form holds, bit for bit.
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "data/byte_images.h"
#include "data/image_folder/image_batch.h"

namespace mixtrain::core {

std::vector<float> unit_byte_values(std::int64_t channels) {
  std::vector<float> table(static_cast<std::size_t>(channels) * 256);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i % 256) / 255.0f;
  return table;
}

void decode_bytes(const std::vector<float>& table, std::int64_t channels, std::size_t width,
                  std::size_t rows, const std::uint8_t* bytes, float* out) {
  const std::size_t plane = width / static_cast<std::size_t>(channels);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t k = 0; k < width; ++k)
      out[r * width + k] = table[(k / plane) * 256 + bytes[r * width + k]];
}

void store_image_bytes(Dataset& data, std::vector<std::uint8_t> bytes, bool keep_bytes) {
  if (keep_bytes && data.is_image()) {
    data.x.clear();
    data.x.shrink_to_fit();
    data.pixels = std::move(bytes);
    data.pixel_values = unit_byte_values(data.channels());
    return;
  }
  data.x.resize(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) data.x[i] = static_cast<float>(bytes[i]) / 255.0f;
}

void gather_pixels(const Dataset& data, std::span<const std::int64_t> rows,
                   std::uint8_t* pixels_out, std::int32_t* y_out) {
  if (!data.is_bytes())
    throw std::logic_error("gather_pixels: the dataset does not hold byte images");
  if (data.is_image_files()) {
    decode_image_rows(data, rows, std::nullopt, 0, 0, false, pixels_out, y_out);
    return;
  }
  const auto width = static_cast<std::size_t>(data.features);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int64_t row = rows[i];
    if (row < 0 || row >= data.rows)
      throw std::out_of_range("gather_pixels: row " + std::to_string(row) + " outside [0, " +
                              std::to_string(data.rows) + ")");
    const auto r = static_cast<std::size_t>(row);
    std::memcpy(pixels_out + i * width, data.pixels.data() + r * width, width);
    if (y_out != nullptr) y_out[i] = data.y[r];
  }
}

void decode_pixels(Dataset& data) {
  if (!data.is_bytes() || data.is_image_files()) return;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(data.rows));
  std::iota(rows.begin(), rows.end(), std::int64_t{0});
  data.x.resize(data.pixels.size());
  gather_batch(data, rows, data.x.data(), nullptr);  // decodes through the table
  data.pixels.clear();
  data.pixels.shrink_to_fit();
  data.pixel_values.clear();
}

}  // namespace mixtrain::core
