// Max pooling's loops (contract in cpu_max_pool.h).
#include "cpu_max_pool.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_access.h"
#include "cpu_bf16_bits.h"
#include "cpu_isa.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu {

using sdk::Pool2dGeometry;
using sdk::TensorView;

namespace {

// The loops read fp32 and bf16 storage in place (cpu_bf16_bits.h's load_as_float, a shift for
// bf16) and fp16 decoded a row at a time into fp32 scratch (F16C, sdk/float_formats.h).
template <class T>
bool reads_in_place(const TensorView& v) {
  return std::is_same_v<T, Bf16Bits> ? v.dtype == sdk::DType::bf16 : sdk::is_fp32_storage(v.dtype);
}

// Elements [first, first + count) of v as the loops read them: bf16 in place, else cpu_access.h's
// read_chunk (fp32 in place, fp16 decoded into `buffer`).
template <class T>
const T* row_of(const TensorView& v, std::int64_t first, std::int64_t count, float* buffer) {
  if constexpr (std::is_same_v<T, Bf16Bits>)
    return static_cast<const Bf16Bits*>(v.data) + first;
  else
    return read_chunk(v, first, count, buffer);
}

// A window's NaN, whatever its sign and payload: the canonical quiet NaN (backend_convolution.h).
constexpr float kQuietNan = std::numeric_limits<float>::quiet_NaN();

// One output row (n, oh): y [OW, C] and its indices from the window's input rows, rows[kh] the
// decoded row ih = oh·SH − PH + kh ([W, C]), or null outside the image.
template <class T, class I>
[[gnu::always_inline]] inline void max_row(const Pool2dGeometry* g, const T* const* rows, float* y,
                                           I* idx) {
  const std::int64_t c_n = g->channels, ow_n = g->out_width();
  for (std::int64_t ow = 0; ow < ow_n; ++ow) {
    float* best = y + ow * c_n;
    I* at = idx + ow * c_n;
    bool first = true;
    for (std::int64_t kh = 0; kh < g->kernel_h; ++kh) {
      if (rows[kh] == nullptr) continue;
      for (std::int64_t kw = 0; kw < g->kernel_w; ++kw) {
        const std::int64_t iw = ow * g->stride_w - g->pad_w + kw;
        if (iw < 0 || iw >= g->width) continue;
        const T* v = rows[kh] + iw * c_n;
        const I t = static_cast<I>(kh * g->kernel_w + kw);
        if (first) {
#pragma omp simd
          for (std::int64_t c = 0; c < c_n; ++c) {
            const float e = load_as_float(v, c);
            best[c] = e != e ? kQuietNan : e;
            at[c] = t;
          }
          first = false;
          continue;
        }
#pragma omp simd
        for (std::int64_t c = 0; c < c_n; ++c) {
          const float e = load_as_float(v, c);
          const bool nan = e != e;
          const bool take = e > best[c] || nan;
          best[c] = take ? (nan ? kQuietNan : e) : best[c];
          at[c] = take ? t : at[c];
        }
      }
    }
  }
}

// Adds into acc [W, C] (input row ih) what output row oh sends it: dy [OW, C] where the index
// names the window position (kh, kw) that lands on the column.
template <class T, class I>
[[gnu::always_inline]] inline void gather_row(const Pool2dGeometry* g, std::int64_t kh, const T* dy,
                                              const I* idx, float* acc) {
  const std::int64_t c_n = g->channels, ow_n = g->out_width();
  for (std::int64_t ow = 0; ow < ow_n; ++ow) {
    const T* d = dy + ow * c_n;
    const I* at = idx + ow * c_n;
    for (std::int64_t kw = 0; kw < g->kernel_w; ++kw) {
      const std::int64_t iw = ow * g->stride_w - g->pad_w + kw;
      if (iw < 0 || iw >= g->width) continue;
      const I t = static_cast<I>(kh * g->kernel_w + kw);
      float* o = acc + iw * c_n;
#pragma omp simd
      for (std::int64_t c = 0; c < c_n; ++c) o[c] += at[c] == t ? load_as_float(d, c) : 0.0f;
    }
  }
}

MIXTRAIN_ISA_VARIANTS(max_row)
MIXTRAIN_ISA_VARIANTS(gather_row)

template <class T, class I>
void forward(const Pool2dGeometry& g, const TensorView& x, const TensorView& y, I* indices) {
  const std::int64_t oh_n = g.out_height(), in_row = g.width * g.channels,
                     out_row = g.out_width() * g.channels, rows_n = g.batch * oh_n;
  const bool direct = !y.empty() && sdk::is_fp32_storage(y.dtype);
#pragma omp parallel if (parallel_worth(rows_n * out_row * g.kernel_h * g.kernel_w))
  {
    const bool decode = !reads_in_place<T>(x);
    std::vector<float> decoded(decode ? static_cast<std::size_t>(g.kernel_h * in_row) : 0);
    std::vector<float> out(direct ? 0 : static_cast<std::size_t>(out_row));
    std::vector<I> own(indices != nullptr ? 0 : static_cast<std::size_t>(out_row));
    std::vector<const T*> rows(static_cast<std::size_t>(g.kernel_h));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows_n; ++r) {
      const std::int64_t n = r / oh_n, oh = r % oh_n;
      for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
        const std::int64_t ih = oh * g.stride_h - g.pad_h + kh;
        rows[static_cast<std::size_t>(kh)] =
            ih < 0 || ih >= g.height ? nullptr
                                     : row_of<T>(x, (n * g.height + ih) * in_row, in_row,
                                                 decoded.data() + (decode ? kh * in_row : 0));
      }
      float* y_row = direct ? y.as<float>() + r * out_row : out.data();
      I* idx_row = indices != nullptr ? indices + r * out_row : own.data();
      max_row_best(&g, static_cast<const T* const*>(rows.data()), y_row, idx_row);
      if (!direct && !y.empty()) commit_chunk(y, r * out_row, out_row, y_row);
    }
  }
}

