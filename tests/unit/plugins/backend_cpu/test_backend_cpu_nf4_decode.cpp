// The NF4 decode (cpu_nf4_decode.h) on every ISA variant and thread count: each element the SDK
// reference's value rounded once into bf16 and fp16, bit for bit, for the block sizes the byte-
// table lookups take (multiples of 32, whole blocks) and those they leave to the element loop
// (odd sizes, a last partial block), every code of the codebook present.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "cpu_nf4_decode.h"
#include "isa_variants.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::backend_cpu::testing {
namespace {

// The reference: nf4_dequantize's fp32 values, each rounded once into `dtype`'s bits.
std::vector<std::uint16_t> reference_bits(const sdk::Nf4Tensor& q, DType dtype) {
  const std::vector<float> values = sdk::nf4_dequantize(q);
  std::vector<std::uint16_t> bits(values.size());
  sdk::convert(std::span<const float>(values), std::span<std::uint16_t>(bits), dtype,
               sdk::EncodeOptions{});
  return bits;
}

TEST(backend_cpu_nf4_decode, EveryIsaAndThreadCountGivesTheReferenceRoundedOnce) {
  // 3,072 elements fill every block but 63's; 40,001 end each in a partial block and run in
  // parallel. 48 and 63 are not multiples of 32 (63 starts blocks on a low nibble).
  for (const std::int64_t elements : {3072, 40001}) {
    std::vector<float> x = random_values(static_cast<std::size_t>(elements), 76, -1.0f, 1.0f);
    for (std::int64_t i = 0; i < 16; ++i)
      x[static_cast<std::size_t>(i)] = -1.0f + static_cast<float>(i) / 7.5f;
    for (std::int64_t i = 256; i < 512; ++i) x[static_cast<std::size_t>(i)] = 0.0f;  // zero blocks
    for (const std::int64_t block : {32, 64, 128, 96, 48, 63})
      for (const DType dtype : {DType::bf16, DType::fp16}) {
        const sdk::Nf4Tensor q = sdk::nf4_quantize(x, block);
        const std::vector<std::uint16_t> want = reference_bits(q, dtype);
        for (const auto& [threads, isa] : thread_and_isa_runs()) {
          const IsaScope scope(isa);
          CpuBackend be(threads);  // the OpenMP team decode_nf4 runs on
          std::vector<std::uint16_t> got(static_cast<std::size_t>(elements), 0xdead);
          decode_nf4(q.codes.data(), q.absmax.data(), block, {got.data(), dtype, Shape{elements}});
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 2), 0)
              << elements << " elements, block " << block << ", " << sdk::dtype_name(dtype) << ", "
              << isa_name(isa) << ", " << threads << " thread(s)";
        }
      }
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
