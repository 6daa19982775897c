// The image_input facet's decode kernel (cuda_image_decode.h): each pixel looked up in its
// channel's row of the table and rounded once into y's dtype.
//
// Why a 2-D grid: blocks along y walk the planes, so every thread knows its plane's channel
// (q % channels, once per plane) without a 64-bit division per pixel; blocks along x walk the
// pixels of one plane. The table (1 KiB per channel) is read through the read-only cache: the
// kernel is bound by the bytes of y it writes, four per byte it reads for fp32.
#include <algorithm>

#include "cuda_device.cuh"
#include "cuda_image_decode.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

// Four elements of y moved as one 16-byte (fp32) or 8-byte (bf16, fp16) store.
template <class T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

// pixels is [rows, channels, plane] bytes, walked as [planes, plane] (planes = rows·channels);
// table is fp32 [channels, 256]; y is [rows, channels, plane] in S, walked the same way.
// kQuads: plane % 4 == 0 and both pointers aligned for Quad (the launcher checked).
template <class S, bool kQuads>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const std::uint8_t* __restrict__ pixels, const float* __restrict__ table,
                  elem_t<S>* __restrict__ y, std::int64_t planes, std::int64_t channels,
                  std::int64_t plane) {
  using T = elem_t<S>;
  const std::int64_t first = global_thread(), stride = grid_threads();
  for (std::int64_t q = blockIdx.y; q < planes; q += gridDim.y) {
    const float* row = table + (q % channels) * 256;  // this plane's channel
    const std::uint8_t* in = pixels + q * plane;      // [plane] bytes
    T* out = y + q * plane;                           // [plane] elements
    if constexpr (kQuads) {
      const auto* in4 = reinterpret_cast<const uchar4*>(in);
      auto* out4 = reinterpret_cast<Quad<T>*>(out);
      for (std::int64_t w = first; w < plane / 4; w += stride) {
        const uchar4 b = in4[w];
        Quad<T> o;
        o.v[0] = S::store(__ldg(row + b.x), false);
        o.v[1] = S::store(__ldg(row + b.y), false);
        o.v[2] = S::store(__ldg(row + b.z), false);
        o.v[3] = S::store(__ldg(row + b.w), false);
        out4[w] = o;
      }
    } else {
      for (std::int64_t p = first; p < plane; p += stride)
        out[p] = S::store(__ldg(row + in[p]), false);
    }
  }
}

bool aligned_to(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace

cudaError_t decode_images(const std::uint8_t* pixels, const float* table, void* y, Elem yt,
                          std::int64_t planes, std::int64_t channels, std::int64_t plane,
                          cudaStream_t stream) {
  if (planes == 0 || plane == 0) return cudaSuccess;
  if (channels <= 0) return cudaErrorInvalidValue;
  const bool known = with_float_storage(yt, [&](auto tag) {
    using S = decltype(tag);
    using T = elem_t<S>;
    const bool quads = plane % 4 == 0 && aligned_to(pixels, 4) && aligned_to(y, sizeof(Quad<T>));
    const unsigned bx = grid_for(quads ? plane / 4 : plane);
    // Planes beyond gridDim.y (at most 65535) are walked by the loop; x·y blocks stay near 2^20.
    const auto by = static_cast<unsigned>(std::min<std::int64_t>(
        {planes, 65535, std::max<std::int64_t>(1, (std::int64_t{1} << 20) / bx)}));
    const dim3 grid(bx, by);
    auto* out = static_cast<T*>(y);
    if (quads)
      decode_kernel<S, true>
          <<<grid, kThreads, 0, stream>>>(pixels, table, out, planes, channels, plane);
    else
      decode_kernel<S, false>
          <<<grid, kThreads, 0, stream>>>(pixels, table, out, planes, channels, plane);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
