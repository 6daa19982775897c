// The block quantizers' math per block and per element, as the quantize kernels run it (fp8-block:
// cuda_block_quantize.cu; MXFP8 and NVFP4: cuda_byte_scaled_quantize.cu) and as the host test runs
// it against the SDK's reference quantize_block_scaled() (sdk/support/block_scaling.h), bit for
// bit.
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
// - The 8-bit-scaled formats (MX: E8M0 scales; NVFP4: E4M3 scales and an fp32 tensor scale) pass
//   a block's statistics as one word (packed_stats: the amax bits, or kNonFiniteBlock), so a
//   kernel can keep them in the fp32 scale slot of the block until it writes the decode scale
//   there; an element's code needs only its block's decode scale (and the tensor's decode scale).
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

// ---- MX (E8M0 scales) and NVFP4 (E4M3 scales, fp32 tensor scale) ----------------------------

// The element format (codes) and the scale rule of an 8-bit-scaled layout.
enum class ByteElement : int { e4m3 = 0, e5m2 = 1, e2m1 = 2 };
enum class ByteScaleRule : int { e8m0_floor = 0, e8m0_round_up = 1, nvfp4 = 2 };

inline constexpr fr::u32 kNonFiniteBlock = 0xFFFFFFFFu;  // above every finite amax's bits

MIXTRAIN_SDK_HOST_DEVICE fr::u32 packed_stats(BlockStats s) {
  return s.finite ? s.amax_bits : kNonFiniteBlock;
}

// The MX exponent k of a block (decode scale 2^k), the SDK's rule for the element format.
MIXTRAIN_SDK_HOST_DEVICE int mx_exponent(fr::u32 amax_bits, ByteElement element, bool round_up) {
  switch (element) {
    case ByteElement::e4m3:
      return round_up ? fr::mx_scale_exponent_round_up<fr::E4M3>(amax_bits)
                      : fr::mx_scale_exponent_floor<fr::E4M3>(amax_bits);
    case ByteElement::e5m2:
      return round_up ? fr::mx_scale_exponent_round_up<fr::E5M2>(amax_bits)
                      : fr::mx_scale_exponent_floor<fr::E5M2>(amax_bits);
    default:
      return round_up ? fr::mx_scale_exponent_round_up<fr::E2M1>(amax_bits)
                      : fr::mx_scale_exponent_floor<fr::E2M1>(amax_bits);
  }
}

// A block's decode scale (what BlockScaledOperand::scales holds): 2^k for MX, the E4M3 value for
// NVFP4 (tensor_encode_scale is NVFP4's S_enc, unused for MX); NaN for a non-finite block.
MIXTRAIN_SDK_HOST_DEVICE float byte_scaled_decode_scale(fr::u32 stats, ByteElement element,
                                                        ByteScaleRule rule,
                                                        float tensor_encode_scale) {
  if (stats == kNonFiniteBlock) return fr::float_of(0x7FC00000u);
  if (rule == ByteScaleRule::nvfp4)
    return fr::decode<fr::E4M3>(
        fr::nvfp4_block_scale_code(fr::float_of(stats), tensor_encode_scale));
  const int k = mx_exponent(stats, element, rule == ByteScaleRule::e8m0_round_up);
  return fr::decode_e8m0(static_cast<fr::u32>(k + fr::kE8M0Bias));
}

template <class F>
MIXTRAIN_SDK_HOST_DEVICE fr::u32 encode_as(float v, int shift, bool stochastic, fr::u32 rbits) {
  return stochastic ? fr::encode_scaled_stochastic<F>(v, shift, true, rbits)
                    : fr::encode_scaled<F>(v, shift, true);
}

// The code of element x of a block whose decode scale is `scale` (tensor_decode_scale: NVFP4's
// S_dec, unused for MX); rbits are read only when `stochastic`. A NaN scale (non-finite block)
// gives 0.
MIXTRAIN_SDK_HOST_DEVICE std::uint8_t byte_scaled_element_code(float x, float scale,
                                                               float tensor_decode_scale,
                                                               ByteElement element,
                                                               ByteScaleRule rule, bool stochastic,
                                                               fr::u32 rbits) {
  if ((fr::bits_of(scale) & 0x7FFFFFFFu) > 0x7F800000u) return 0;
  float v = x;
  int shift = 0;
  if (rule == ByteScaleRule::nvfp4) {
    v = fr::block_scaled_value(x, fr::nvfp4_block_encode_scale(scale, tensor_decode_scale));
  } else {
    // scale is 2^k exactly (an E8M0 value): elements are scaled by 2^-k inside the encode.
    shift = fr::kE8M0Bias - static_cast<int>(fr::encode_e8m0(scale));
  }
  fr::u32 c;
  switch (element) {
    case ByteElement::e4m3:
      c = encode_as<fr::E4M3>(v, shift, stochastic, rbits);
      break;
    case ByteElement::e5m2:
      c = encode_as<fr::E5M2>(v, shift, stochastic, rbits);
      break;
    default:
      c = encode_as<fr::E2M1>(v, shift, stochastic, rbits);
      break;
  }
  return static_cast<std::uint8_t>(c);
}

}  // namespace mixtrain::backend_cuda::block_quantize
