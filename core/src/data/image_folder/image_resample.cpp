#include "data/image_folder/image_resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace mixtrain::core {
namespace {

// PIL's fixed point for 8-bit resampling: coefficients carry 22 fraction bits, so a sum of 255 ·
// (coefficients ≈ 1) plus the rounding half stays inside an int32.
constexpr int kPrecisionBits = 32 - 8 - 2;

// One axis of PIL's precompute_coeffs for an input of in_size samples resampled (box [0,
// in_size)) to out_size, restricted to the outputs [first, last): for each, the first input and
// the count it reads, and `ksize` fixed-point coefficients.
struct AxisCoeffs {
  int ksize = 0;
  std::vector<std::int64_t> start, count;
  std::vector<std::int32_t> k;  // [(last − first) · ksize]
};

AxisCoeffs axis_coeffs(std::int64_t in_size, std::int64_t out_size, std::int64_t first,
                       std::int64_t last) {
  // The arithmetic follows PIL's precompute_coeffs operation for operation (double, the same
  // order), so the coefficients and hence the pixels are PIL's to the bit.
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the bilinear (triangle) filter's support is 1
  const double ss = 1.0 / filterscale;
  AxisCoeffs a;
  a.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  const auto n = static_cast<std::size_t>(last - first);
  a.start.resize(n);
  a.count.resize(n);
  a.k.assign(n * static_cast<std::size_t>(a.ksize), 0);
  std::vector<double> w(static_cast<std::size_t>(a.ksize));
  for (std::int64_t xx = first; xx < last; ++xx) {
    const double center = 0.0 + (static_cast<double>(xx) + 0.5) * scale;
    const auto xmin = std::max<std::int64_t>(static_cast<std::int64_t>(center - support + 0.5), 0);
    auto xmax = std::min<std::int64_t>(static_cast<std::int64_t>(center + support + 0.5), in_size);
    xmax -= xmin;
    double ww = 0.0;
    for (std::int64_t x = 0; x < xmax; ++x) {
      double arg = (static_cast<double>(x + xmin) - center + 0.5) * ss;
      if (arg < 0.0) arg = -arg;
      const double v = arg < 1.0 ? 1.0 - arg : 0.0;
      w[static_cast<std::size_t>(x)] = v;
      ww += v;
    }
    const auto i = static_cast<std::size_t>(xx - first);
    std::int32_t* k = a.k.data() + i * static_cast<std::size_t>(a.ksize);
    for (std::int64_t x = 0; x < xmax; ++x) {
      double v = w[static_cast<std::size_t>(x)];
      if (ww != 0.0) v /= ww;
      // The triangle's weights are never negative, so PIL's rounding is always + 0.5.
      k[x] = static_cast<std::int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
    a.start[i] = xmin;
    a.count[i] = xmax;
  }
  return a;
}

inline std::uint8_t clip8(std::int32_t v) {
  return static_cast<std::uint8_t>(std::clamp(v >> kPrecisionBits, 0, 255));
}

// PIL's resample of the sub-image `box` of `src` (treated as an image of its own, as the crop
// PIL makes first is) to out_h × out_w, computing only the output window rows [row0, row0 +
// rows), columns [col0, col0 + cols); the window goes to planar `out` (plane stride
// plane_h · plane_w, row stride plane_w) at (dst_row, dst_col).
void resample_window(const RgbImage& src, PixelBox box, std::int64_t out_h, std::int64_t out_w,
                     std::int64_t row0, std::int64_t rows, std::int64_t col0, std::int64_t cols,
                     std::uint8_t* out, std::int64_t plane_h, std::int64_t plane_w,
                     std::int64_t dst_row, std::int64_t dst_col) {
  if (rows <= 0 || cols <= 0) return;
  const AxisCoeffs horiz = axis_coeffs(box.width, out_w, col0, col0 + cols);
  const AxisCoeffs vert = axis_coeffs(box.height, out_h, row0, row0 + rows);
  // The horizontal pass runs over the input rows the vertical pass reads, as PIL's does (its
  // 8-bit rounding in between is part of the result).
  const std::int64_t y_first = vert.start.front();
  const std::int64_t y_last = vert.start.back() + vert.count.back();
  const auto src_stride = static_cast<std::size_t>(src.width) * 3;
  const auto tmp_stride = static_cast<std::size_t>(cols) * 3;
  std::vector<std::uint8_t> tmp(static_cast<std::size_t>(y_last - y_first) * tmp_stride);
  constexpr std::int32_t kHalf = 1 << (kPrecisionBits - 1);
  for (std::int64_t y = y_first; y < y_last; ++y) {
    const std::uint8_t* in_row = src.pixels.data() +
                                 static_cast<std::size_t>(box.top + y) * src_stride +
                                 static_cast<std::size_t>(box.left) * 3;
    std::uint8_t* tmp_row = tmp.data() + static_cast<std::size_t>(y - y_first) * tmp_stride;
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto ci = static_cast<std::size_t>(c);
      const std::int32_t* k = horiz.k.data() + ci * static_cast<std::size_t>(horiz.ksize);
      const std::uint8_t* p = in_row + static_cast<std::size_t>(horiz.start[ci]) * 3;
      std::int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
      for (std::int64_t x = 0; x < horiz.count[ci]; ++x, p += 3) {
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
      }
      tmp_row[3 * ci] = clip8(s0);
      tmp_row[3 * ci + 1] = clip8(s1);
      tmp_row[3 * ci + 2] = clip8(s2);
    }
  }
  const auto plane = static_cast<std::size_t>(plane_h * plane_w);
  std::vector<std::int32_t> acc(tmp_stride);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    const std::int32_t* k = vert.k.data() + ri * static_cast<std::size_t>(vert.ksize);
    std::fill(acc.begin(), acc.end(), kHalf);
    for (std::int64_t y = 0; y < vert.count[ri]; ++y) {
      const std::uint8_t* t =
          tmp.data() + static_cast<std::size_t>(vert.start[ri] + y - y_first) * tmp_stride;
      const std::int32_t ky = k[y];
      for (std::size_t i = 0; i < tmp_stride; ++i) acc[i] += t[i] * ky;
    }
    const auto dst = static_cast<std::size_t>((dst_row + r) * plane_w + dst_col);
    for (std::size_t c = 0; c < static_cast<std::size_t>(cols); ++c) {
      out[dst + c] = clip8(acc[3 * c]);
      out[plane + dst + c] = clip8(acc[3 * c + 1]);
      out[2 * plane + dst + c] = clip8(acc[3 * c + 2]);
    }
  }
}

