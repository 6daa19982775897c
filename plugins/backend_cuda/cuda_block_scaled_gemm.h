// BlockScaledGemmEngine: the gemm facet's gemm_block_scaled on CUDA, through cuBLASLt's
// block-scaled matmul with FP32 accumulation: fp8-block on sm_90 (CUBLASLT_MATMUL_MATRIX_SCALE_
// VEC128_32F for 1 x 128 blocks, BLK128x128_32F for 128 x 128), mxfp8 (VEC32_UE8M0, E4M3 / E5M2
// elements) and nvfp4 (VEC16_UE4M3, E2M1 elements) on sm_100+.
//
// Contract (in addition to sdk/backend_gemm.h's BlockScaledGemmArgs)
// - Row-major onto cuBLASLt's column-major API as GemmEngine does (cuda_gemm.h): cuBLASLt's A is
//   our B (its m is our n), its B our A. cuBLASLt's block-scaled kernels take only "TN": both
//   operands with the reduction dim k contiguous. The host stores dgrad's W and wgrad's dy and x
//   transposed (gemm facet 1.4: this backend quantizes_transposed()), so every operand arrives
//   that way and is read in place; one stored as its source (a 1.3 host) is transposed into
//   scratch first (pack_codes_k_major), one pass over its 1-byte codes. So are operands whose k
//   is not a multiple of 128 (zero codes pad the last block: exact) or whose outer dim is not a
//   multiple of 4 (fp32 scale modes) or 16 (MX / NVFP4); the padded rows are dropped. NVFP4 codes
//   are always packed, two E2M1 codes per byte (pack_e2m1_k_major), as CUDA_R_4F_E2M1 stores them.
// - Scales: the SDK's row-major fp32 grids are rearranged into cuBLASLt's layouts in scratch
//   (arrange_fp32_scales, arrange_byte_scales; cuda_block_scale_layout.h states them), every
//   call. A 16 x 16 NVFP4 block's scale fills the slots of its sixteen 1 x 16 blocks: exact.
// - NVFP4's tensor scales (device fp32) are folded into alpha on the device, alpha · (S_dec,A ·
//   S_dec,B), and cuBLASLt reads alpha and beta by device pointer for those GEMMs.
// - Pairing: both operands must be of one recipe and block k alike (128, 32 or 16); cuBLASLt has
//   no 128 x 128 by 128 x 128 product and no e5m2 x e5m2: those and other layouts raise
//   BackendError naming the operand (the plan refused them already, cuda_block_scaled_rules.h).
// - Output: with no bias, no activation, C in fp32 / bf16 / fp16 and m, n multiples of the outer
//   multiple above (16-byte rows of C), D is C and cuBLASLt applies alpha and beta. Otherwise D is
//   fp32 scratch and block_gemm_epilogue adds beta * C and the bias and applies the activation, in
//   the header's order, rounding C and pre_activation once.
// - Accuracy: cuBLASLt's block-scaled kernels accumulate in fp32 (their internal order is not
//   documented), not the CPU simulator's per-block exact dot products: results agree to fp32
//   accumulation error, not bit for bit.
// - One cuBLASLt plan per (shape, element types, scale modes, D type, beta != 0, pointer mode),
//   cached. Not thread-safe: one per backend. Verified on the host only for its argument checks;
//   the device tests (test_backend_cuda_block_scaled) need an sm_90 GPU for fp8-block and an
//   sm_100+ GPU for mxfp8 / nvfp4, and none of the latter has run yet.
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
  // m_lt, n_lt, k, A / B element types, A / B scale modes, D type, D's leading dim, beta != 0,
  // alpha and beta by device pointer (NVFP4's tensor scales), and the alignment in bytes of
  // cuBLASLt's A, B and D (C is D): an algorithm chosen for 256-byte aligned pointers fails on an
  // activation at a 64-byte offset of the arena.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, int, int, int, int, int,
                         std::int64_t, bool, bool, int, int, int>;
  Plan& plan_for(const Key& key, const void* scale_placeholder);

  cublasLtHandle_t handle_;
  void* workspace_;
  std::size_t workspace_bytes_;
  cudaStream_t stream_;
  std::map<Key, Plan> plans_;
  DeviceScratch codes_a_, codes_b_, scales_a_, scales_b_, d_, scalars_;
};

}  // namespace mixtrain::backend_cuda