template <class T, class I>
void backward(const Pool2dGeometry& g, const TensorView& dy, const I* indices,
              const TensorView& dx) {
  const std::int64_t oh_n = g.out_height(), in_row = g.width * g.channels,
                     out_row = g.out_width() * g.channels, rows_n = g.batch * g.height;
#pragma omp parallel if (parallel_worth(rows_n * in_row))
  {
    std::vector<float> acc(static_cast<std::size_t>(in_row));
    std::vector<float> decoded(reads_in_place<T>(dy) ? 0 : static_cast<std::size_t>(out_row));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows_n; ++r) {
      const std::int64_t n = r / g.height, ih = r % g.height;
      std::fill(acc.begin(), acc.end(), 0.0f);
      // The output rows whose windows cover ih: oh·SH − PH <= ih <= oh·SH − PH + KH − 1.
      const std::int64_t low = ih + g.pad_h - g.kernel_h + 1;
      const std::int64_t oh0 = low <= 0 ? 0 : (low + g.stride_h - 1) / g.stride_h;
      const std::int64_t oh1 = std::min(oh_n - 1, (ih + g.pad_h) / g.stride_h);
      for (std::int64_t oh = oh0; oh <= oh1; ++oh) {
        const std::int64_t o = (n * oh_n + oh) * out_row;
        gather_row_best(&g, ih - (oh * g.stride_h - g.pad_h),
                        row_of<T>(dy, o, out_row, decoded.data()), indices + o, acc.data());
      }
      commit_chunk(dx, r * in_row, in_row, acc.data());
    }
  }
}

// The storage's loops (bf16 in place, fp32 and decoded fp16 as fp32) for one index type.
template <class I>
void forward_indexed(const Pool2dGeometry& g, const TensorView& x, const TensorView& y,
                     I* indices) {
  if (x.dtype == sdk::DType::bf16)
    forward<Bf16Bits>(g, x, y, indices);
  else
    forward<float>(g, x, y, indices);
}

template <class I>
void backward_indexed(const Pool2dGeometry& g, const TensorView& dy, const I* indices,
                      const TensorView& dx) {
  if (dy.dtype == sdk::DType::bf16)
    backward<Bf16Bits>(g, dy, indices, dx);
  else
    backward<float>(g, dy, indices, dx);
}

bool byte_indices(const Pool2dGeometry& g) {
  return g.kernel_h * g.kernel_w <= 256;
}

}  // namespace

std::size_t max_pool_workspace_bytes(const Pool2dGeometry& g) {
  const std::size_t outputs =
      static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.channels);
  return outputs * (byte_indices(g) ? sizeof(std::uint8_t) : sizeof(std::int32_t));
}

void max_pool_forward(const Pool2dGeometry& g, const TensorView& x, const TensorView& y,
                      void* indices) {
  if (byte_indices(g))
    forward_indexed(g, x, y, static_cast<std::uint8_t*>(indices));
  else
    forward_indexed(g, x, y, static_cast<std::int32_t*>(indices));
}

void max_pool_backward(const Pool2dGeometry& g, const TensorView& dy, const void* indices,
                       const TensorView& dx) {
  if (byte_indices(g))
    backward_indexed(g, dy, static_cast<const std::uint8_t*>(indices), dx);
  else
    backward_indexed(g, dy, static_cast<const std::int32_t*>(indices), dx);
}

}  // namespace mixtrain::backend_cpu
