// The CPU backend's block-scaled ops (GemmFacet 1.2): the exact simulator of block-scaled
// quantization and GEMMs.
//
// Contract
// - quantize_block_scaled_cpu: the outputs are exactly sdk/support/block_scaling.h's reference
//   quantize_block_scaled() of src (decoded to fp32 exactly first), its scale codes decoded to fp32
//   values, for each output that has codes. Checks every view against its layout and src's shape.
//   An output with `transpose` (gemm facet 1.4) gets srcᵀ's quantization as the facet defines it:
//   src quantized under the transposed layout, codes and scale grid transposed after. The CPU's
//   GEMM is indifferent to storage, so the backend does not ask for them (quantizes_transposed()
//   false), but takes them, as the reference the CUDA kernels are checked against.
// - gemm_block_scaled_cpu: backend_gemm.h's definition of BlockScaledGemmArgs, with these choices
//   where it leaves one: each k-block's dot product of element values is summed in double in
//   ascending k (exact for E4M3·E4M3 and E2M1·E2M1 blocks: their products span fewer than 53 bits
//   even summed over 128 elements; E5M2 products of extreme exponents may round there, once), then
//   rounded to fp32; the k-blocks' scaled dots are summed in fp32 in ascending k; every later step
//   is one fp32 operation, in the order the header gives (cpu_block_gemm_kernel.h). The result is
//   the same bits on every CPU and thread count.
//   `activation` applies the epilogue (act on the fp32 z, pre_activation z rounded to its dtype).
// - block_element_values, scale_code_values: the SDK's decoders, tabulated (exact).
// - Errors: sdk::BackendError naming the operand and what does not fit.
// - The GEMM runs on the OpenMP team (about a tenth of the speed of a bf16 GEMM: it multiplies in
//   double); so does the quantizer's element pass (sdk::encode_block_rows, split by rows), after
//   one serial pass for the blocks' encodings.
#pragma once

#include <array>
#include <functional>

#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::backend_cpu {

// The fp32 value of each of the 256 byte codes of an element format (E2M1: the low nibble's).
std::array<float, 256> block_element_values(sdk::BlockElement element);
// The fp32 value of each of the 256 codes of a byte-coded block scale (E8M0 kinds, E4M3); the
// fp32 kinds have no codes (BackendError).
std::array<float, 256> scale_code_values(sdk::BlockScale scale);

void quantize_block_scaled_cpu(const sdk::BlockQuantizeArgs& args);
// `activation(act, z)` applies act in place to an fp32 view (the backend's own kernel).
void gemm_block_scaled_cpu(
    const sdk::BlockScaledGemmArgs& args,
    const std::function<void(sdk::Activation, const sdk::TensorView&)>& activation);

}  // namespace mixtrain::backend_cpu
