// Launchers of the DeviceBackend core's kernels (cuda_cast_fill.cu): cast and fill over every
// storage type, fp8 included. Contract: cuda_kernel_types.h's; tf32 is RNE on the fp32 bits;
// saturate clamps to the largest finite value, else e4m3 overflow -> NaN, others -> inf; NaNs keep
// sign and top payload bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// dst = encode(decode(src) * scale) (no multiply when scale is 1); tf32_out rounds an f32
// destination to tf32 (RNE). amax (nullable): amax[0] = max(amax[0], max|decode(src)|), or NaN
// (0x7FC00000) if any element or amax[0] is NaN: the CPU backend's rule, also for n == 0.
cudaError_t cast(const void* src, Elem src_t, void* dst, Elem dst_t, bool tf32_out, std::int64_t n,
                 float scale, bool saturate, float* amax, cudaStream_t stream);
// x = value, encoded once (int32: toward zero, saturating, NaN -> 0).
cudaError_t fill(void* x, Elem t, std::int64_t n, float value, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
