// The GEMM engine's kernels: in-place scale, tiled transpose and the fallback bias add. The
// element-wise ones are templates over the storage types with 16-byte packs when aligned, as
// cuda_cast_fill.cu's.
#include <algorithm>

#include "cuda_device.cuh"
#include "cuda_gemm_kernels.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

template <class S>
__global__ void __launch_bounds__(kThreads)
    scale_kernel(elem_t<S>* x, std::int64_t n, float alpha, bool vectorised) {
  constexpr int V = pack_width<elem_t<S>>();
  auto scaled = [&](elem_t<S> v) { return S::store(S::load(v) * alpha, false); };
  for_each_element<V>(
      n, vectorised,
      [&](std::int64_t i0) {
        Pack<elem_t<S>, V> v = load_pack<V>(x + i0);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = scaled(v.v[k]);
        store_pack<V>(x + i0, v);
      },
      [&](std::int64_t i) { x[i] = scaled(x[i]); });
}

// Tiles of 32 x 32; blockIdx.y strides over row tiles (gridDim.y is capped at 65535).
template <class T>
__global__ void transpose_kernel(const T* in, T* out, std::int64_t rows, std::int64_t cols) {
  __shared__ T tile[32][33];
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  for (std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 32; r0 < rows;
       r0 += static_cast<std::int64_t>(gridDim.y) * 32) {
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      const std::int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[k][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      const std::int64_t c = c0 + k, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][k];
    }
    __syncthreads();  // the tile is rewritten by the next row tile
  }
}

// y[r, :] += bias. blockIdx.y walks rows, x covers columns (packs of V when vectorised: y and
// bias 16-byte aligned and n a multiple of V, so every row starts aligned).
template <class Y, class B>
__global__ void __launch_bounds__(kThreads)
    add_bias_kernel(elem_t<Y>* y, const elem_t<B>* bias, std::int64_t rows, std::int64_t n,
                    bool vectorised) {
  constexpr int V = pack_width<elem_t<Y>, elem_t<B>>();
  auto add = [](elem_t<Y> v, elem_t<B> b) { return Y::store(Y::load(v) + B::load(b), false); };
  const std::int64_t first = global_thread(), stride = grid_threads();
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    elem_t<Y>* row = y + r * n;
    if (vectorised) {
      for (std::int64_t p = first; p < n / V; p += stride) {
        Pack<elem_t<Y>, V> v = load_pack<V>(row + p * V);
        const Pack<elem_t<B>, V> b = load_pack<V>(bias + p * V);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = add(v.v[k], b.v[k]);
        store_pack<V>(row + p * V, v);
      }
    } else {
      for (std::int64_t j = first; j < n; j += stride) row[j] = add(row[j], bias[j]);
    }
  }
}

}  // namespace

cudaError_t scale(void* x, Elem t, std::int64_t n, float alpha, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool known = with_float_storage(t, [&](auto tag) {
    using S = decltype(tag);
    constexpr int V = pack_width<elem_t<S>>();
    const bool vectorised = aligned16(x);
    scale_kernel<S><<<grid_for(vectorised ? (n + V - 1) / V : n), kThreads, 0, stream>>>(
        static_cast<elem_t<S>*>(x), n, alpha, vectorised);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t transpose(const void* in, void* out, std::int64_t rows, std::int64_t cols,
                      int elem_bytes, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32),
                  static_cast<unsigned>(std::min<std::int64_t>((rows + 31) / 32, 65535)));
  switch (elem_bytes) {
    case 1:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint8_t*>(in),
                                                   static_cast<std::uint8_t*>(out), rows, cols);
      break;
    case 2:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint16_t*>(in),
                                                   static_cast<std::uint16_t*>(out), rows, cols);
      break;
    default:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint32_t*>(in),
                                                   static_cast<std::uint32_t*>(out), rows, cols);
      break;
  }
  return cudaGetLastError();
}

cudaError_t add_bias(void* y, Elem yt, const void* bias, Elem bt, std::int64_t rows, std::int64_t n,
                     cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  bool known = false;
  with_float_storage(yt, [&](auto y_tag) {
    with_float_storage(bt, [&](auto b_tag) {
      using Y = decltype(y_tag);
      using B = decltype(b_tag);
      constexpr int V = pack_width<elem_t<Y>, elem_t<B>>();
      const bool vectorised = aligned16(y) && aligned16(bias) && n % V == 0;
      const std::int64_t cols = vectorised ? n / V : n;
      const unsigned gx =
          static_cast<unsigned>(std::min<std::int64_t>((cols + kThreads - 1) / kThreads, 64));
      const unsigned gy = static_cast<unsigned>(std::min<std::int64_t>(rows, 4096));
      add_bias_kernel<Y, B><<<dim3(gx, gy), kThreads, 0, stream>>>(
          static_cast<elem_t<Y>*>(y), static_cast<const elem_t<B>*>(bias), rows, n, vectorised);
      known = true;
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
