// Operand packing, scale arrangement and the epilogue of the block-scaled GEMM (contract in
// cuda_block_scaled_kernels.h).
#include "cuda_block_scaled_kernels.h"

#include <algorithm>

#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

namespace bs = block_scales;

constexpr int kSide = 32;  // a 32 x 32 tile of codes per block of 32 x 8 threads
constexpr int kRowsPerPass = 8;

// out is [outer_pad, k_pad] in 32 x 32 tiles: blockIdx.x is the tile along k, and the tiles
// along outer are ty = blockIdx.y, blockIdx.y + gridDim.y, ... (gridDim.y is capped at 65535).
__global__ void __launch_bounds__(kSide* kRowsPerPass)
    pack_kernel(const std::uint8_t* codes, std::int64_t stored_cols, bool transpose,
                std::int64_t outer, std::int64_t k, std::int64_t outer_pad, std::int64_t k_pad,
                std::uint8_t* out) {
  __shared__ std::uint8_t tile[kSide][kSide + 1];  // [o][kk]
  const std::int64_t tiles_y = (outer_pad + kSide - 1) / kSide;
  const std::int64_t k0 = static_cast<std::int64_t>(blockIdx.x) * kSide;
  const int x = static_cast<int>(threadIdx.x);
  // The bound is the block's own: every thread takes each barrier below.
  for (std::int64_t ty = blockIdx.y; ty < tiles_y; ty += gridDim.y) {
    const std::int64_t o0 = ty * kSide;
    // Reads walk the stored rows (coalesced), writes walk k.
    for (int j = static_cast<int>(threadIdx.y); j < kSide; j += kRowsPerPass) {
      if (transpose) {
        const std::int64_t kk = k0 + j, o = o0 + x;
        tile[x][j] = o < outer && kk < k ? codes[kk * stored_cols + o] : std::uint8_t{0};
      } else {
        const std::int64_t o = o0 + j, kk = k0 + x;
        tile[j][x] = o < outer && kk < k ? codes[o * stored_cols + kk] : std::uint8_t{0};
      }
    }
    __syncthreads();
    for (int j = static_cast<int>(threadIdx.y); j < kSide; j += kRowsPerPass) {
      const std::int64_t o = o0 + j, kk = k0 + x;
      if (o < outer_pad && kk < k_pad) out[o * k_pad + kk] = tile[j][x];
    }
    __syncthreads();  // the next tile rewrites `tile`
  }                   // tiles along outer
}

__global__ void __launch_bounds__(kThreads)
    arrange_kernel(const float* scales, bs::ScaleSource source, bool two_d, std::int64_t outer,
                   std::int64_t k, float* out) {
  const std::int64_t L = (k + 127) / 128;
  const std::int64_t count = two_d ? bs::blk128_count(outer, L) : bs::vec128_count(outer, L);
  for (std::int64_t i = global_thread(); i < count; i += grid_threads()) {
    float v = 0.0f;
    if (two_d) {
      const std::int64_t l4 = bs::round_up(L, 4), ob = i / l4, l = i % l4;
      if (l < L) v = scales[bs::sdk_scale_index(source, ob * 128, l * 128)];
    } else {
      const std::int64_t pad = bs::round_up(outer, 4), l = i / pad, o = i % pad;
      if (o < outer) v = scales[bs::sdk_scale_index(source, o, l * 128)];
    }
    out[i] = v;
  }
}

// out is [outer_pad, k_pad / 2] bytes; one thread per byte.
__global__ void __launch_bounds__(kThreads)
    pack_e2m1_kernel(const std::uint8_t* codes, std::int64_t stored_cols, bool transpose,
                     std::int64_t outer, std::int64_t k, std::int64_t outer_pad, std::int64_t k_pad,
                     std::uint8_t* out) {
  const std::int64_t half = k_pad / 2;
  for (std::int64_t i = global_thread(); i < outer_pad * half; i += grid_threads()) {
    const std::int64_t o = i / half, kk = i % half * 2;
    std::uint8_t pair[2] = {0, 0};
    for (int j = 0; j < 2; ++j)
      if (o < outer && kk + j < k)
        pair[j] = transpose ? codes[(kk + j) * stored_cols + o] : codes[o * stored_cols + kk + j];
    out[i] = bs::e2m1_pair(pair[0], pair[1]);
  }
}

// One thread per (o, l) of the padded [round_up(outer, 128), round_up(L, 4)] grid: tiled_offset is
// a bijection onto [0, tiled_count), so every slot is written once.
__global__ void __launch_bounds__(kThreads)
    arrange_bytes_kernel(const float* scales, bs::ScaleSource source, std::int64_t k_block,
                         bool e8m0, std::int64_t outer, std::int64_t k, std::int64_t L,
                         std::uint8_t* out) {
  const std::int64_t l4 = bs::round_up(L, 4), count = bs::round_up(outer, 128) * l4;
  for (std::int64_t i = global_thread(); i < count; i += grid_threads()) {
    const std::int64_t o = i / l4, l = i % l4;
    out[bs::tiled_offset(o, l, L)] =
        bs::tiled_scale_byte(scales, source, k_block, e8m0, outer, k, o, l);
  }
}

