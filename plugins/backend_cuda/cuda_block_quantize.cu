// The fp8-block quantize kernel: one 128 x 128 tile of src per block of threads, read once into
// shared memory, then every block statistic both outputs need (rows, columns, the tile), then the
// codes and scales of each output (contract in cuda_block_quantize.h).
#include "cuda_block_quantize.h"

#include <algorithm>

#include "cuda_block_quantize_math.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

namespace bq = block_quantize;

constexpr int kTile = 128;
constexpr int kPitch = kTile + 1;  // row and column walks over the tile hit 32 distinct banks
constexpr int kQuantizeThreads = 256;
constexpr std::size_t kTileBytes = sizeof(float) * kTile * kPitch;

enum class Shape { rows_1x128, cols_128x1, tile_128x128 };

__device__ __forceinline__ Shape shape_of(const BlockQuantizeOutput& o) {
  return o.block_rows == 1 ? Shape::rows_1x128
                           : (o.block_cols == 1 ? Shape::cols_128x1 : Shape::tile_128x128);
}

// src is [rows, cols] in tiles of 128 x 128; blockIdx.x is the tile column, and the row tiles
// ty = blockIdx.y, blockIdx.y + gridDim.y, ... (gridDim.y is capped at 65535).
template <class S>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_kernel(const elem_t<S>* src, std::int64_t rows, std::int64_t cols,
                    const __grid_constant__ BlockQuantizeOutput out0,
                    const __grid_constant__ BlockQuantizeOutput out1, bool stochastic,
                    std::uint64_t seed) {
  extern __shared__ float tile[];  // [kTile][kPitch]
  __shared__ std::uint32_t row_amax[kTile], col_amax[kTile];
  __shared__ bool row_finite[kTile], col_finite[kTile];
  __shared__ bq::BlockStats whole;
  __shared__ float encode_scale[kTile];
  __shared__ bool encode_finite[kTile];
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t tiles_y = (rows + kTile - 1) / kTile;
  // The loop's bound is the block's own: every thread of it takes each __syncthreads below.
  for (std::int64_t ty = blockIdx.y; ty < tiles_y; ty += gridDim.y) {
    const std::int64_t r0 = ty * kTile;
    const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
    const std::int64_t grid_cols = (cols + kTile - 1) / kTile;

    // Outside src the tile holds zeros: a partial block is quantized as its zero-padded block.
    for (int i = t; i < kTile * kTile; i += kQuantizeThreads) {
      const int r = i / kTile, c = i % kTile;
      const std::int64_t gr = r0 + r, gc = c0 + c;
      tile[r * kPitch + c] = gr < rows && gc < cols ? S::load(src[gr * cols + gc]) : 0.0f;
    }
    __syncthreads();
    {
      bq::BlockStats s = bq::empty_stats();
      if (t < kTile) {
        for (int r = 0; r < kTile; ++r) bq::add(s, tile[r * kPitch + t]);
        col_amax[t] = s.amax_bits;
        col_finite[t] = s.finite;
      } else {
        const int r = t - kTile;
        for (int c = 0; c < kTile; ++c) bq::add(s, tile[r * kPitch + c]);
        row_amax[r] = s.amax_bits;
        row_finite[r] = s.finite;
      }
    }
    __syncthreads();
    if (t == 0) {
      bq::BlockStats s = bq::empty_stats();
      for (int c = 0; c < kTile; ++c) s = bq::merge(s, {col_amax[c], col_finite[c]});
      whole = s;
    }
    __syncthreads();

    for (int p = 0; p < 2; ++p) {
      // out0 and out1 are grid constants: a reference to either reads the parameter bank, where
      // one to a plain by-value parameter copied both into each thread's local memory first.
      const BlockQuantizeOutput& out = p == 0 ? out0 : out1;
      if (out.codes == nullptr) continue;
      const Shape shape = shape_of(out);
      if (t < kTile) {
        const bq::BlockStats s =
            shape == Shape::rows_1x128   ? bq::BlockStats{row_amax[t], row_finite[t]}
            : shape == Shape::cols_128x1 ? bq::BlockStats{col_amax[t], col_finite[t]}
                                         : whole;
        const bq::Fp32Encoding e = bq::encode_block(s, out.e5m2, out.pow2);
        encode_scale[t] = e.encode_scale;
        encode_finite[t] = e.finite;
        // The block's place in src's grid (bi, bj), or in srcᵀ's (bj, bi) for a transposed output.
        const std::int64_t grid_rows = (rows + kTile - 1) / kTile;
        std::int64_t bi = -1, bj = 0, gr_count = 0, gc_count = 0;
        if (shape == Shape::rows_1x128 && r0 + t < rows) {
          bi = r0 + t, bj = blockIdx.x, gr_count = rows, gc_count = grid_cols;
        } else if (shape == Shape::cols_128x1 && c0 + t < cols) {
          bi = ty, bj = c0 + t, gr_count = grid_rows, gc_count = cols;
        } else if (shape == Shape::tile_128x128 && t == 0) {
          bi = ty, bj = blockIdx.x, gr_count = grid_rows, gc_count = grid_cols;
        }
        if (bi >= 0)
          out.scales[out.transposed ? bj * gr_count + bi : bi * gc_count + bj] = e.decode_scale;
      }
      __syncthreads();
      for (int i = t; i < kTile * kTile; i += kQuantizeThreads) {
        // Consecutive threads write consecutive bytes: along a row of src, or of srcᵀ (a column of
        // the tile; the padded pitch keeps those shared-memory reads conflict-free).
        const int r = out.transposed ? i % kTile : i / kTile;
        const int c = out.transposed ? i / kTile : i % kTile;
        const std::int64_t gr = r0 + r, gc = c0 + c;
        if (gr >= rows || gc >= cols) continue;
        const int b = shape == Shape::rows_1x128 ? r : (shape == Shape::cols_128x1 ? c : 0);
        const bq::Fp32Encoding e{encode_scale[b], 0.0f, encode_finite[b]};
        const std::int64_t index = gr * cols + gc;  // src's: it keys the stochastic bits
        const std::uint32_t bits =
            stochastic ? bq::fr::random_bits(seed, static_cast<std::uint64_t>(index)) : 0u;
        out.codes[out.transposed ? gc * rows + gr : index] =
            bq::element_code(tile[r * kPitch + c], e, out.e5m2, stochastic, bits);
      }
      __syncthreads();  // the next output rewrites encode_scale
    }
  }  // row tiles
}