void mirror_planes(std::uint8_t* out, std::int64_t height, std::int64_t width) {
  for (std::int64_t row = 0; row < 3 * height; ++row)
    std::reverse(out + row * width, out + (row + 1) * width);
}

void check_image(const RgbImage& src, const char* who) {
  if (src.width < 1 || src.height < 1 ||
      src.pixels.size() != static_cast<std::size_t>(src.width * src.height * 3))
    throw std::invalid_argument(std::string(who) + ": the image is " + std::to_string(src.width) +
                                "x" + std::to_string(src.height) + " with " +
                                std::to_string(src.pixels.size()) + " bytes");
}

void check_out(std::int64_t out_height, std::int64_t out_width, const char* who) {
  if (out_height < 1 || out_width < 1)
    throw std::invalid_argument(std::string(who) + ": output size " + std::to_string(out_height) +
                                "x" + std::to_string(out_width) + " must be at least 1x1");
}

}  // namespace

void resized_crop(const RgbImage& src, PixelBox box, std::int64_t out_height,
                  std::int64_t out_width, bool mirror, std::uint8_t* out) {
  check_image(src, "resized_crop");
  check_out(out_height, out_width, "resized_crop");
  if (box.height < 1 || box.width < 1 || box.top < 0 || box.left < 0 ||
      box.top > src.height - box.height || box.left > src.width - box.width)
    throw std::invalid_argument("resized_crop: box top " + std::to_string(box.top) + " left " +
                                std::to_string(box.left) + " height " + std::to_string(box.height) +
                                " width " + std::to_string(box.width) +
                                " does not lie inside the " + std::to_string(src.height) + "x" +
                                std::to_string(src.width) + " image");
  resample_window(src, box, out_height, out_width, 0, out_height, 0, out_width, out, out_height,
                  out_width, 0, 0);
  if (mirror) mirror_planes(out, out_height, out_width);
}

std::pair<std::int64_t, std::int64_t> resized_size(std::int64_t height, std::int64_t width,
                                                   std::int64_t shorter_side) {
  if (height < 1 || width < 1 || shorter_side < 1 || shorter_side > kMaxImageSide ||
      height > kMaxImageSide || width > kMaxImageSide)
    throw std::invalid_argument("resized_size: " + std::to_string(height) + "x" +
                                std::to_string(width) + " to shorter side " +
                                std::to_string(shorter_side) + " is out of range");
  const bool portrait = width <= height;
  const std::int64_t shorter = portrait ? width : height, longer = portrait ? height : width;
  // Python's int / int is the correctly rounded quotient; both operands are exact doubles here,
  // so one IEEE division gives the same value, then int() truncates.
  const auto new_longer = static_cast<std::int64_t>(static_cast<double>(shorter_side * longer) /
                                                    static_cast<double>(shorter));
  return portrait ? std::pair{new_longer, shorter_side} : std::pair{shorter_side, new_longer};
}

void resize_then_center_crop(const RgbImage& src, std::int64_t shorter_side,
                             std::int64_t out_height, std::int64_t out_width, bool mirror,
                             std::uint8_t* out) {
  check_image(src, "resize_then_center_crop");
  check_out(out_height, out_width, "resize_then_center_crop");
  const auto [rh, rw] = resized_size(src.height, src.width, shorter_side);
  // Per axis, as center_crop computes it: a crop larger than the image pads (the left/top pad
  // (crop − size) // 2) and takes everything; otherwise it starts at round((size − crop) / 2)
  // with Python's half-to-even round.
  struct Span {
    std::int64_t src_first, length, dst_first;
  };
  auto place = [](std::int64_t size, std::int64_t crop) {
    if (crop > size) return Span{0, size, (crop - size) / 2};
    const auto first =
        static_cast<std::int64_t>(std::nearbyint(static_cast<double>(size - crop) / 2.0));
    return Span{first, crop, 0};
  };
  const Span rows = place(rh, out_height), cols = place(rw, out_width);
  if (rows.length < out_height || cols.length < out_width)
    std::memset(out, 0, static_cast<std::size_t>(3 * out_height * out_width));
  resample_window(src, PixelBox{0, 0, src.height, src.width}, rh, rw, rows.src_first, rows.length,
                  cols.src_first, cols.length, out, out_height, out_width, rows.dst_first,
                  cols.dst_first);
  if (mirror) mirror_planes(out, out_height, out_width);
}

}  // namespace mixtrain::core
