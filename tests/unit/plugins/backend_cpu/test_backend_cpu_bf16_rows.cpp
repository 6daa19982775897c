// Strided bf16 rows decoded and encoded inline (cpu_bf16_rows.h) on every ISA variant this CPU
// runs: the SDK's converter's values bit for bit (specials and rounding ties included), each row
// at its stride, and nothing between the rows touched.
#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend_test_util.h"
#include "cpu_bf16_rows.h"
#include "isa_variants.h"

namespace mixtrain::backend_cpu::testing {
namespace {

TEST(BackendCpuBf16Rows, DecodeAndEncodeAreTheSdksAtEveryStrideAndIsa) {
  const std::int64_t count = 7, d = 37, stride = 45;  // d past a vector's lanes; gaps between rows
  std::mt19937 rng(5);
  std::vector<float> src(static_cast<std::size_t>(count * d));
  for (float& v : src) v = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
  // Specials and ties among the random bit patterns.
  const std::uint32_t specials[] = {0x7F800000u, 0xFF800000u, 0x7FC00001u, 0xFF800001u,
                                    0x3F808000u, 0x3F818000u, 0x7F7FFFFFu, 0x00008000u};
  for (std::size_t i = 0; i < std::size(specials); ++i)
    src[i * 5] = std::bit_cast<float>(specials[i]);
  for (const Isa isa : runnable_isas()) {
    const IsaScope as_isa(isa);
    constexpr Bf16Bits kUntouched = 0xABCD;
    std::vector<Bf16Bits> stored(static_cast<std::size_t>(count * stride), kUntouched);
    encode_bf16_rows(src.data(), count, d, stored.data(), stride);
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t j = 0; j < stride; ++j) {
        const Bf16Bits got = stored[static_cast<std::size_t>(r * stride + j)];
        if (j >= d) {
          ASSERT_EQ(got, kUntouched) << isa_name(isa) << ": row " << r << ", gap " << j;
          continue;
        }
        const float v = src[static_cast<std::size_t>(r * d + j)];
        ASSERT_EQ(got, sdk::encode_bf16(v, sdk::Overflow::to_inf_or_nan))
            << isa_name(isa) << ": fp32 bits 0x" << std::hex << std::bit_cast<std::uint32_t>(v);
      }
    std::vector<float> decoded(static_cast<std::size_t>(count * d));
    decode_bf16_rows(stored.data(), stride, count, d, decoded.data());
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t j = 0; j < d; ++j) {
        const Bf16Bits b = stored[static_cast<std::size_t>(r * stride + j)];
        ASSERT_EQ(std::bit_cast<std::uint32_t>(decoded[static_cast<std::size_t>(r * d + j)]),
                  static_cast<std::uint32_t>(b) << 16)
            << isa_name(isa);
        if (!std::isnan(sdk::decode_bf16(b))) {
          ASSERT_EQ(decoded[static_cast<std::size_t>(r * d + j)], sdk::decode_bf16(b));
        }
      }
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