bool valid(const BlockQuantizeOutput& o) {
  if (o.codes == nullptr) return true;
  const bool one_d =
      (o.block_rows == 1 && o.block_cols == kTile) || (o.block_rows == kTile && o.block_cols == 1);
  return o.scales != nullptr && (one_d || (o.block_rows == kTile && o.block_cols == kTile));
}

}  // namespace

cudaError_t quantize_fp8_blocks(const void* src, Elem src_elem, std::int64_t rows,
                                std::int64_t cols, const BlockQuantizeOutput& out0,
                                const BlockQuantizeOutput& out1, bool stochastic,
                                std::uint64_t seed, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || !valid(out0) || !valid(out1)) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  const std::int64_t tiles_y = (rows + kTile - 1) / kTile, tiles_x = (cols + kTile - 1) / kTile;
  if (tiles_x > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tiles_x),
                  static_cast<unsigned>(std::min<std::int64_t>(tiles_y, 65535)));
  cudaError_t status = cudaSuccess;
  const bool known = with_float_storage(src_elem, [&](auto s) {
    using S = decltype(s);
    // The tile is above the 48 KiB a kernel gets without asking (sm_80: 163 KiB, sm_90: 227 KiB).
    status = cudaFuncSetAttribute(quantize_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kTileBytes));
    if (status != cudaSuccess) return;
    quantize_kernel<S><<<grid, kQuantizeThreads, kTileBytes, stream>>>(
        static_cast<const elem_t<S>*>(src), rows, cols, out0, out1, stochastic, seed);
    status = cudaGetLastError();
  });
  return known ? status : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
