#include "cpu_nf4_decode.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "cpu_access.h"
#include "cpu_isa.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::backend_cpu {

namespace {

// Elements [i0, i1) of one block, each its code's entry of `table`. T is float or std::uint16_t.
template <class T>
void lookup_block(const std::uint8_t* codes, std::int64_t i0, std::int64_t i1, const T* table,
                  T* out) {
  std::int64_t i = i0;
  if (i < i1 && (i & 1) != 0) {  // a block that starts on a low nibble (an odd block size)
    out[i] = table[codes[i >> 1] & 15];
    ++i;
  }
  for (; i + 1 < i1; i += 2) {
    const std::uint8_t byte = codes[i >> 1];
    out[i] = table[byte >> 4];
    out[i + 1] = table[byte & 15];
  }
  if (i < i1) out[i] = table[codes[i >> 1] >> 4];
}

// A whole block of 16-bit values, `count` elements (a multiple of 32) from an even element, each
// its code's entry of `table`, 32 at a time: the table's low and high bytes are two 16-entry
// byte tables, which pshufb reads by the codes' nibbles, high nibble first as the codes store
// them. The same lookups as lookup_block, so the same bits, in about 0.4 of its time
// (bench/RESULTS.md, session 76). SSSE3, which every x86-64-v3 CPU has.
__attribute__((target("ssse3"))) void lookup_block_bytes(const std::uint8_t* codes,
                                                         std::int64_t count,
                                                         const std::uint16_t* table,
                                                         std::uint16_t* out) {
  const __m128i w0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(table));
  const __m128i w1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(table + 8));
  const __m128i low_bytes =
      _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i high_bytes =
      _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  // table [16] as bytes: lo_tab[k] = table[k] & 0xff, hi_tab[k] = table[k] >> 8.
  const __m128i lo_tab =
      _mm_unpacklo_epi64(_mm_shuffle_epi8(w0, low_bytes), _mm_shuffle_epi8(w1, low_bytes));
  const __m128i hi_tab =
      _mm_unpacklo_epi64(_mm_shuffle_epi8(w0, high_bytes), _mm_shuffle_epi8(w1, high_bytes));
  const __m128i nibble = _mm_set1_epi8(0x0f);
  for (std::int64_t i = 0; i < count; i += 32) {
    // 16 code bytes are elements i .. i + 31: element 2j is byte j's high nibble.
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(c, 4), nibble);
    const __m128i lo = _mm_and_si128(c, nibble);
    const __m128i idx[2] = {_mm_unpacklo_epi8(hi, lo), _mm_unpackhi_epi8(hi, lo)};
    for (int h = 0; h < 2; ++h) {
      const __m128i l = _mm_shuffle_epi8(lo_tab, idx[h]);
      const __m128i u = _mm_shuffle_epi8(hi_tab, idx[h]);
      auto* to = reinterpret_cast<__m128i*>(out + i + 16 * h);
      _mm_storeu_si128(to, _mm_unpacklo_epi8(l, u));
      _mm_storeu_si128(to + 1, _mm_unpackhi_epi8(l, u));
    }
  }
}

