// QuantizedWeight: a frozen linear weight stored in a block-quantized format instead of the compute
// dtype (graph/freezing.h, train.frozen_format), and the moves between it and FP32 host values.
//
// Contract
// - Formats (FrozenFormat): nf4 — QLoRA's NF4 (sdk/support/nf4.h), the tensor read flat in blocks
//   of `block` elements, packed 4-bit codes and an fp32 absmax per block. fp8_block — E4M3 in
//   128×128 blocks with power-of-two fp32 scales; mxfp8 — E4M3 in 1×32 blocks along the input
//   features (the GEMM's reduction dim) with E8M0 scales, each the smallest power of two that
//   saturates nothing (sdk/support/block_scaling.h: fp8_block_weight_layout with power-of-two
//   scales, and mx_layout with e8m0_round_up, Transformer Engine's MXFP8 rule; the OCP rule's
//   floor would clamp the top binade of every block to 448). The block formats keep one
//   code byte per element and, for E8M0, one scale byte per block (the quantized_weight facet's
//   BlockScaledWeight).
// - Round trip: a checkpoint holds a quantized weight decoded to FP32, and a resume quantizes it
//   again. Every format here gives back the same decoded values: NF4's absmax decodes exactly
//   (its code book holds ±1); the power-of-two and E8M0 scales make every decoded value exact,
//   and the block's largest one lands in the same binade (a block whose largest code is 224 may
//   move its scale by a factor of 2 and its codes by the inverse: no decoded value moves). fp32
//   scales (Transformer Engine's default) or NVFP4's per-tensor scale would drift by ulps on each
//   round trip, which is why they are not offered for a base.
// - quantize_from_host reads shape.numel() floats; std::invalid_argument for a non-finite value
//   (no block format or NF4 code encodes one), naming its index.
// - decode() runs the backend's quantized_weight facet into `out` (shape and storage dtype given by
//   the caller); dequantize_to_host() is the SDK's host reference, bit for bit what the backend
//   decodes into fp32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/graph/freezing.h"
#include "mixtrain/core/graph/tensor.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

class BoundFacets;

struct QuantizedWeight {
  FrozenFormat format = FrozenFormat::compute;  // compute: empty
  Tensor codes;            // NF4: packed codes; block formats: one code byte per element
  Tensor scales;           // NF4: fp32 absmax per block; fp8_block: fp32; mxfp8: E8M0 bytes
  sdk::Shape shape;        // the weight's [out, in]
  std::int64_t block = 0;  // NF4's block size; 0 for the block formats (their layout fixes it)
  bool empty() const { return codes.empty(); }
  std::size_t bytes() const { return empty() ? 0 : codes.bytes() + scales.bytes(); }
};

// The block-scaled layout of a block format (fp8_block, mxfp8).
sdk::BlockScaledLayout base_layout(FrozenFormat format);
// "NF4", "fp8-block", "mxfp8": the format's name in messages, as train.frozen_format spells it
// (upper-case NF4, as the memory lines always printed it).
std::string format_label(FrozenFormat format);
// "blocks of 64", "e4m3 128x128 fp32_pow2 scales", for messages and the memory report.
std::string format_detail(const QuantizedWeight& w);

// Allocated, unfilled storage for a weight of `shape` (rank 2 for the block formats).
QuantizedWeight make_quantized_weight(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                      FrozenFormat format, sdk::Shape shape, std::int64_t block);
void quantize_from_host(sdk::DeviceBackend& backend, QuantizedWeight& w, const float* host);
std::vector<float> dequantize_to_host(sdk::DeviceBackend& backend, const QuantizedWeight& w);
// w decoded into out (w.shape, fp32/bf16/fp16) by the backend.
void decode(const BoundFacets& facets, const QuantizedWeight& w, sdk::TensorView out);
// The quantized_weight op that decodes `format` (for the plan's backend check).
sdk::QuantizedWeightOp decode_op(FrozenFormat format);

}  // namespace mixtrain::core
