// The quantized weight facet's kernels: NF4 and block-scaled weights decoded into a storage float
// (contract: cuda_quantized_weight.h; element math: cuda_quantized_weight_math.h).
#include <algorithm>
#include <limits>

#include "cuda_device.cuh"
#include "cuda_quantized_weight.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

struct Nf4Levels {
  float level[16];
};

// codes [ceil(n / 2)], absmax [ceil(n / block)], out [n] in storage OS. The levels are a grid
// constant: indexed at run time, a plain by-value parameter is copied into each thread's local
// memory first (64 bytes a thread, ptxas's stack frame), where a grid constant is read in place.
// Indices in I: 32-bit wherever n fits (every weight), so an element's block is a 32-bit
// division, not a 64-bit one (as in the block-scaled decode below).
template <class OS, class I>
__global__ void __launch_bounds__(kThreads)
    dequantize_nf4_kernel(const std::uint8_t* codes, const float* absmax, std::int64_t block,
                          std::int64_t n, const __grid_constant__ Nf4Levels levels,
                          elem_t<OS>* out) {
  __shared__ float level[16];
  if (threadIdx.x < 16) level[threadIdx.x] = levels.level[threadIdx.x];
  __syncthreads();
  const I count = static_cast<I>(n), per_block = static_cast<I>(block);
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    out[i] = OS::store(
        quantized::nf4_value(quantized::nf4_code(codes, i), absmax[i / per_block], level), false);
}

// w [rows, cols] decoded into out [rows, cols] in storage OS. Rows r = blockIdx.y, + gridDim.y,
// ... (gridDim.y is capped at 65535); columns grid-stride along x. So an element's row needs no
// division, and its block column one in I: 32-bit wherever the columns fit (every weight), where
// 64-bit divisions, three an element, outweighed the element's memory traffic.
template <class OS, class I>
__global__ void __launch_bounds__(kThreads)
    dequantize_block_scaled_kernel(BlockScaledSource w, std::int64_t rows, std::int64_t cols,
                                   elem_t<OS>* out) {
  const float tensor_scale = w.tensor_scale != nullptr ? *w.tensor_scale : 1.0f;
  const bool packed = w.element == quantized::Element::e2m1;
  const I block_cols = static_cast<I>(w.block_cols), n_cols = static_cast<I>(cols);
  const I first = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x;
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::int64_t row_start = r * cols, row_blocks = (r / w.block_rows) * w.grid_cols;
    for (I c = first; c < n_cols; c += stride) {
      const float scale = quantized::block_scale(w.scales, w.scale, row_blocks + c / block_cols);
      const float e = quantized::element_value(
          w.element, quantized::element_code(w.codes, packed, row_start + c));
      out[row_start + c] = OS::store(quantized::block_scaled_value(e, scale, tensor_scale), false);
    }
  }
}

// Calls launch with a value of the index type the kernels above take for `extent` elements:
// 32-bit wherever a grid-stride index and its stride (at most 2^21) stay below 2^32, else 64-bit.
template <class F>
void with_index_type(std::int64_t extent, F&& launch) {
  if (extent <= std::numeric_limits<std::uint32_t>::max() / 2)
    launch(std::uint32_t{});
  else
    launch(std::int64_t{});
}

}  // namespace

cudaError_t dequantize_nf4(const std::uint8_t* codes, const float* absmax, std::int64_t block,
                           std::int64_t n, const float (&levels)[16], void* out, Elem out_elem,
                           cudaStream_t stream) {
  Nf4Levels table{};
  for (int k = 0; k < 16; ++k) table.level[k] = levels[k];
  bool known = with_float_storage(out_elem, [&](auto os) {
    using OS = decltype(os);
    if (n == 0) return;
    auto* y = static_cast<elem_t<OS>*>(out);
    with_index_type(n, [&](auto index) {
      dequantize_nf4_kernel<OS, decltype(index)>
          <<<grid_for(n), kThreads, 0, stream>>>(codes, absmax, block, n, table, y);
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t dequantize_block_scaled(const BlockScaledSource& w, std::int64_t rows,
                                    std::int64_t cols, void* out, Elem out_elem,
                                    cudaStream_t stream) {
  bool known = with_float_storage(out_elem, [&](auto os) {
    using OS = decltype(os);
    if (rows == 0 || cols == 0) return;
    const dim3 grid(std::min(grid_for(cols), 64u),
                    static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)));
    auto* y = static_cast<elem_t<OS>*>(out);
    with_index_type(cols, [&](auto index) {
      dequantize_block_scaled_kernel<OS, decltype(index)>
          <<<grid, kThreads, 0, stream>>>(w, rows, cols, y);
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
