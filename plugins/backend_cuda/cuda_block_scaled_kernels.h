// Launchers that put block-scaled operands into the form cuBLASLt's block-scaled GEMM reads, and
// the epilogue of that GEMM (cuda_block_scaled_gemm.h).
//
// Contract (beyond cuda_kernel_types.h's)
// - Frame: cuBLASLt's (cuda_block_scale_layout.h): an operand is op(X) [outer, k]; `transpose`
//   says op-frame element (o, kk) is stored at (kk, o) of the [*, stored_cols] row-major codes,
//   else at (o, kk).
// - pack_codes_k_major writes out [outer_pad, k_pad] row-major (k contiguous: the "TN" operand
//   cuBLASLt's FP8 kernels take on Hopper), 0 outside [outer, k): zero codes add nothing to a
//   block's dot product, so padding k to a block multiple is exact, and padded rows of outer are
//   dropped from the result.
// - arrange_fp32_scales writes the operand's fp32 decode scales in cuBLASLt's VEC128_32F layout
//   (two_d false: outer-major [L][round_up(outer, 4)]) or BLK128x128_32F (two_d true: K-major
//   [ceil(outer / 128)][round_up(L, 4)]), L = ceil(k / 128), from the SDK's row-major grid; the
//   padding entries are 0. The MX / NVFP4 forms (pack_e2m1_k_major, arrange_byte_scales) are
//   declared below with their own lines.
// - block_gemm_epilogue: for an fp32 D [m, n] with leading dimension ldd (alpha already applied),
//   z = d + beta * C (beta != 0) + bias[j] (bias may be null), each one fp32 operation in that
//   order (backend_gemm.h's BlockScaledGemmArgs); then pre_activation = z (when not null) and
//   C = act(z) (has_activation; act 0 relu, 1 gelu) or z, each rounded once to its storage.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_block_scale_layout.h"
#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

cudaError_t pack_codes_k_major(const std::uint8_t* codes, std::int64_t stored_cols, bool transpose,
                               std::int64_t outer, std::int64_t k, std::int64_t outer_pad,
                               std::int64_t k_pad, std::uint8_t* out, cudaStream_t stream);

cudaError_t arrange_fp32_scales(const float* scales, const block_scales::ScaleSource& source,
                                bool two_d, std::int64_t outer, std::int64_t k, float* out,
                                cudaStream_t stream);

// pack_e2m1_k_major: as pack_codes_k_major for E2M1 codes (one per byte in), two per byte out
// (block_scales::e2m1_pair): out is [outer_pad, k_pad / 2] bytes; k_pad must be even.
cudaError_t pack_e2m1_k_major(const std::uint8_t* codes, std::int64_t stored_cols, bool transpose,
                              std::int64_t outer, std::int64_t k, std::int64_t outer_pad,
                              std::int64_t k_pad, std::uint8_t* out, cudaStream_t stream);

// arrange_byte_scales: the operand's fp32 decode scales as the bytes of VEC32_UE8M0 (e8m0, k_block
// 32) or VEC16_UE4M3 (k_block 16) in cuBLASLt's 128 x 4 tiled layout for the padded k it is given
// (block_scales::tiled_offset with L = k_pad / k_block; k_pad >= k, a multiple of 4 * k_block):
// every slot of tiled_count(outer, L) written, by block_scales::tiled_scale_byte.
cudaError_t arrange_byte_scales(const float* scales, const block_scales::ScaleSource& source,
                                std::int64_t k_block, bool e8m0, std::int64_t outer, std::int64_t k,
                                std::int64_t k_pad, std::uint8_t* out, cudaStream_t stream);

// block_gemm_scalars: out[0] = alpha * (tensor_scale_a * tensor_scale_b) (a null tensor scale is
// 1), out[1] = beta: the device-side alpha and beta of an NVFP4 GEMM.
cudaError_t block_gemm_scalars(float alpha, float beta, const float* tensor_scale_a,
                               const float* tensor_scale_b, float* out, cudaStream_t stream);

cudaError_t block_gemm_epilogue(const float* d, std::int64_t ldd, std::int64_t m, std::int64_t n,
                                void* c, Elem c_elem, float beta, const float* bias,
                                bool has_activation, int act, void* pre_activation, Elem pre_elem,
                                cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
