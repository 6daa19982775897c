// BlockScaledGemmEngine: the gemm facet's gemm_block_scaled on CUDA (fp8-block, sm_90), through
// cuBLASLt's block-scaled FP8 matmul (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F for 1 x 128 blocks,
// BLK128x128_32F for 128 x 128 blocks), FP32 accumulation.
//
// Contract (in addition to sdk/backend_gemm.h's BlockScaledGemmArgs)
// - Row-major onto cuBLASLt's column-major API as GemmEngine does (cuda_gemm.h): cuBLASLt's A is
//   our B (its m is our n), its B our A. cuBLASLt's FP8 kernels on Hopper take only "TN": both
//   operands with the reduction dim k contiguous. An operand stored that way (forward's x and W;
//   dgrad's dy) is read in place; the others — dgrad's W (the weight's one 128 x 128
//   quantization, read along its rows) and wgrad's dy and x (their second quantizations, 128 x 1
//   blocks along the batch rows, stored row-major as the SDK defines codes) — are transposed into
//   scratch first (pack_codes_k_major), one pass over their 1-byte codes. So are operands whose k
//   is not a multiple of 128 (zero codes pad the last block: exact) or whose outer dim is not a
//   multiple of 4 (cuBLASLt's rule for these scale modes; the padded rows are dropped).
// - Scales: the SDK's row-major fp32 grids are rearranged into cuBLASLt's layouts in scratch
//   (arrange_fp32_scales; cuda_block_scale_layout.h states them), every call.
// - Pairing: both operands must block k by 128 (1 x 128 along k, or 128 x 128); cuBLASLt has no
//   128 x 128 by 128 x 128 product, and no e5m2 x e5m2: those, other layouts (mxfp8, nvfp4) and
//   tensor scales raise BackendError naming the operand (the plan refused them already,
//   cuda_block_scaled_rules.h).
// - Output: with no bias, no activation, C in fp32 / bf16 / fp16 and m, n multiples of 4 (16-byte
//   rows of C), D is C and cuBLASLt applies alpha and beta. Otherwise D is fp32 scratch and
//   block_gemm_epilogue adds beta * C and the bias and applies the activation, in the header's
//   order, rounding C and pre_activation once.
// - Accuracy: cuBLASLt's block-scaled kernels accumulate in fp32 (their internal order is not
//   documented), not the CPU simulator's per-block exact dot products: results agree to fp32
//   accumulation error, not bit for bit.
// - One cuBLASLt plan per (shape, element types, scale modes, D type, beta != 0), cached. Not
//   thread-safe: one per backend. Verified on the host only for its argument checks; the device
//   tests (test_backend_cuda_block_scaled) need an sm_90 GPU.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>

#include "cuda_scratch.h"
#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::backend_cuda {

class BlockScaledGemmEngine {
 public:
  // handle and workspace are the GEMM engine's (cuda_gemm.h), shared: one stream, in order.
  BlockScaledGemmEngine(cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream);
  ~BlockScaledGemmEngine();
  BlockScaledGemmEngine(const BlockScaledGemmEngine&) = delete;
  BlockScaledGemmEngine& operator=(const BlockScaledGemmEngine&) = delete;

  void run(const sdk::BlockScaledGemmArgs& args);

  void set_out_of_memory_hook(const std::function<void()>& hook);
  void set_graph_guard(const int* live_graphs);
  void free_retired_scratch() noexcept;
  std::size_t device_bytes() const;

 private:
  struct Plan {
    bool ok = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // m_lt, n_lt, k, A / B element types, A / B scale modes, D type, D's leading dim, beta != 0.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, int, int, int, int, int,
                         std::int64_t, bool>;
  Plan& plan_for(const Key& key, const void* scale_placeholder);

  cublasLtHandle_t handle_;
  void* workspace_;
  std::size_t workspace_bytes_;
  cudaStream_t stream_;
  std::map<Key, Plan> plans_;
  DeviceScratch codes_a_, codes_b_, scales_a_, scales_b_, d_;
};

}  // namespace mixtrain::backend_cuda