// `blocks` whole blocks of `block` 16-bit values (a multiple of 32) from element `first` (even),
// block b through its 16 values at tables + 16 b, 32 elements a step with vpermw (AVX-512 BW):
// 16 code bytes widen to 16 pairs of words, each pair's low word its byte's high nibble (the even
// element) and its high word the low nibble, so one permute of the block's table in a register
// writes the 32 values in order. The same lookups as lookup_block, so the same bits; one call a
// run, so the blocks' lookups are inlined into one loop.
__attribute__((target("avx512f,avx512bw"))) void lookup_blocks_words(
    const std::uint8_t* codes, std::int64_t first, std::int64_t blocks, std::int64_t block,
    const std::uint16_t* tables, std::uint16_t* out) {
  // The zero-masked forms: GCC 12 warns that the unmasked ones' undefined source is read.
  constexpr __mmask16 kAll = 0xffff;
  const __m512i nibble = _mm512_set1_epi32(0x0f);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const __m512i table = _mm512_maskz_loadu_epi16(kAll, tables + 16 * b);  // words 16-31 zero
    const std::int64_t i0 = first + b * block;
    for (std::int64_t i = i0; i < i0 + block; i += 32) {
      const __m512i byte = _mm512_maskz_cvtepu8_epi32(
          kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2)));
      const __m512i idx =
          _mm512_or_si512(_mm512_maskz_srli_epi32(kAll, byte, 4),
                          _mm512_maskz_slli_epi32(kAll, _mm512_and_si512(byte, nibble), 16));
      _mm512_storeu_si512(out + i, _mm512_permutexvar_epi16(idx, table));
    }
  }
}

// values [run, 16]: block b's 16 levels times its absmax, one fp32 product each (so the same bits
// on every variant: nothing to contract). Per ISA, so that a block's 16 products are one AVX-512
// multiply; the baseline build vectorised across blocks with shuffles, a tenth of the decode.
[[gnu::always_inline]] inline void block_values(const float* absmax, std::int64_t run,
                                                float* values) {
  for (std::int64_t b = 0; b < run; ++b) {
    const float a = absmax[b];
#pragma omp simd
    for (int k = 0; k < 16; ++k) values[b * 16 + k] = sdk::kNf4Codebook[k] * a;
  }
}

MIXTRAIN_ISA_VARIANTS(block_values)

}  // namespace

void decode_nf4(const std::uint8_t* codes, const float* absmax, std::int64_t block,
                const sdk::TensorView& out) {
  const std::int64_t n = out.numel();
  const std::int64_t blocks = sdk::nf4_block_count(n, block);
  const bool wide = is_fp32_storage(out.dtype);
  // Whole blocks of a multiple of 32 (QLoRA's 64) take the byte-table lookups where the CPU has
  // them (any x86-64-v3, and not under limit_isa(baseline), so tests run both).
  const bool bytes = !wide && block % 32 == 0 && best_isa() != Isa::baseline;
  // With AVX-512, the same blocks 32 at a time with one permute (lookup_blocks_words).
  const bool words = bytes && best_isa() == Isa::v4;
  // Runs of kRun blocks: their tables are formed, then rounded in one conversion (a call per
  // block's 16 values cost more than the lookups).
  constexpr std::int64_t kRun = 256;
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (std::int64_t r0 = 0; r0 < blocks; r0 += kRun) {
    const std::int64_t run = std::min(kRun, blocks - r0);
    float values[kRun * 16];
    block_values_best(absmax + r0, run, values);
    std::uint16_t tables[kRun * 16];
    if (!wide)
      sdk::convert(std::span<const float>(values, static_cast<std::size_t>(run * 16)),
                   std::span<std::uint16_t>(tables, static_cast<std::size_t>(run * 16)), out.dtype,
                   sdk::EncodeOptions{});
    std::int64_t b = 0;
    if (words) {  // the run's whole blocks (all but a partial last one)
      b = std::min(run, (n - r0 * block) / block);
      lookup_blocks_words(codes, r0 * block, b, block, tables,
                          static_cast<std::uint16_t*>(out.data));
    }
    for (; b < run; ++b) {
      const std::int64_t i0 = (r0 + b) * block, i1 = std::min(n, i0 + block);
      if (bytes && i1 - i0 == block)
        lookup_block_bytes(codes + i0 / 2, block, tables + b * 16,
                           static_cast<std::uint16_t*>(out.data) + i0);
      else if (wide)
        lookup_block(codes, i0, i1, values + b * 16, static_cast<float*>(out.data));
      else
        lookup_block(codes, i0, i1, tables + b * 16, static_cast<std::uint16_t*>(out.data));
    }
  }
}

}  // namespace mixtrain::backend_cpu
