// Feature names the host reads from sdk::BackendCapabilities::features. The other entries of that
// list ("avx512_bf16", "sm_90", ...) are informational; these change what the host says or does.
//
// Contract: header-only constants and has_feature(), in no ABI record (support/); a backend lists
// a name only when what it describes holds for every call of this backend object.
#pragma once

#include <algorithm>
#include <string_view>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::sdk {

// The GEMM facet copies an operand (or C) of a large 16-bit GEMM whose rows are not 16 bytes apart
// (an odd vocabulary's logits) into scratch with padded rows before its Tensor Core kernels, so
// such a dimension costs a copy, not the slow kernels. `mixtrain check`'s alignment lint reports
// the dimension of a 16-bit linear layer as handled.
inline constexpr std::string_view kFeatureGemmRealignsRows = "gemm_realigns_rows";

// The GEMM facet's fast 16-bit kernels need every matrix's rows 16 bytes apart (cuBLASLt's Tensor
// Core kernels; an odd row length runs align-1 kernels at a fraction of their rate). A model that
// owns such a dimension pads it where it can at no change to its results: the chunked loss pads
// its logits blocks to a multiple of 64 classes when model.loss_pad_classes is unset, and
// `mixtrain check` warns about unaligned 16-bit GEMM dimensions only on such a backend.
inline constexpr std::string_view kFeatureGemmWantsAlignedRows = "gemm_wants_aligned_rows";

// The GEMM facet runs a GEMM of a few hundred rows at its full rate (a CPU library blocks by cache,
// not by a GPU's waves of output tiles), while its scratch grows with the rows (a 16-bit C's fp32
// copy before its rounding, an emulated operand's decoded copy). The chunked loss then takes
// blocks of kLossChunkRowsFewRows rows (core's model_spec.h: 512) when model.loss_chunk_rows is
// unset: GPT-2 small's [rows, 50257] logits block, its gradient and the GEMMs' copies of them take
// half the bytes of 1024-row blocks, in less wall time (bench/RESULTS.md, sessions 61 and 68).
inline constexpr std::string_view kFeatureGemmFullRateAtFewRows = "gemm_full_rate_at_few_rows";

// The GEMM facet's bf16 GEMMs (bf16 A and B, a bf16 C) run faster as a plain GEMM followed by the
// activation facet's gelu than with gemm()'s gelu epilogue or gemm_gradient's gelu gradient: the
// plain GEMM writes its bf16 C itself, where an epilogue takes the product in FP32 first, twice
// the bytes (the CPU backend on native bf16 GEMMs: GPT-2 small's MLP forward 0.80x and its
// input gradient 0.73-0.81x fused against unfused on an AMX Xeon, its step 3.6-4.2 %
// faster unfused; bench/RESULTS.md, session 68). A linear whose GEMMs are bf16 then leaves a gelu
// after it to the activation facet, forward and backward: the gelu reads the rounded z, and its
// gradient the rounded dgrad, as PyTorch AMP computes them. A relu stays fused: it commutes with
// the rounding, so both ways give the same bits.
inline constexpr std::string_view kFeatureGemmBf16GeluUnfused = "gemm_bf16_gelu_unfused";

// Whether `caps` lists the feature `name`.
inline bool has_feature(const BackendCapabilities& caps, std::string_view name) {
  return std::find(caps.features.begin(), caps.features.end(), name) != caps.features.end();
}

}  // namespace mixtrain::sdk
