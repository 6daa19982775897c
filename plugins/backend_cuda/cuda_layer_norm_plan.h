// How the CUDA layer-norm backward runs (cuda_layer_norm.cu), decided on the host: header-only
// and free of CUDA, so its rules are tested without a device.
//
// - one_pass (the default): one kernel reads dy and x once per row and writes dx, while each warp
//   sums its rows' dgamma / dbeta terms into its own slice of shared memory; each block then
//   folds its warps in order into one FP32 partial row, and a finish kernel sums the blocks'
//   partials per column in double, in order. The partition is a function of rows alone (blocks
//   of kRowsPerBlock rows, kWarps warps each taking every kWarps-th row), so the sums are the
//   same bits on every run.
// - column_sums_then_rows: the reproducible column sums (cuda_column_sums.h) read dy and x for
//   dgamma / dbeta, then the row kernel reads them again for dx. Where the backend option
//   layernorm_backward_one_pass is off, and where a block's slices would not fit the device's
//   shared memory (n above ~7000 floats on Hopper).
// - rows_only: no parameter gradient wanted (frozen or absent gamma and beta).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace mixtrain::backend_cuda::layer_norm_plan {

inline constexpr int kWarps = 4;        // warps per block of the one-pass kernel
inline constexpr int kRowsPerWarp = 4;  // rows each warp takes per block
inline constexpr std::int64_t kRowsPerBlock = std::int64_t{kWarps} * kRowsPerWarp;

// Blocks of the one-pass kernel over `rows` rows (0 for none).
constexpr std::int64_t one_pass_blocks(std::int64_t rows) {
  return (rows + kRowsPerBlock - 1) / kRowsPerBlock;
}
// Dynamic shared memory of one block: each warp's dgamma and dbeta terms, fp32 [kWarps][2][n].
constexpr std::size_t one_pass_shared_bytes(std::int64_t n) {
  return 2 * static_cast<std::size_t>(kWarps) * static_cast<std::size_t>(n) * sizeof(float);
}
// Floats of the blocks' partial rows: dgamma's [blocks, n], then dbeta's.
constexpr std::size_t one_pass_scratch_floats(std::int64_t rows, std::int64_t n) {
  return 2 * static_cast<std::size_t>(std::max<std::int64_t>(1, one_pass_blocks(rows))) *
         static_cast<std::size_t>(n);
}

enum class BackwardRoute { rows_only, one_pass, column_sums_then_rows };

// wants_sums: dgamma or dbeta is asked for; shared_optin: the device's most dynamic shared
// memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr BackwardRoute backward_route(bool wants_sums, bool one_pass_option, std::int64_t n,
                                       std::size_t shared_optin) {
  if (!wants_sums) return BackwardRoute::rows_only;
  if (!one_pass_option || one_pass_shared_bytes(n) > shared_optin)
    return BackwardRoute::column_sums_then_rows;
  return BackwardRoute::one_pass;
}

}  // namespace mixtrain::backend_cuda::layer_norm_plan
