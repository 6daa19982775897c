// The quantized weight facet's kernels: NF4 and block-scaled weights decoded into a storage float
// (contract: cuda_quantized_weight.h; element math: cuda_quantized_weight_math.h).
#include "cuda_device.cuh"
#include "cuda_quantized_weight.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

struct Nf4Levels {
  float level[16];
};

// codes [ceil(n / 2)], absmax [ceil(n / block)], out [n] in storage OS.
template <class OS>
__global__ void __launch_bounds__(kThreads)
    dequantize_nf4_kernel(const std::uint8_t* codes, const float* absmax, std::int64_t block,
                          std::int64_t n, Nf4Levels levels, elem_t<OS>* out) {
  __shared__ float level[16];
  if (threadIdx.x < 16) level[threadIdx.x] = levels.level[threadIdx.x];
  __syncthreads();
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = OS::store(
        quantized::nf4_value(quantized::nf4_code(codes, i), absmax[i / block], level), false);
}

// w [rows, cols] decoded into out [rows, cols] in storage OS.
template <class OS>
__global__ void __launch_bounds__(kThreads)
    dequantize_block_scaled_kernel(BlockScaledSource w, std::int64_t rows, std::int64_t cols,
                                   elem_t<OS>* out) {
  const float tensor_scale = w.tensor_scale != nullptr ? *w.tensor_scale : 1.0f;
  const bool packed = w.element == quantized::Element::e2m1;
  const std::int64_t total = rows * cols;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t r = i / cols, c = i % cols;
    const float scale = quantized::block_scale(w.scales, w.scale,
                                               (r / w.block_rows) * w.grid_cols + c / w.block_cols);
    const float e =
        quantized::element_value(w.element, quantized::element_code(w.codes, packed, i));
    out[i] = OS::store(quantized::block_scaled_value(e, scale, tensor_scale), false);
  }
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
    dequantize_nf4_kernel<OS><<<grid_for(n), kThreads, 0, stream>>>(codes, absmax, block, n, table,
                                                                    static_cast<elem_t<OS>*>(out));
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t dequantize_block_scaled(const BlockScaledSource& w, std::int64_t rows,
                                    std::int64_t cols, void* out, Elem out_elem,
                                    cudaStream_t stream) {
  const std::int64_t total = rows * cols;
  bool known = with_float_storage(out_elem, [&](auto os) {
    using OS = decltype(os);
    if (total == 0) return;
    dequantize_block_scaled_kernel<OS>
        <<<grid_for(total), kThreads, 0, stream>>>(w, rows, cols, static_cast<elem_t<OS>*>(out));
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
