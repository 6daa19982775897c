// CudaGemm: the CUDA backend's GemmFacet (sdk/backend_gemm.h): single and strided-batched GEMMs
// through the context's cuBLASLt engine (cuda_gemm.h), on Tensor Cores, and the block-scaled ops
// of fp8-block on sm_90.
//
// Contract (in addition to sdk/backend_gemm.h)
// - supports() is the SDK's table narrowed to the A/B dtypes the device's capabilities() declare
//   (FP8 only on sm_89+); the block-scaled ops on fp32 / bf16 / fp16 (src; C) only where some
//   layout runs (cuda_block_scaled_rules.h: sm_90 with cuBLASLt 12.9+), and
//   block_layout_refusal() names the device and library for each layout that does not.
// - gemm_strided_batched is one cuBLASLt strided-batched matmul where cuBLASLt takes the layouts
//   (GemmEngine::run_batched), else one GEMM per batch.
// - quantize_block_scaled: the fp8-block quantize kernel (cuda_block_quantize.h), both outputs
//   from one read of src, or the MX / NVFP4 kernels (cuda_byte_scaled_quantize.h); outputs stored
//   transposed (facet 1.4, quantizes_transposed() true) are written so by the same kernels, so
//   wgrad's operands reach the GEMM with their reduction dim contiguous; gemm_block_scaled:
//   BlockScaledGemmEngine (cuda_block_scaled_gemm.h).
//   Both check their views and raise BackendError for a layout they do not run.
// - gemm_gradient (facet 1.5) answers supports() as gemm does (the same triples run). Its GEMM and
//   gelu's gradient are GemmEngine::run_gradient's (cuda_gemm.h: DGELU or an fp32 GEMM and one
//   gradient kernel, rounding once); then c_column_sums are the column sums of C as stored and
//   a_row_sums the column sums of the stored A [k, m], each by the reproducible column-sum kernel
//   the activation facet's bias_grad runs (cuda_column_sums.h), so they equal bias_grad on C and
//   on A bit for bit. Not cuBLASLt's BGRAD epilogues: their order of summation and whether they
//   accumulate are not the contract's, and they would not equal bias_grad.
// - cast_transpose (facet 1.6): the tile kernel of cuda_cast_transpose.h, both layouts from one
//   read of src. supports() answers {src fp32 / bf16 / fp16, dst fp8} where the device runs FP8
//   GEMMs natively (sm_89+: only there do they take operands transposed) and the option
//   fp8_cast_transpose is on.
// - cast_transpose_gradient (facet 1.7): the same tile kernel with gelu's gradient (the activation
//   facet's element rule and rounding) and the column sums folded in; each tile writes fp32
//   partial sums into the context's `partial`, which the column-sum finish kernel adds in double
//   in tile order (cuda_column_sums.h). Its sums are therefore bias_grad's within FP32 rounding,
//   not its bits (bias_grad splits the rows differently); its codes and amax are the unfused
//   ops' exactly. supports() answers as for cast_transpose, while fp8_gradient_cast is on too.
// - Scratch the engines grow is folded into the backend's memory statistics after each call.
#pragma once

#include <span>
#include <string>

#include "cuda_block_scaled_rules.h"
#include "cuda_context.h"
#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::backend_cuda {

class CudaGemm final : public sdk::GemmFacet {
 public:
  explicit CudaGemm(CudaContext& context) : context_(context) {}

  bool supports(sdk::GemmOp op, std::span<const sdk::DType> dtypes) const override;
  void gemm(const sdk::GemmArgs& args) override;
  void gemm_strided_batched(const sdk::GemmBatchedArgs& args) override;
  void quantize_block_scaled(const sdk::BlockQuantizeArgs& args) override;
  void gemm_block_scaled(const sdk::BlockScaledGemmArgs& args) override;
  void gemm_gradient(const sdk::GemmGradientArgs& args) override;
  void cast_transpose(const sdk::CastTransposeArgs& args) override;
  void cast_transpose_gradient(const sdk::CastTransposeGradientArgs& args) override;
  std::string block_layout_refusal(const sdk::BlockScaledLayout& layout) const override;
  bool quantizes_transposed() const override;

 private:
  BlockScaledDevice block_device() const;

  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
