#include "cpu_nf4_decode.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "cpu_access.h"
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

}  // namespace

void decode_nf4(const std::uint8_t* codes, const float* absmax, std::int64_t block,
                const sdk::TensorView& out) {
  const std::int64_t n = out.numel();
  const std::int64_t blocks = sdk::nf4_block_count(n, block);
  const bool wide = is_fp32_storage(out.dtype);
  // Runs of kRun blocks: their tables are formed, then rounded in one conversion (a call per
  // block's 16 values cost more than the lookups).
  constexpr std::int64_t kRun = 256;
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (std::int64_t r0 = 0; r0 < blocks; r0 += kRun) {
    const std::int64_t run = std::min(kRun, blocks - r0);
    float values[kRun * 16];
    for (std::int64_t b = 0; b < run; ++b)
      for (int k = 0; k < 16; ++k) values[b * 16 + k] = sdk::kNf4Codebook[k] * absmax[r0 + b];
    std::uint16_t tables[kRun * 16];
    if (!wide)
      sdk::convert(std::span<const float>(values, static_cast<std::size_t>(run * 16)),
                   std::span<std::uint16_t>(tables, static_cast<std::size_t>(run * 16)), out.dtype,
                   sdk::EncodeOptions{});
    for (std::int64_t b = 0; b < run; ++b) {
      const std::int64_t i0 = (r0 + b) * block, i1 = std::min(n, i0 + block);
      if (wide)
        lookup_block(codes, i0, i1, values + b * 16, static_cast<float*>(out.data));
      else
        lookup_block(codes, i0, i1, tables + b * 16, static_cast<std::uint16_t*>(out.data));
    }
  }
}

}  // namespace mixtrain::backend_cpu
