// Image datasets: per-channel statistics and normalisation, and the seeded training-batch
// augmentation (random crop with padding, horizontal flip).
//
// Augmentation is a pure function of (seed, batch index, position in the batch): each sample
// seeds its own DataRng, so a batch never depends on what was drawn before it and a resumed run
// reproduces it without saved generator state.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/byte_images.h"
#include "data/image_folder/image_batch.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace mixtrain::core {
namespace {

// The stream tag that keeps augmentation's generators apart from every other DataRng stream of
// the run seed (the split's 0, the sampler's epoch + 1, the generators' small numbers).
constexpr std::uint64_t kAugmentDomain = 0x6175676D656E7421ULL;  // "augment!"

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void require_image(const Dataset& data, const char* who) {
  if (!data.is_image())
    throw std::logic_error(std::string(who) +
                           ": the dataset holds no images (sample_shape is not "
                           "[C, H, W])");
}

}  // namespace

ChannelStats channel_statistics(const Dataset& data) {
  require_image(data, "channel_statistics");
  if (data.is_image_files())
    return channel_statistics(decoded_sample(data, kImageStatisticsSample));
  const auto channels = static_cast<std::size_t>(data.channels());
  const auto plane = static_cast<std::size_t>(data.height() * data.width());
  const auto width = static_cast<std::size_t>(data.features);
  const auto rows = static_cast<std::size_t>(data.rows);
  ChannelStats stats;
  stats.mean.assign(channels, 0.0);
  stats.std.assign(channels, 0.0);
  if (rows == 0) return stats;
  // Each pixel's value, read from x or decoded from a byte image's table: the same sums, in the
  // same order, so both forms of the same data give the same statistics.
  const auto value = [&](std::size_t r, std::size_t c, std::size_t i) {
    const std::size_t at = r * width + c * plane + i;
    return static_cast<double>(data.is_bytes() ? data.pixel_values[c * 256 + data.pixels[at]]
                                               : data.x[at]);
  };
  const double count = static_cast<double>(rows) * static_cast<double>(plane);
  // Two passes (mean, then squared deviations): no cancellation for pixels far from zero.
  for (std::size_t c = 0; c < channels; ++c) {
    double sum = 0.0;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < plane; ++i) sum += value(r, c, i);
    const double mean = sum / count;
    double squares = 0.0;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < plane; ++i) {
        const double d = value(r, c, i) - mean;
        squares += d * d;
      }
    stats.mean[c] = mean;
    stats.std[c] = std::sqrt(squares / count);
  }
  return stats;
}

void normalize_channels(Dataset& data, const ChannelStats& stats) {
  require_image(data, "normalize_channels");
  const auto channels = static_cast<std::size_t>(data.channels());
  if (stats.mean.size() != channels || stats.std.size() != channels)
    throw std::invalid_argument("normalize_channels: " + std::to_string(stats.mean.size()) +
                                " means and " + std::to_string(stats.std.size()) +
                                " standard deviations for " + std::to_string(channels) +
                                " channels");
  for (const double s : stats.std)
    if (!(s > 0.0) || !std::isfinite(s))
      throw std::invalid_argument("normalize_channels: a standard deviation is not > 0");
  // torchvision's Normalize: mean and std as float32, then (x - mean) / std in float32, each
  // operation rounded, so a pipeline written in PyTorch gives the same bits.
  const auto normalized = [&](float v, std::size_t c) {
    return normalized_pixel(v, stats.mean[c], stats.std[c]);
  };
  if (data.is_bytes()) {
    for (std::size_t c = 0; c < channels; ++c)
      for (std::size_t b = 0; b < 256; ++b)
        data.pixel_values[c * 256 + b] = normalized(data.pixel_values[c * 256 + b], c);
    return;
  }
  const auto plane = static_cast<std::size_t>(data.height() * data.width());
  const auto width = static_cast<std::size_t>(data.features);
  for (std::size_t r = 0; r < static_cast<std::size_t>(data.rows); ++r)
    for (std::size_t c = 0; c < channels; ++c) {
      float* p = data.x.data() + r * width + c * plane;
      for (std::size_t i = 0; i < plane; ++i) p[i] = normalized(p[i], c);
    }
}

namespace {

// Each row of x, [H, W, C], becomes [C, H, W]: pixel (h, w, c) moves to c·H·W + h·W + w.
template <class T>
void permute_rows_to_channels_first(T* x, std::size_t rows, std::size_t H, std::size_t W,
                                    std::size_t C) {
  std::vector<T> sample(H * W * C);
  for (std::size_t r = 0; r < rows; ++r) {
    T* row = x + r * sample.size();
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t w = 0; w < W; ++w)
        for (std::size_t c = 0; c < C; ++c) sample[(c * H + h) * W + w] = row[(h * W + w) * C + c];
    std::copy(sample.begin(), sample.end(), row);
  }
}

}  // namespace

