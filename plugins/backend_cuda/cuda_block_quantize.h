// Launcher of the fp8-block quantize kernel (the gemm facet's quantize_block_scaled on CUDA).
//
// Contract (beyond cuda_kernel_types.h's)
// - src [rows, cols] (fp32, bf16 or fp16, row-major) is read once, in 128 x 128 tiles held in
//   shared memory; each output with codes != nullptr gets its E4M3 / E5M2 codes [rows, cols]
//   (row-major, as src) and its fp32 decode scales, a row-major grid of its blocks: 1 x 128
//   [rows, ceil(cols / 128)], 128 x 1 [ceil(rows / 128), cols] or 128 x 128 [ceil(rows / 128),
//   ceil(cols / 128)]. So an operand's quantization along its cols and its second one along its
//   rows (the transposed use) come from one read of src. A `transposed` output is written as
//   srcᵀ's: codes [cols, rows] and the transposed scale grid (backend_gemm.h, 1.4), from the same
//   tile: Transformer Engine's fused cast + transpose.
// - The values are sdk::quantize_block_scaled()'s bit for bit (cuda_block_quantize_math.h);
//   with `stochastic`, element (r, c) rounds with random_bits(seed, r * cols + c).
// - The caller has checked shapes and layouts; block extents other than those three, or rows /
//   cols < 0, return cudaErrorInvalidValue and launch nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

struct BlockQuantizeOutput {
  std::uint8_t* codes = nullptr;  // nullptr: no such output
  float* scales = nullptr;
  int block_rows = 1, block_cols = 128;
  bool e5m2 = false;        // elements E5M2, else E4M3
  bool pow2 = false;        // scales rounded down to powers of two
  bool transposed = false;  // stored as srcᵀ (gemm facet 1.4); block extents stay src's
};

cudaError_t quantize_fp8_blocks(const void* src, Elem src_elem, std::int64_t rows,
                                std::int64_t cols, const BlockQuantizeOutput& out0,
                                const BlockQuantizeOutput& out1, bool stochastic,
                                std::uint64_t seed, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
