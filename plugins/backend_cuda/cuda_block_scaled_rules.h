// Block-scaled rules: which block-scaled layouts (sdk/support/block_scaling.h) the CUDA backend
// runs on a given device and cuBLASLt, through which cuBLASLt scale mode, or why not.
//
// Contract
// - Pure host code (no CUDA call), so the rules are unit-tested with a fake sm and library
//   version; CudaGemm's supports() and block_layout_refusal() answer from them.
// - fp8-block (E4M3 / E5M2 elements, fp32 or power-of-two fp32 scales, 1 x 128 / 128 x 1 blocks
//   along the reduction dim, or 128 x 128) runs through CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
//   (1-D) and BLK128x128_32F (2-D). cuBLAS documents both for compute capability 9.0 only (its
//   "Scaling Mode Support Overview"), from cuBLAS 12.9: so sm_90 with cuBLASLt >= 12.9, headers
//   and library. Blackwell (sm_100, sm_120) is refused, naming it: cuBLAS has no such mode there
//   (Transformer Engine emulates this recipe with MXFP8 on Blackwell, other numbers).
// - mxfp8 (E8M0 scales, 1 x 32) and nvfp4 (E2M1, E4M3 scales, 1 x 16 and 16 x 16, tensor scale)
//   map to VEC32_UE8M0 / VEC16_UE4M3, compute capability 10.0+ from cuBLAS 12.8 (a 16 x 16 block's
//   scale repeats over its 16 rows of 1 x 16 blocks, exactly). Built and host-checked; no
//   Blackwell GPU has run them yet (plugins/backend_cuda/README.md).
// - Every mode needs cuBLAS 12.9+ headers at build time (the block-scaled engine compiles only
//   against them) and, at run time, a cuBLASLt that has the mode.
// - A refusal is one sentence naming the layout's recipe, the device and library versions, and
//   where the layout does run; the host adds the node and the fix (the CPU simulator).
#pragma once

#include <string>

#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::backend_cuda {

// cublasLtGetVersion() / CUBLAS_VERSION numbering: major * 10000 + minor * 100 + patch.
inline constexpr int kCublasFp32BlockScales = 120900;  // VEC128_32F, BLK128x128_32F
inline constexpr int kCublasMxScales = 120800;         // VEC32_UE8M0, VEC16_UE4M3
inline constexpr int kCublasBlockScaledEngine = 120900;  // the headers BlockScaledGemmEngine needs

struct BlockScaledDevice {
  int sm = 0;                // 90 for sm_90
  std::string name;          // "NVIDIA H200"
  int cublaslt_runtime = 0;  // cublasLtGetVersion()
  int cublaslt_headers = 0;  // CUBLAS_VERSION this backend was built against
};

enum class BlockScaleMode {
  none,             // refused
  vec128_fp32,      // CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
  blk128x128_fp32,  // CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
  vec32_ue8m0,      // CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0
  vec16_ue4m3,      // CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3
};

struct BlockScaledRoute {
  BlockScaleMode mode = BlockScaleMode::none;
  std::string refusal;  // empty exactly when mode != none
};

// "\"fp8-block\" (e4m3 1x128 fp32 scales)", for messages: the recipe a layout belongs to.
std::string block_recipe_name(const sdk::BlockScaledLayout& layout);

// The cuBLASLt scale mode of an operand of `layout` whose blocks run along the reduction dim (a
// 1-D layout's blocks are along k whichever of rows / cols that is; the GEMM checks the pairing).
// Layouts outside every mode give `none` with the reason.
BlockScaledRoute block_scaled_route(const BlockScaledDevice& device,
                                    const sdk::BlockScaledLayout& layout);

// block_layout_refusal's answer: "" when the route exists, else the reason.
std::string block_layout_refusal(const BlockScaledDevice& device,
                                 const sdk::BlockScaledLayout& layout);

// supports() for the block-scaled ops: some recipe's layout runs on this device (fp8-block on
// sm_90, mxfp8 / nvfp4 on sm_100+, each with a new enough cuBLASLt); the per-layout answer is
// block_layout_refusal's.
bool block_scaled_ops_available(const BlockScaledDevice& device);

}  // namespace mixtrain::backend_cuda