__global__ void scalars_kernel(float alpha, float beta, const float* ta, const float* tb,
                               float* out) {
  const float a = ta != nullptr ? *ta : 1.0f, b = tb != nullptr ? *tb : 1.0f;
  out[0] = __fmul_rn(alpha, __fmul_rn(a, b));
  out[1] = beta;
}

__global__ void __launch_bounds__(kThreads)
    epilogue_kernel(const float* d, std::int64_t ldd, std::int64_t m, std::int64_t n, void* c,
                    Elem c_elem, float beta, const float* bias, bool has_activation, int act,
                    void* pre, Elem pre_elem) {
  for (std::int64_t i = global_thread(); i < m * n; i += grid_threads()) {
    const std::int64_t row = i / n, col = i % n;
    float z = d[row * ldd + col];
    if (beta != 0.0f) z += beta * load(c, c_elem, i);
    if (bias != nullptr) z += bias[col];
    if (pre != nullptr) store(pre, pre_elem, i, z);
    const float y = !has_activation ? z
                    : act == 0      ? element::activation<0>(z)
                                    : element::activation<1>(z);
    store(c, c_elem, i, y);
  }
}

}  // namespace

cudaError_t pack_codes_k_major(const std::uint8_t* codes, std::int64_t stored_cols, bool transpose,
                               std::int64_t outer, std::int64_t k, std::int64_t outer_pad,
                               std::int64_t k_pad, std::uint8_t* out, cudaStream_t stream) {
  if (outer_pad <= 0 || k_pad <= 0) return cudaSuccess;
  const std::int64_t gy = std::min<std::int64_t>((outer_pad + kSide - 1) / kSide, 65535);
  const std::int64_t gx = (k_pad + kSide - 1) / kSide;
  if (gx > INT32_MAX) return cudaErrorInvalidValue;
  pack_kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)),
                dim3(kSide, kRowsPerPass), 0, stream>>>(codes, stored_cols, transpose, outer, k,
                                                        outer_pad, k_pad, out);
  return cudaGetLastError();
}

cudaError_t arrange_fp32_scales(const float* scales, const block_scales::ScaleSource& source,
                                bool two_d, std::int64_t outer, std::int64_t k, float* out,
                                cudaStream_t stream) {
  const std::int64_t L = (k + 127) / 128;
  const std::int64_t count =
      two_d ? block_scales::blk128_count(outer, L) : block_scales::vec128_count(outer, L);
  if (count == 0) return cudaSuccess;
  arrange_kernel<<<grid_for(count), kThreads, 0, stream>>>(scales, source, two_d, outer, k, out);
  return cudaGetLastError();
}

cudaError_t pack_e2m1_k_major(const std::uint8_t* codes, std::int64_t stored_cols, bool transpose,
                              std::int64_t outer, std::int64_t k, std::int64_t outer_pad,
                              std::int64_t k_pad, std::uint8_t* out, cudaStream_t stream) {
  if (k_pad % 2 != 0) return cudaErrorInvalidValue;
  if (outer_pad <= 0 || k_pad <= 0) return cudaSuccess;
  pack_e2m1_kernel<<<grid_for(outer_pad * (k_pad / 2)), kThreads, 0, stream>>>(
      codes, stored_cols, transpose, outer, k, outer_pad, k_pad, out);
  return cudaGetLastError();
}

cudaError_t arrange_byte_scales(const float* scales, const block_scales::ScaleSource& source,
                                std::int64_t k_block, bool e8m0, std::int64_t outer, std::int64_t k,
                                std::int64_t k_pad, std::uint8_t* out, cudaStream_t stream) {
  if (k_block < 1 || k_pad < k || k_pad % (4 * k_block) != 0) return cudaErrorInvalidValue;
  const std::int64_t L = k_pad / k_block;
  const std::int64_t count = block_scales::tiled_count(outer, L);
  if (count == 0) return cudaSuccess;
  arrange_bytes_kernel<<<grid_for(count), kThreads, 0, stream>>>(scales, source, k_block, e8m0,
                                                                 outer, k, L, out);
  return cudaGetLastError();
}

cudaError_t block_gemm_scalars(float alpha, float beta, const float* tensor_scale_a,
                               const float* tensor_scale_b, float* out, cudaStream_t stream) {
  scalars_kernel<<<1, 1, 0, stream>>>(alpha, beta, tensor_scale_a, tensor_scale_b, out);
  return cudaGetLastError();
}

cudaError_t block_gemm_epilogue(const float* d, std::int64_t ldd, std::int64_t m, std::int64_t n,
                                void* c, Elem c_elem, float beta, const float* bias,
                                bool has_activation, int act, void* pre_activation, Elem pre_elem,
                                cudaStream_t stream) {
  if (m * n == 0) return cudaSuccess;
  epilogue_kernel<<<grid_for(m * n), kThreads, 0, stream>>>(
      d, ldd, m, n, c, c_elem, beta, bias, has_activation, act, pre_activation, pre_elem);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
