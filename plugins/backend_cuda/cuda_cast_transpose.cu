// The FP8 cast-transpose (gemm facet 1.6) and its gradient form (1.7): tiles of 64 x 64 elements,
// a block of 256 threads per tile (grid-stride over tiles).
// - A thread owns 4 columns of the tile and 4 of its rows, 16 apart. It issues all its loads of a
//   tile (src, and gelu's input z) before it encodes or stores anything: the outputs are bytes,
//   which may alias anything, so without that (and restrict) each load waits behind the previous
//   store and a warp keeps one load in flight.
// - Each element's value d is src, or for gelu's gradient src·gelu'(z) rounded into src's dtype
//   (activation_backward's element rule and rounding). d is encoded once (cast's function,
//   cuda_element_math.h); the stored layout is written at once and the codes kept in shared
//   memory, from which the tile's columns are written as rows of the transposed output.
// - Column sums: a thread adds its 4 rows per column in order, the 16 threads of a column group are
//   added in row order in shared memory, and each tile writes one fp32 partial per column,
//   [row tiles, cols]; launch_column_finish adds those in double in tile order. A fixed order for
//   a shape, so the sums are reproducible.
// - 4-element moves (one 8/16-byte load, 4-byte code stores) where rows and cols are multiples of
//   4 and every pointer is aligned, else single elements: the same codes and sums either way.
#include <algorithm>

#include "cuda_cast_transpose.h"
#include "cuda_column_sums.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

constexpr int kTile = 64;
constexpr int kVec = 4;                           // elements a thread moves at a time
constexpr int kGroups = kTile / kVec;             // threads across a tile row: 16
constexpr int kRowsPerPass = kThreads / kGroups;  // tile rows the block reads at once: 16
constexpr int kPasses = kTile / kRowsPerPass;     // a thread's rows of a tile: 4
static_assert(kPasses * kRowsPerPass == kTile && kGroups * kVec == kTile);

template <class T>
struct alignas(kVec * sizeof(T)) Quad {
  T v[kVec];
};

// d for one element: the gradient itself, or (kGelu) dy·gelu'(z) rounded into Src as
// activation_backward writes it.
template <class Src, bool kGelu>
__device__ inline float gradient_value(elem_t<Src> dy, elem_t<Src> z) {
  if constexpr (kGelu)
    return Src::load(Src::store(element::activation_grad<1>(Src::load(z), Src::load(dy)), false));
  else
    return Src::load(dy);
}

// src and z (kGelu) are [rows, cols]; out [rows, cols] and out_t [cols, rows] (either null);
// partial (null: no sums) [ceil(rows / 64), cols]. `vectorised`: rows and cols are multiples of 4
// and every pointer is aligned to 4 of its elements.
template <class Src, class Dst, bool kGelu>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_kernel(const elem_t<Src>* __restrict__ src, const elem_t<Src>* __restrict__ z,
                          std::uint8_t* __restrict__ out, std::uint8_t* __restrict__ out_t,
                          float* __restrict__ partial, std::int64_t rows, std::int64_t cols,
                          float scale, bool saturate, bool vectorised, float* amax) {
  // +1 byte a row: in the transposed read the 16 threads of a column read rows 4 apart, 260 bytes
  // = 65 words, so 16 different banks (with rows of 68 bytes threads 8 apart shared one).
  __shared__ std::uint8_t tile[kTile][kTile + 1];
  __shared__ float sums[kRowsPerPass][kTile];
  using E = elem_t<Src>;
  std::uint32_t m = 0;  // max |d| as fp32 bits, as cast's
  auto encode = [&](float d) {
    m = max(m, element::abs_bits(d));
    return static_cast<std::uint8_t>(Dst::store(scale != 1.0f ? d * scale : d, saturate));
  };
  const int c = threadIdx.x % kGroups * kVec;  // this thread's first column of the tile
  const int row = threadIdx.x / kGroups;       // and its first row; the others are 16 apart
  const std::int64_t tiles_c = (cols + kTile - 1) / kTile;
  const std::int64_t tiles = tiles_c * ((rows + kTile - 1) / kTile);
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
    const std::int64_t gc = c0 + c;
    float colsum[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (vectorised) {  // gc < cols means gc + 4 <= cols: cols is a multiple of 4
      Quad<E> in[kPasses], zin[kPasses];
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const std::int64_t gr = r0 + row + p * kRowsPerPass;
        if (gc < cols && gr < rows) {
          in[p] = *reinterpret_cast<const Quad<E>*>(src + gr * cols + gc);
          if constexpr (kGelu) zin[p] = *reinterpret_cast<const Quad<E>*>(z + gr * cols + gc);
        }
      }
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int r = row + p * kRowsPerPass;
        const std::int64_t gr = r0 + r;
        if (gc >= cols || gr >= rows) continue;
        Quad<std::uint8_t> codes;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float d = gradient_value<Src, kGelu>(in[p].v[k], kGelu ? zin[p].v[k] : in[p].v[k]);
          colsum[k] += d;
          codes.v[k] = tile[r][c + k] = encode(d);
        }
        if (out != nullptr) *reinterpret_cast<Quad<std::uint8_t>*>(out + gr * cols + gc) = codes;
      }
    } else {
      for (int p = 0; p < kPasses; ++p) {
        const int r = row + p * kRowsPerPass;
        const std::int64_t gr = r0 + r;
        if (gr >= rows) continue;
        for (int k = 0; k < kVec && gc + k < cols; ++k) {
          const std::int64_t at = gr * cols + gc + k;
          const float d = gradient_value<Src, kGelu>(src[at], kGelu ? z[at] : src[at]);
          colsum[k] += d;
          const std::uint8_t code = tile[r][c + k] = encode(d);
          if (out != nullptr) out[at] = code;
        }
      }
    }
    if (partial != nullptr) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) sums[row][c + k] = colsum[k];
    }
    __syncthreads();
    if (partial != nullptr && threadIdx.x < kTile && c0 + threadIdx.x < cols) {
      float s = 0.0f;
      for (int i = 0; i < kRowsPerPass; ++i) s += sums[i][threadIdx.x];
      partial[r0 / kTile * cols + c0 + threadIdx.x] = s;
    }
    // The transposed write: thread i takes rows 4·(i % 16) .. +3 of tile column i / 16, which are
    // 4 consecutive bytes of out_t's row c0 + i / 16.
    if (out_t != nullptr) {
      for (int i = threadIdx.x; i < kTile * kGroups; i += blockDim.x) {
        const int tc = i / kGroups, tr = i % kGroups * kVec;
        const std::int64_t gr = r0 + tr, gcol = c0 + tc;
        if (gr >= rows || gcol >= cols) continue;
        if (vectorised) {  // gr + 4 <= rows: rows is a multiple of 4
          Quad<std::uint8_t> codes;
#pragma unroll
          for (int k = 0; k < kVec; ++k) codes.v[k] = tile[tr + k][tc];
          *reinterpret_cast<Quad<std::uint8_t>*>(out_t + gcol * rows + gr) = codes;
        } else {
          for (int k = 0; k < kVec && gr + k < rows; ++k)
            out_t[gcol * rows + gr + k] = tile[tr + k][tc];
        }
      }
    }
    __syncthreads();  // the next tile rewrites the shared ones
  }
  if (amax != nullptr) fold_amax(amax, m);
}

