// Launcher of the MXFP8 / NVFP4 quantize (the gemm facet's quantize_block_scaled on CUDA for the
// layouts with 8-bit block scales: E8M0 per 1 x 32 or 32 x 1, E4M3 per 1 x 16, 16 x 1 or 16 x 16
// with an fp32 tensor scale).
//
// Contract (beyond cuda_kernel_types.h's)
// - src [rows, cols] (fp32, bf16 or fp16, row-major); one output per call: codes [rows, cols], one
//   byte per element (E4M3 / E5M2 / E2M1 code in the low bits, as the SDK stores them), scales
//   the row-major grid of fp32 decode scales [ceil(rows / block_rows), ceil(cols / block_cols)]
//   (2^k for E8M0, the E4M3 value for NVFP4), and for NVFP4 tensor_scale, one fp32 S_dec. A
//   `transposed` output holds srcᵀ's: codes [cols, rows] and the transposed grid (backend_gemm.h,
//   1.4); the stochastic bits stay keyed by src's index.
// - Three kernels in stream order, src read twice: each block's statistics (held in the block's
//   scale slot as bits; NVFP4 also folds the finite blocks' amax into *global_amax with an
//   integer atomicMax, order-free), then each block's decode scale over them, then every code.
//   The values are sdk::quantize_block_scaled()'s bit for bit (cuda_block_quantize_math.h); with
//   `stochastic`, element (r, c) rounds with random_bits(seed, r * cols + c).
// - global_amax: one device word of scratch, used only by NVFP4 (the launcher zeroes it). An empty
//   src launches no block kernels but still writes NVFP4's tensor_scale (1, as the SDK does).
// - Block extents < 1, a missing pointer, or rows / cols < 0 return cudaErrorInvalidValue and
//   launch nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_block_quantize_math.h"
#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

struct ByteScaledQuantizeOutput {
  std::uint8_t* codes = nullptr;
  float* scales = nullptr;
  float* tensor_scale = nullptr;  // NVFP4 only
  int block_rows = 1, block_cols = 32;  // src's block extents, also for a transposed output
  bool transposed = false;              // stored as srcᵀ (gemm facet 1.4)
  block_quantize::ByteElement element = block_quantize::ByteElement::e4m3;
  block_quantize::ByteScaleRule rule = block_quantize::ByteScaleRule::e8m0_floor;
};

cudaError_t quantize_byte_scaled_blocks(const void* src, Elem src_elem, std::int64_t rows,
                                        std::int64_t cols, const ByteScaledQuantizeOutput& out,
                                        bool stochastic, std::uint64_t seed,
                                        std::uint32_t* global_amax, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
