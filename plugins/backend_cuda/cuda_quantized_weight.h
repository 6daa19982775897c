// Launchers of the quantized weight facet's decode kernels (cuda_quantized_weight.cu); plain C++
// like every launcher header (cuda_kernel_types.h).
//
// Contract
// - Enqueue on `stream` only, validate nothing (the facet ran the SDK's shared checks), return
//   the launch status. out is fp32, bf16 or fp16 storage (another tag launches nothing and
//   returns cudaErrorInvalidValue); each element is cuda_quantized_weight_math.h's fp32 value,
//   rounded once into out's storage (cuda_element_math.h's encoders).
// - One thread an element (NF4 grid-stride, block-scaled a row per y block): an element depends
//   on its code and its block's scales alone, so the bits do not depend on the launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"
#include "cuda_quantized_weight_math.h"

namespace mixtrain::backend_cuda::kernels {

// out [n] = NF4 codes (nf4_code_bytes(n) bytes) decoded with absmax [ceil(n / block)];
// levels: the 16 NF4 levels, copied into the launch.
cudaError_t dequantize_nf4(const std::uint8_t* codes, const float* absmax, std::int64_t block,
                           std::int64_t n, const float (&levels)[16], void* out, Elem out_elem,
                           cudaStream_t stream);

// A block-scaled weight [rows, cols] in device memory: its codes (packed two a byte for E2M1),
// its scales (fp32 values or one code byte a block, row-major over a grid of grid_cols columns
// of block_rows x block_cols blocks), and its tensor scale (fp32 [1], or null for 1).
struct BlockScaledSource {
  const std::uint8_t* codes = nullptr;
  quantized::Element element = quantized::Element::e4m3;
  const void* scales = nullptr;
  quantized::ScaleCode scale = quantized::ScaleCode::fp32;
  std::int64_t grid_cols = 0, block_rows = 1, block_cols = 1;
  const float* tensor_scale = nullptr;
};

// out [rows, cols] = the weight decoded.
cudaError_t dequantize_block_scaled(const BlockScaledSource& w, std::int64_t rows,
                                    std::int64_t cols, void* out, Elem out_elem,
                                    cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