bool aligned_to(const void* p, std::size_t bytes) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

std::int64_t row_tiles(std::int64_t rows) {
  return (rows + kTile - 1) / kTile;
}

}  // namespace

std::size_t cast_transpose_sum_scratch(std::int64_t rows, std::int64_t cols) {
  return static_cast<std::size_t>(row_tiles(rows) * cols);
}

cudaError_t cast_transpose_gradient(const void* src, const void* gelu_input, Elem src_t, void* out,
                                    void* out_t, Elem dst_t, std::int64_t rows, std::int64_t cols,
                                    float scale, bool saturate, float* amax, float* column_sums,
                                    bool accumulate, float* partial, cudaStream_t stream) {
  if (dst_t != Elem::e4m3 && dst_t != Elem::e5m2) return cudaErrorInvalidValue;
  if (column_sums != nullptr && partial == nullptr) return cudaErrorInvalidValue;
  if ((rows == 0 || cols == 0) && amax == nullptr && column_sums == nullptr) return cudaSuccess;
  const std::int64_t tiles = row_tiles(rows) * ((cols + kTile - 1) / kTile);
  float* sums_partial = column_sums != nullptr ? partial : nullptr;
  bool known = false;
  with_float_storage(src_t, [&](auto src_tag) {
    using Src = decltype(src_tag);
    using E = elem_t<Src>;
    const bool vectorised = rows % kVec == 0 && cols % kVec == 0 &&
                            aligned_to(src, kVec * sizeof(E)) &&
                            aligned_to(gelu_input, kVec * sizeof(E)) && aligned_to(out, kVec) &&
                            aligned_to(out_t, kVec);
    auto launch = [&](auto dst_tag, auto gelu_tag) {
      using Dst = decltype(dst_tag);
      cast_transpose_kernel<Src, Dst, decltype(gelu_tag)::value>
          <<<grid_for(std::max<std::int64_t>(tiles, 1), 1), kThreads, 0, stream>>>(
              static_cast<const E*>(src), static_cast<const E*>(gelu_input),
              static_cast<std::uint8_t*>(out), static_cast<std::uint8_t*>(out_t), sums_partial,
              rows, cols, scale, saturate, vectorised, amax);
      known = true;
    };
    auto with_gelu = [&](auto dst_tag) {
      if (gelu_input != nullptr)
        launch(dst_tag, std::true_type{});
      else
        launch(dst_tag, std::false_type{});
    };
    if (dst_t == Elem::e4m3)
      with_gelu(storage::E4M3{});
    else
      with_gelu(storage::E5M2{});
  });
  if (!known) return cudaErrorInvalidValue;
  if (column_sums != nullptr)
    launch_column_finish(partial, nullptr, row_tiles(rows), cols, column_sums, nullptr, accumulate,
                         stream);
  return cudaGetLastError();
}

cudaError_t cast_transpose(const void* src, Elem src_t, void* out, void* out_t, Elem dst_t,
                           std::int64_t rows, std::int64_t cols, float scale, bool saturate,
                           float* amax, cudaStream_t stream) {
  return cast_transpose_gradient(src, nullptr, src_t, out, out_t, dst_t, rows, cols, scale,
                                 saturate, amax, nullptr, false, nullptr, stream);
}

}  // namespace mixtrain::backend_cuda::kernels
