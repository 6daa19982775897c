// The FP8 cast-transpose: tiles of 64 x 64 elements. A block reads a tile of src row by row,
// encodes each element once (cast's function, cuda_element_math.h), writes the codes of the
// stored layout at once and keeps them in shared memory, then writes the tile's columns as rows of
// the transposed output. Each thread moves 4 elements at a time where every row of both outputs
// starts 4-byte aligned (rows and cols multiples of 4, aligned pointers), else single elements:
// the same codes either way.
#include <algorithm>

#include "cuda_cast_transpose.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

constexpr int kTile = 64;
constexpr int kVec =
    4;  // elements per thread: 4 columns on the read, 4 rows on the transposed write
constexpr int kGroups = kTile / kVec;  // threads per tile row

template <class T>
struct alignas(kVec * sizeof(T)) Quad {
  T v[kVec];
};

// src is [rows, cols]; out [rows, cols] and out_t [cols, rows] (either null). `vectorised`: rows
// and cols are multiples of 4 and every pointer is aligned to 4 of its elements.
template <class Src, class Dst>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_kernel(const elem_t<Src>* src, std::uint8_t* out, std::uint8_t* out_t,
                          std::int64_t rows, std::int64_t cols, float scale, bool saturate,
                          bool vectorised, float* amax) {
  // +1 byte a row: in the transposed read the 16 threads of a column read rows 4 apart, 260 bytes
  // = 65 words, so 16 different banks (with rows of 68 bytes threads 8 apart shared one).
  __shared__ std::uint8_t tile[kTile][kTile + 1];
  std::uint32_t m = 0;  // max |x| as fp32 bits, as cast's
  auto encode = [&](elem_t<Src> s) {
    const float x = Src::load(s);
    m = max(m, element::abs_bits(x));
    return static_cast<std::uint8_t>(Dst::store(scale != 1.0f ? x * scale : x, saturate));
  };
  const std::int64_t tiles_c = (cols + kTile - 1) / kTile;
  const std::int64_t tiles = tiles_c * ((rows + kTile - 1) / kTile);
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
    // The read: thread i takes columns 4·(i % 16) .. +3 of tile row i / 16.
    for (int i = threadIdx.x; i < kTile * kGroups; i += blockDim.x) {
      const int r = i / kGroups, c = i % kGroups * kVec;
      const std::int64_t gr = r0 + r, gc = c0 + c;
      if (gr >= rows || gc >= cols) continue;
      if (vectorised) {  // gc + 4 <= cols: cols is a multiple of 4
        const Quad<elem_t<Src>> in =
            *reinterpret_cast<const Quad<elem_t<Src>>*>(src + gr * cols + gc);
        Quad<std::uint8_t> codes;
#pragma unroll
        for (int k = 0; k < kVec; ++k) codes.v[k] = tile[r][c + k] = encode(in.v[k]);
        if (out != nullptr) *reinterpret_cast<Quad<std::uint8_t>*>(out + gr * cols + gc) = codes;
      } else {
        for (int k = 0; k < kVec && gc + k < cols; ++k) {
          const std::uint8_t code = tile[r][c + k] = encode(src[gr * cols + gc + k]);
          if (out != nullptr) out[gr * cols + gc + k] = code;
        }
      }
    }
    __syncthreads();
    // The transposed write: thread i takes rows 4·(i % 16) .. +3 of tile column i / 16, which are
    // 4 consecutive bytes of out_t's row c0 + i / 16.
    if (out_t != nullptr) {
      for (int i = threadIdx.x; i < kTile * kGroups; i += blockDim.x) {
        const int c = i / kGroups, r = i % kGroups * kVec;
        const std::int64_t gr = r0 + r, gc = c0 + c;
        if (gr >= rows || gc >= cols) continue;
        if (vectorised) {  // gr + 4 <= rows: rows is a multiple of 4
          Quad<std::uint8_t> codes;
#pragma unroll
          for (int k = 0; k < kVec; ++k) codes.v[k] = tile[r + k][c];
          *reinterpret_cast<Quad<std::uint8_t>*>(out_t + gc * rows + gr) = codes;
        } else {
          for (int k = 0; k < kVec && gr + k < rows; ++k)
            out_t[gc * rows + gr + k] = tile[r + k][c];
        }
      }
    }
    __syncthreads();  // the next tile rewrites the shared one
  }
  if (amax != nullptr) fold_amax(amax, m);
}

bool aligned_to(const void* p, std::size_t bytes) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace

cudaError_t cast_transpose(const void* src, Elem src_t, void* out, void* out_t, Elem dst_t,
                           std::int64_t rows, std::int64_t cols, float scale, bool saturate,
                           float* amax, cudaStream_t stream) {
  if ((rows == 0 || cols == 0) && amax == nullptr) return cudaSuccess;
  if (dst_t != Elem::e4m3 && dst_t != Elem::e5m2) return cudaErrorInvalidValue;
  const std::int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  bool known = false;
  with_float_storage(src_t, [&](auto src_tag) {
    using Src = decltype(src_tag);
    const bool vectorised = rows % kVec == 0 && cols % kVec == 0 &&
                            aligned_to(src, kVec * sizeof(elem_t<Src>)) && aligned_to(out, kVec) &&
                            aligned_to(out_t, kVec);
    auto launch = [&](auto dst_tag) {
      using Dst = decltype(dst_tag);
      cast_transpose_kernel<Src, Dst>
          <<<grid_for(std::max<std::int64_t>(tiles, 1), 1), kThreads, 0, stream>>>(
              static_cast<const elem_t<Src>*>(src), static_cast<std::uint8_t*>(out),
              static_cast<std::uint8_t*>(out_t), rows, cols, scale, saturate, vectorised, amax);
      known = true;
    };
    if (dst_t == Elem::e4m3)
      launch(storage::E4M3{});
    else
      launch(storage::E5M2{});
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
