// The fp8-block quantizer's math per block and per element, as the quantize kernel
// (cuda_block_quantize.cu) runs it and as the host test runs it against the SDK's reference
// quantize_block_scaled() (sdk/support/block_scaling.h), bit for bit.
//
// Contract
// - Plain C++ with MIXTRAIN_SDK_HOST_DEVICE functions; the rules are the SDK's own
//   (float_format_rules.h: the fp32 block scale, the scaled element value, the saturating E4M3 /
//   E5M2 encodes, the counter-based random bits), so there is no second copy of them here.
// - BlockStats gathers a block's largest finite magnitude as fp32 bits (for magnitudes integer
//   order is numeric order) and whether every element was finite, in any order: the result does
//   not depend on how a kernel partitions the block. Zero padding (a partial block) adds nothing.
// - A block with a NaN or an infinity encodes to a NaN decode scale and codes 0; a block of zeros
//   to scale 1 and signed-zero codes (block_scaling.h's special blocks).
#pragma once

#include <cstdint>

#include "mixtrain/sdk/support/float_format_rules.h"

namespace mixtrain::backend_cuda::block_quantize {

namespace fr = sdk::format_rules;

struct BlockStats {
  fr::u32 amax_bits;
  bool finite;
};

MIXTRAIN_SDK_HOST_DEVICE BlockStats empty_stats() {
  return {0u, true};
}

MIXTRAIN_SDK_HOST_DEVICE void add(BlockStats& s, float x) {
  const fr::u32 a = fr::abs_bits(x);
  if (a >= 0x7F800000u)
    s.finite = false;
  else if (a > s.amax_bits)
    s.amax_bits = a;
}

MIXTRAIN_SDK_HOST_DEVICE BlockStats merge(BlockStats a, BlockStats b) {
  return {a.amax_bits > b.amax_bits ? a.amax_bits : b.amax_bits, a.finite && b.finite};
}

// One fp32-scaled block: its encode scale s, its stored decode scale 1 / s.
struct Fp32Encoding {
  float encode_scale;
  float decode_scale;
  bool finite;
};

MIXTRAIN_SDK_HOST_DEVICE Fp32Encoding encode_block(BlockStats s, bool e5m2, bool pow2) {
  if (!s.finite) return {1.0f, fr::float_of(0x7FC00000u), false};
  const float max_elem =
      e5m2 ? fr::decode<fr::E5M2>(fr::E5M2::kMax) : fr::decode<fr::E4M3>(fr::E4M3::kMax);
  const float es = fr::fp32_block_encode_scale(fr::float_of(s.amax_bits), max_elem, pow2);
  return {es, fr::fp32_block_decode_scale(es), true};
}

// The code of element x of a block encoded as e; rbits are read only when `stochastic`.
MIXTRAIN_SDK_HOST_DEVICE std::uint8_t element_code(float x, const Fp32Encoding& e, bool e5m2,
                                                   bool stochastic, fr::u32 rbits) {
  if (!e.finite) return 0;
  const float v = fr::block_scaled_value(x, e.encode_scale);
  fr::u32 c;
  if (e5m2)
    c = stochastic ? fr::encode_scaled_stochastic<fr::E5M2>(v, 0, true, rbits)
                   : fr::encode_scaled<fr::E5M2>(v, 0, true);
  else
    c = stochastic ? fr::encode_scaled_stochastic<fr::E4M3>(v, 0, true, rbits)
                   : fr::encode_scaled<fr::E4M3>(v, 0, true);
  return static_cast<std::uint8_t>(c);
}

}  // namespace mixtrain::backend_cuda::block_quantize
