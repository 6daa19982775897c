// Max pooling's NaN and -inf windows: see cpu_max_pool_specials.h for the contract.
#include "cpu_max_pool_specials.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_access.h"

namespace mixtrain::backend_cpu {

namespace {

// The format's bit patterns: |bits| above infinity is a NaN (either sign); negative infinity is
// one pattern. Integer compares vectorise where float compares against NaN would not fold.
template <class U>
bool scan_bits(const U* bits, std::int64_t n, U magnitude_mask, U infinity, U negative_infinity) {
  int found = 0;
#pragma omp parallel for schedule(static) reduction(| : found) if (parallel_worth(n))
  for (std::int64_t i = 0; i < n; ++i) {
    const U b = bits[i];
    found |= static_cast<int>((b & magnitude_mask) > infinity) |
             static_cast<int>(b == negative_infinity);
  }
  return found != 0;
}

}  // namespace

bool holds_nan_or_negative_infinity(const sdk::TensorView& x) {
  const std::int64_t n = x.numel();
  switch (x.dtype) {
    case sdk::DType::bf16:
      return scan_bits<std::uint16_t>(static_cast<const std::uint16_t*>(x.data), n, 0x7FFF, 0x7F80,
                                      0xFF80);
    case sdk::DType::fp16:
      return scan_bits<std::uint16_t>(static_cast<const std::uint16_t*>(x.data), n, 0x7FFF, 0x7C00,
                                      0xFC00);
    default:
      return scan_bits<std::uint32_t>(static_cast<const std::uint32_t*>(x.data), n, 0x7FFFFFFFu,
                                      0x7F800000u, 0xFF800000u);
  }
}

void restore_max_pool_specials(const sdk::Pool2dGeometry& g, const sdk::TensorView& x,
                               const sdk::TensorView& y) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), c_n = g.channels;
  std::vector<float> xv(static_cast<std::size_t>(x.numel())),
      yv(static_cast<std::size_t>(y.numel()));
  decode_tensor(x, 1.0f, false, xv.data(), x.numel());
  decode_tensor(y, 1.0f, false, yv.data(), y.numel());
  constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
  bool changed = false;
  for (std::int64_t n = 0; n < g.batch; ++n)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        for (std::int64_t c = 0; c < c_n; ++c) {
          bool nan = false, all_negative_infinity = true;
          for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
            const std::int64_t ih = oh * g.stride_h - g.pad_h + kh;
            if (ih < 0 || ih >= g.height) continue;
            for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
              const std::int64_t iw = ow * g.stride_w - g.pad_w + kw;
              if (iw < 0 || iw >= g.width) continue;
              const float v =
                  xv[static_cast<std::size_t>(((n * g.height + ih) * g.width + iw) * c_n + c)];
              nan = nan || std::isnan(v);
              all_negative_infinity = all_negative_infinity && v == kNegativeInfinity;
            }
          }
          if (!nan && !all_negative_infinity) continue;
          yv[static_cast<std::size_t>(((n * oh_n + oh) * ow_n + ow) * c_n + c)] =
              nan ? std::numeric_limits<float>::quiet_NaN() : kNegativeInfinity;
          changed = true;
        }
  if (changed) encode_tensor(y, yv.data(), y.numel());
}

}  // namespace mixtrain::backend_cpu
