// Block scales as cuBLASLt reads them: where each block's scale of a block-scaled operand goes in
// the scale tensor of cuBLASLt's scale modes, and the 8-bit scale bytes of the MX / NVFP4 modes.
//
// Contract
// - Plain C++ with MIXTRAIN_SDK_HOST_DEVICE functions: the kernels that arrange scales
//   (cuda_block_scaled_kernels.cu) call them per element, and the host test checks them.
// - Frame: cuBLASLt's. An operand is op(X) [outer, k] with k the reduction dim: outer is m for our
//   A and n for our B (cuBLASLt's B and A, cuda_gemm.h's mapping); L = ceil(k / kblock) k-blocks.
// - The SDK's scales (backend_gemm.h, BlockScaledOperand) are one fp32 decode scale per block of
//   the stored [rows, cols] tensor, a row-major grid; sdk_scale_index() finds the one that covers
//   op-frame element (o, kk).
// - cuBLASLt's layouts (the cuBLAS documentation, "Scaling factors layouts" and "1D Block Scaling
//   Factors Layout"; starting addresses 16-byte aligned):
//   VEC128_32F: outer-major [L][outer_pad], outer_pad = outer rounded up to 4 (cuBLASLt wants m
//               and n multiples of 4, so the GEMM pads outer and the padded entries are 0);
//   BLK128x128_32F: K-major [ceil(outer / 128)][L4], L4 = L rounded up to 4 (the column stride
//               must be a multiple of 4; entries l >= L are 0);
//   VEC32_UE8M0 / VEC16_UE4M3: 128 x 4 tiles (128 outer by 4 k-blocks, 512 bytes, inner offset
//               (o % 32) * 16 + ((o % 128) / 32) * 4 + l % 4), the tiles row-major over
//               [ceil(outer / 128)][ceil(L / 4)]; out-of-range entries 0.
// - Scale bytes: E8M0 (UE8M0) for a power of two 2^k, k in [-127, 127], and E4M3 (UE4M3) for an
//   E4M3 value, both exact; NaN gives the format's NaN (0xFF, 0x7F). A value the format cannot
//   hold exactly returns false: the SDK's quantizers never produce one.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/support/float_format_rules.h"

