// bf16 storage as the CPU kernels read and write it inline: the value's top 16 bits, decoded
// exactly, encoded by one round to nearest even with NaNs quieted, as sdk/float_formats.h's
// encode_bf16 with Overflow::to_inf_or_nan (checked bit for bit against it in the tests). Written
// so that loops over them vectorise at every ISA the kernels are compiled for (cpu_isa.h).
#pragma once

#include <bit>
#include <cstdint>

namespace mixtrain::backend_cpu {

using Bf16Bits = std::uint16_t;

// fp32 -> bf16 bits, round to nearest even; NaN -> quiet NaN of the same sign.
inline Bf16Bits bf16_from_float(float v) {
  const auto u = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<Bf16Bits>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}
inline float float_from_bf16(Bf16Bits b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// Element i of fp32 or bf16 storage as fp32, and v stored into it (rounded once into bf16): a
// kernel's loops written once for both storages. Always inlined, so they compile for the ISA
// variant that calls them (cpu_isa.h).
[[gnu::always_inline]] inline float load_as_float(const float* p, std::int64_t i) {
  return p[i];
}
[[gnu::always_inline]] inline float load_as_float(const Bf16Bits* p, std::int64_t i) {
  return float_from_bf16(p[i]);
}
[[gnu::always_inline]] inline void store_rounded(float* p, std::int64_t i, float v) {
  p[i] = v;
}
[[gnu::always_inline]] inline void store_rounded(Bf16Bits* p, std::int64_t i, float v) {
  p[i] = bf16_from_float(v);
}

}  // namespace mixtrain::backend_cpu