void channels_last_to_first(Dataset& data) {
  if (data.sample_shape.size() != 3)
    throw std::invalid_argument("channels_last_to_first: the samples are not [H, W, C] images");
  const auto H = static_cast<std::size_t>(data.sample_shape[0]);
  const auto W = static_cast<std::size_t>(data.sample_shape[1]);
  const auto C = static_cast<std::size_t>(data.sample_shape[2]);
  const auto rows = static_cast<std::size_t>(data.rows);
  if (data.is_bytes()) {
    // The table is per channel, so it must still be the loaders' (the same for every channel):
    // the permute comes before any normalisation.
    if (data.pixel_values != unit_byte_values(static_cast<std::int64_t>(H)))
      throw std::logic_error("channels_last_to_first: byte images normalised before the permute");
    permute_rows_to_channels_first(data.pixels.data(), rows, H, W, C);
    data.pixel_values = unit_byte_values(static_cast<std::int64_t>(C));
  } else {
    permute_rows_to_channels_first(data.x.data(), rows, H, W, C);
  }
  data.sample_shape = {static_cast<std::int64_t>(C), static_cast<std::int64_t>(H),
                       static_cast<std::int64_t>(W)};
}

bool implausible_image_layout(const Dataset& data) {
  if (!data.is_image()) return false;
  const auto C = data.channels();
  const bool usual_channels = C == 1 || C == 3 || C == 4;
  return !usual_channels && std::min(data.height(), data.width()) <= 4;
}

void check_image_plausible(const Dataset& data, const std::string& origin, bool channels_last,
                           const sdk::SourceLocation& where, const std::string& key) {
  if (!implausible_image_layout(data)) return;
  const auto C = data.channels(), H = data.height(), W = data.width();
  const std::string found =
      "[N, " + std::to_string(C) + ", " + std::to_string(H) + ", " + std::to_string(W) + "]";
  const std::string read = channels_last ? "channels-last" : "channels-first";
  throw sdk::ConfigError(
      where, key,
      origin + ": images read " + read + " are " + found +
          " (channels, height, width): " + std::to_string(C) + " channels of " + std::to_string(H) +
          "×" + std::to_string(W) + " pixels, which looks like the other layout",
      channels_last ? "set " + key +
                          " = \"nchw\" for [N, C, H, W] arrays (PyTorch's), or "
                          "save non-image data flat as [N, D]"
                    : "set " + key +
                          " = \"nhwc\" for [N, H, W, C] arrays (torchvision's "
                          "CIFAR-10 .data), or save non-image data flat as [N, D]");
}

std::uint64_t augment_stream(std::uint64_t batch_index, std::uint64_t position) {
  return mix64(mix64(batch_index ^ kAugmentDomain) + position);
}

namespace {

template <class T>
void augment_rows(const AugmentSpec& spec, std::span<const std::int64_t> shape,
                  std::span<const T> fill, T* x, std::int64_t rows, std::uint64_t seed,
                  std::uint64_t batch_index, std::uint64_t first_row) {
  if (shape.size() != 3 || shape[0] < 1 || shape[1] < 1 || shape[2] < 1)
    throw std::invalid_argument("augment_batch: the sample shape is not [C, H, W]");
  if (spec.crop_padding < 0) throw std::invalid_argument("augment_batch: crop_padding is negative");
  const auto channels = static_cast<std::size_t>(shape[0]);
  if (fill.size() != channels)
    throw std::invalid_argument("augment_batch: " + std::to_string(fill.size()) +
                                " fill values for " + std::to_string(channels) + " channels");
  if (!spec.enabled() || rows <= 0) return;
  const std::int64_t H = shape[1], W = shape[2], pad = spec.crop_padding;
  const auto plane = static_cast<std::size_t>(H * W);
  const std::size_t width = channels * plane;
  std::vector<T> source(width);
  for (std::int64_t i = 0; i < rows; ++i) {
    DataRng rng(seed, augment_stream(batch_index, first_row + static_cast<std::uint64_t>(i)));
    std::int64_t dy = 0, dx = 0;  // the window's top-left corner in the image (may be < 0)
    if (pad > 0) {
      const auto choices = static_cast<std::uint64_t>(2 * pad + 1);
      dy = static_cast<std::int64_t>(rng.below(choices)) - pad;
      dx = static_cast<std::int64_t>(rng.below(choices)) - pad;
    }
    const bool flip = spec.horizontal_flip && rng.uniform() < 0.5;
    if (dy == 0 && dx == 0 && !flip) continue;
    T* image = x + static_cast<std::size_t>(i) * width;
    std::copy(image, image + width, source.begin());
    for (std::size_t c = 0; c < channels; ++c) {
      const T* in = source.data() + c * plane;
      T* out = image + c * plane;
      for (std::int64_t y = 0; y < H; ++y) {
        const std::int64_t sy = y + dy;
        for (std::int64_t col = 0; col < W; ++col) {
          const std::int64_t sx = (flip ? W - 1 - col : col) + dx;
          out[y * W + col] = (sy < 0 || sy >= H || sx < 0 || sx >= W) ? fill[c] : in[sy * W + sx];
        }
      }
    }
  }
}

}  // namespace

void augment_batch(const AugmentSpec& spec, std::span<const std::int64_t> shape,
                   std::span<const float> fill, float* x, std::int64_t rows, std::uint64_t seed,
                   std::uint64_t batch_index, std::uint64_t first_row) {
  augment_rows(spec, shape, fill, x, rows, seed, batch_index, first_row);
}

void augment_batch(const AugmentSpec& spec, std::span<const std::int64_t> shape, std::uint8_t* x,
                   std::int64_t rows, std::uint64_t seed, std::uint64_t batch_index,
                   std::uint64_t first_row) {
  const std::vector<std::uint8_t> black(
      shape.empty() || shape[0] < 1 ? 0 : static_cast<std::size_t>(shape[0]), 0);
  augment_rows(spec, shape, std::span<const std::uint8_t>(black), x, rows, seed, batch_index,
               first_row);
}

}  // namespace mixtrain::core
