// The MXFP8 / NVFP4 quantize: block statistics, block scales, element codes (contract in
// cuda_byte_scaled_quantize.h).
#include "cuda_byte_scaled_quantize.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

namespace bq = block_quantize;
namespace fr = bq::fr;

// The scale slot of src's block (bi, bj): row-major in src's grid, or in srcᵀ's.
__device__ __forceinline__ std::int64_t slot(const ByteScaledQuantizeOutput& out, std::int64_t bi,
                                             std::int64_t bj, std::int64_t grid_rows,
                                             std::int64_t grid_cols) {
  return out.transposed ? bj * grid_rows + bi : bi * grid_cols + bj;
}

// One thread per block of the output's grid [grid_rows, grid_cols]: its statistics go into its
// scale slot as bits until block_scales_kernel replaces them with the decode scale.
template <class S>
__global__ void __launch_bounds__(kThreads)
    block_stats_kernel(const elem_t<S>* src, std::int64_t rows, std::int64_t cols,
                       ByteScaledQuantizeOutput out, std::int64_t grid_cols, std::int64_t blocks,
                       std::uint32_t* global_amax) {
  auto* stats = reinterpret_cast<std::uint32_t*>(out.scales);
  const std::int64_t grid_rows = blocks / grid_cols;
  for (std::int64_t b = global_thread(); b < blocks; b += grid_threads()) {
    const std::int64_t r0 = b / grid_cols * out.block_rows, c0 = b % grid_cols * out.block_cols;
    const std::int64_t r1 = r0 + out.block_rows < rows ? r0 + out.block_rows : rows;
    const std::int64_t c1 = c0 + out.block_cols < cols ? c0 + out.block_cols : cols;
    bq::BlockStats s = bq::empty_stats();
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t c = c0; c < c1; ++c) bq::add(s, S::load(src[r * cols + c]));
    stats[slot(out, b / grid_cols, b % grid_cols, grid_rows, grid_cols)] = bq::packed_stats(s);
    // Only finite blocks set NVFP4's tensor range (block_scaling.h); amax bits order as values.
    if (out.tensor_scale != nullptr && s.finite) atomicMax(global_amax, s.amax_bits);
  }
}

__global__ void __launch_bounds__(kThreads)
    block_scales_kernel(ByteScaledQuantizeOutput out, std::int64_t blocks,
                        const std::uint32_t* global_amax) {
  const float s_enc = out.tensor_scale != nullptr
                          ? fr::nvfp4_tensor_encode_scale(fr::float_of(*global_amax))
                          : 1.0f;
  if (out.tensor_scale != nullptr && global_thread() == 0)
    *out.tensor_scale = fr::nvfp4_tensor_decode_scale(s_enc);
  auto* stats = reinterpret_cast<std::uint32_t*>(out.scales);
  for (std::int64_t b = global_thread(); b < blocks; b += grid_threads())
    out.scales[b] = bq::byte_scaled_decode_scale(stats[b], out.element, out.rule, s_enc);
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    codes_kernel(const elem_t<S>* src, std::int64_t rows, std::int64_t cols,
                 ByteScaledQuantizeOutput out, std::int64_t grid_cols, bool stochastic,
                 std::uint64_t seed) {
  const float s_dec = out.tensor_scale != nullptr ? *out.tensor_scale : 1.0f;
  const std::int64_t grid_rows = (rows + out.block_rows - 1) / out.block_rows;
  // j walks the output in its storage order (src's, or srcᵀ's), so writes are contiguous.
  for (std::int64_t j = global_thread(); j < rows * cols; j += grid_threads()) {
    const std::int64_t r = out.transposed ? j % rows : j / cols;
    const std::int64_t c = out.transposed ? j / rows : j % cols;
    const std::int64_t i = r * cols + c;  // src's index: it keys the stochastic bits
    const float scale =
        out.scales[slot(out, r / out.block_rows, c / out.block_cols, grid_rows, grid_cols)];
    const std::uint32_t bits =
        stochastic ? fr::random_bits(seed, static_cast<std::uint64_t>(i)) : 0u;
    out.codes[j] = bq::byte_scaled_element_code(S::load(src[i]), scale, s_dec, out.element,
                                                out.rule, stochastic, bits);
  }
}

}  // namespace

cudaError_t quantize_byte_scaled_blocks(const void* src, Elem src_elem, std::int64_t rows,
                                        std::int64_t cols, const ByteScaledQuantizeOutput& out,
                                        bool stochastic, std::uint64_t seed,
                                        std::uint32_t* global_amax, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || out.block_rows < 1 || out.block_cols < 1 || out.codes == nullptr ||
      out.scales == nullptr || (out.tensor_scale != nullptr && global_amax == nullptr))
    return cudaErrorInvalidValue;
  cudaError_t status = cudaSuccess;
  if (out.tensor_scale != nullptr) {
    status = cudaMemsetAsync(global_amax, 0, sizeof(std::uint32_t), stream);
    if (status != cudaSuccess) return status;
  }
  if (rows == 0 || cols == 0) {
    // No blocks, but NVFP4's tensor scale is still an output: the CPU writes 1 (amax 0), and a
    // caller's buffer must not keep what it held before.
    if (out.tensor_scale == nullptr) return cudaSuccess;
    block_scales_kernel<<<1, kThreads, 0, stream>>>(out, 0, global_amax);
    return cudaGetLastError();
  }
  const std::int64_t grid_cols = (cols + out.block_cols - 1) / out.block_cols;
  const std::int64_t blocks = (rows + out.block_rows - 1) / out.block_rows * grid_cols;
  const bool known = with_float_storage(src_elem, [&](auto s) {
    using S = decltype(s);
    const auto* x = static_cast<const elem_t<S>*>(src);
    block_stats_kernel<S><<<grid_for(blocks), kThreads, 0, stream>>>(x, rows, cols, out, grid_cols,
                                                                     blocks, global_amax);
    block_scales_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(out, blocks, global_amax);
    codes_kernel<S><<<grid_for(rows * cols), kThreads, 0, stream>>>(x, rows, cols, out, grid_cols,
                                                                    stochastic, seed);
    status = cudaGetLastError();
  });
  return known ? status : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