namespace mixtrain::backend_cuda::block_scales {

namespace fr = sdk::format_rules;

// An operand's SDK scale grid and how op() reads its stored tensor.
struct ScaleSource {
  std::int64_t grid_cols;               // ceil(stored cols / block_cols)
  std::int64_t block_rows, block_cols;  // the layout's block extents
  bool transpose;                       // op(X) is the stored tensor's transpose
};

// The SDK grid index of the block holding op-frame element (o, kk).
MIXTRAIN_SDK_HOST_DEVICE std::int64_t sdk_scale_index(const ScaleSource& s, std::int64_t o,
                                                      std::int64_t kk) {
  const std::int64_t r = s.transpose ? kk : o, c = s.transpose ? o : kk;
  return (r / s.block_rows) * s.grid_cols + c / s.block_cols;
}

MIXTRAIN_SDK_HOST_DEVICE std::int64_t round_up(std::int64_t v, std::int64_t to) {
  return (v + to - 1) / to * to;
}

// VEC128_32F: scale of (o, k-block l), outer_pad = round_up(outer, 4).
MIXTRAIN_SDK_HOST_DEVICE std::int64_t vec128_offset(std::int64_t o, std::int64_t l,
                                                    std::int64_t outer_pad) {
  return l * outer_pad + o;
}
MIXTRAIN_SDK_HOST_DEVICE std::int64_t vec128_count(std::int64_t outer, std::int64_t L) {
  return L * round_up(outer, 4);
}

// BLK128x128_32F: scale of (outer block ob, k-block l).
MIXTRAIN_SDK_HOST_DEVICE std::int64_t blk128_offset(std::int64_t ob, std::int64_t l,
                                                    std::int64_t L) {
  return ob * round_up(L, 4) + l;
}
MIXTRAIN_SDK_HOST_DEVICE std::int64_t blk128_count(std::int64_t outer, std::int64_t L) {
  return (outer + 127) / 128 * round_up(L, 4);
}

// VEC32_UE8M0 / VEC16_UE4M3 (one byte per scale): the 128 x 4 tiled layout.
MIXTRAIN_SDK_HOST_DEVICE std::int64_t tiled_offset(std::int64_t o, std::int64_t l, std::int64_t L) {
  const std::int64_t tiles_per_row = round_up(L, 4) / 4;
  const std::int64_t tile = (o / 128) * tiles_per_row + l / 4;
  return tile * 512 + (o % 32) * 16 + ((o % 128) / 32) * 4 + l % 4;
}
MIXTRAIN_SDK_HOST_DEVICE std::int64_t tiled_count(std::int64_t outer, std::int64_t L) {
  return round_up(outer, 128) * round_up(L, 4);
}

// The UE8M0 byte of a decode scale 2^k (E8M0: code k + 127; 2^-127 is an fp32 subnormal).
MIXTRAIN_SDK_HOST_DEVICE bool e8m0_scale_byte(float v, std::uint8_t& out) {
  const fr::u32 b = fr::bits_of(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
    out = 0xFF;
    return true;
  }
  const fr::u32 code = fr::encode_e8m0(v);
  if (code == fr::kE8M0Nan || fr::bits_of(fr::decode_e8m0(code)) != b) return false;
  out = static_cast<std::uint8_t>(code);
  return true;
}

// The UE4M3 byte of an E4M3 decode scale (NVFP4's block scales are >= 0; 0 is a block of zeros).
MIXTRAIN_SDK_HOST_DEVICE bool ue4m3_scale_byte(float v, std::uint8_t& out) {
  const fr::u32 b = fr::bits_of(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
    out = 0x7F;
    return true;
  }
  if ((b >> 31) != 0) return false;
  const fr::u32 code = fr::encode<fr::E4M3>(v, false);
  if (fr::bits_of(fr::decode<fr::E4M3>(code)) != b) return false;
  out = static_cast<std::uint8_t>(code);
  return true;
}

// The byte a cuBLASLt MX / NVFP4 scale slot holds for decode scale v: its exact E8M0 or UE4M3
// byte, or the format's NaN for a value it cannot hold (never produced by the SDK's quantizers; a
// NaN makes the broken block visible in the result instead of silently wrong).
MIXTRAIN_SDK_HOST_DEVICE std::uint8_t scale_byte_or_nan(float v, bool e8m0) {
  std::uint8_t out = 0;
  if (e8m0) return e8m0_scale_byte(v, out) ? out : std::uint8_t{0xFF};
  return ue4m3_scale_byte(v, out) ? out : std::uint8_t{0x7F};
}

// The byte cuBLASLt's MX / NVFP4 modes read at (o, l) of an operand op(X) [outer, k] whose
// k-blocks are k_block wide: the decode scale of the SDK block covering (o, l * k_block) as its
// E8M0 / UE4M3 byte; 0 for a padding row (o >= outer) or k-block (l * k_block >= k). The tiled
// layout's L is that of the padded k cuBLASLt is given (k_pad / k_block), not ceil(k / k_block).
MIXTRAIN_SDK_HOST_DEVICE std::uint8_t tiled_scale_byte(const float* scales, const ScaleSource& s,
                                                       std::int64_t k_block, bool e8m0,
                                                       std::int64_t outer, std::int64_t k,
                                                       std::int64_t o, std::int64_t l) {
  if (o >= outer || l * k_block >= k) return 0;
  return scale_byte_or_nan(scales[sdk_scale_index(s, o, l * k_block)], e8m0);
}

// Two E2M1 codes in one byte as CUDA_R_4F_E2M1 stores them: the first (lower k) in the low nibble
// (sdk::pack_e2m1's order).
MIXTRAIN_SDK_HOST_DEVICE std::uint8_t e2m1_pair(std::uint8_t first, std::uint8_t second) {
  return static_cast<std::uint8_t>((first & 0x0Fu) | ((second & 0x0Fu) << 4));
}

}  // namespace mixtrain::backend_cuda::block_scales
