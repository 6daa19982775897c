// Device-side helpers shared by the backend's .cu files: storage loads/stores with the SDK's
// rounding rules, tf32 rounding, warp reductions and launch geometry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda_kernels.h"

namespace mixtrain::backend_cuda::kernels {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (at least one, capped: the loop covers the rest).
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 8192) b = 8192;
  return static_cast<unsigned>(b);
}

__device__ __forceinline__ float decode_fp8(std::uint8_t bits, __nv_fp8_interpretation_t kind) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(bits, kind);  // exact: fp8 values fit fp16
  return __half2float(__half(h));
}

__device__ __forceinline__ float load(const void* p, Elem t, std::int64_t i) {
  switch (t) {
    case Elem::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Elem::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case Elem::e4m3: return decode_fp8(static_cast<const std::uint8_t*>(p)[i], __NV_E4M3);
    case Elem::e5m2: return decode_fp8(static_cast<const std::uint8_t*>(p)[i], __NV_E5M2);
    case Elem::i32: return static_cast<float>(static_cast<const std::int32_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Clamp to +-m; NaN compares false and stays NaN.
__device__ __forceinline__ float clamp_finite(float v, float m) {
  return v > m ? m : (v < -m ? -m : v);
}

// RNE to 10 mantissa bits on the fp32 bit pattern (sdk::round_to_tf32).
__device__ __forceinline__ float round_tf32(float x, bool saturate) {
  const unsigned u = __float_as_uint(x);
  const unsigned sign = u & 0x80000000u;
  if ((u & 0x7F800000u) == 0x7F800000u) {
    if ((u & 0x007FFFFFu) != 0) return __uint_as_float((u | 0x00400000u) & ~0x1FFFu);  // NaN
    return saturate ? __uint_as_float(sign | 0x7F7FE000u) : x;                          // inf
  }
  unsigned r = u + 0x0FFFu + ((u >> 13) & 1u);
  r &= ~0x1FFFu;
  if ((r & 0x7F800000u) == 0x7F800000u) r = sign | (saturate ? 0x7F7FE000u : 0x7F800000u);
  return __uint_as_float(r);
}

__device__ __forceinline__ void store(void* p, Elem t, std::int64_t i, float v,
                                      bool saturate = false) {
  switch (t) {
    case Elem::bf16:
      static_cast<__nv_bfloat16*>(p)[i] =
          __float2bfloat16_rn(saturate ? clamp_finite(v, __uint_as_float(0x7F7F0000u)) : v);
      return;
    case Elem::f16:
      static_cast<__half*>(p)[i] = __float2half_rn(saturate ? clamp_finite(v, 65504.0f) : v);
      return;
    case Elem::e4m3:
      static_cast<std::uint8_t*>(p)[i] =
          __nv_cvt_float_to_fp8(v, saturate ? __NV_SATFINITE : __NV_NOSAT, __NV_E4M3);
      return;
    case Elem::e5m2:
      static_cast<std::uint8_t*>(p)[i] =
          __nv_cvt_float_to_fp8(v, saturate ? __NV_SATFINITE : __NV_NOSAT, __NV_E5M2);
      return;
    case Elem::i32: static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v); return;
    default: static_cast<float*>(p)[i] = saturate ? clamp_finite(v, FLT_MAX) : v; return;
  }
}

__device__ __forceinline__ bool nonfinite(float v) {
  return (__float_as_uint(v) & 0x7F800000u) == 0x7F800000u;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

}  // namespace mixtrain::backend_cuda::kernels
