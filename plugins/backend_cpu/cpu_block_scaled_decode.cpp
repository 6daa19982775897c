// The block-scaled weight decode (contract in cpu_block_scaled_decode.h).
#include "cpu_block_scaled_decode.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <memory>
#include <span>
#include <vector>

#include "cpu_access.h"
#include "cpu_isa.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu {

namespace {

// y [cols] = row r's elements, the first at element index `first` of the codes: per run of
// block_cols elements (one scale), value · (scale · tensor_scale) in double, rounded to fp32.
// Without a tensor scale (every frozen base's layout) the product has one factor besides the
// value, and fp32's own multiply rounds it once, as the exact double product rounded to fp32
// does: the same bits at twice the lanes.
template <bool kPacked, bool kTensorScale>
[[gnu::always_inline]] inline void decode_row(const std::uint8_t* codes, std::int64_t first,
                                              std::int64_t cols, const float* values,
                                              const float* row_scales, std::int64_t block_cols,
                                              double tensor_scale, float* y) {
  for (std::int64_t c0 = 0, b = 0; c0 < cols; c0 += block_cols, ++b) {
    const std::int64_t c1 = std::min(cols, c0 + block_cols);
    const double s = static_cast<double>(row_scales[b]) * tensor_scale;
    const float s1 = row_scales[b];
#pragma omp simd
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t i = first + c;
      const unsigned code =
          kPacked ? (codes[i >> 1] >> (4 * (i & 1))) & 0xFu : static_cast<unsigned>(codes[i]);
      if constexpr (kTensorScale)
        y[c] = static_cast<float>(static_cast<double>(values[code]) * s);
      else
        y[c] = values[code] * s1;
    }
  }
}

[[gnu::always_inline]] inline void decode_one_row(const std::uint8_t* codes, bool packed,
                                                  std::int64_t first, std::int64_t cols,
                                                  const float* values, const float* row_scales,
                                                  std::int64_t block_cols, double tensor_scale,
                                                  float* y) {
  const bool scaled = tensor_scale != 1.0;
  if (packed && scaled)
    decode_row<true, true>(codes, first, cols, values, row_scales, block_cols, tensor_scale, y);
  else if (packed)
    decode_row<true, false>(codes, first, cols, values, row_scales, block_cols, tensor_scale, y);
  else if (scaled)
    decode_row<false, true>(codes, first, cols, values, row_scales, block_cols, tensor_scale, y);
  else
    decode_row<false, false>(codes, first, cols, values, row_scales, block_cols, tensor_scale, y);
}

MIXTRAIN_ISA_VARIANTS(decode_one_row)

// --- Into 16 bits: a table of the 256 codes' values, the codes looked up 32 at a time --------

// Elements of a block at least this large build its table: 256 values formed and rounded, which
// fp8-block's 128x128 blocks (16,384 elements) amortise and MX's 1x32 ones would not.
constexpr std::int64_t kTableBlockMin = 4096;

// table [256] = what decode_row and commit_row make of each code in a block of scale `scale`:
// the same expression, then the same rounding into out's dtype (sdk::convert, to_inf_or_nan).
void block_table(const float* values, float scale, double tensor_scale, sdk::DType dtype,
                 std::uint16_t* table) {
  float v[256];
  const double s = static_cast<double>(scale) * tensor_scale;
  for (int code = 0; code < 256; ++code)
    v[code] = tensor_scale != 1.0 ? static_cast<float>(static_cast<double>(values[code]) * s)
                                  : values[code] * scale;
  sdk::convert(std::span<const float>(v, 256), std::span<std::uint16_t>(table, 256), dtype,
               sdk::EncodeOptions{});
}

// out [len] = table[codes[i]], 32 codes a step: the 256-entry table of 16-bit values is eight
// registers, and vpermi2w looks 32 codes up in a 64-entry quarter of it by their low 6 bits; bits
// 6 and 7 then pick the quarter (AVX-512 BW).
[[gnu::always_inline]] inline __attribute__((target("avx512f,avx512bw"))) void lookup_codes(
    const std::uint8_t* codes, std::int64_t len, const std::uint16_t* table, std::uint16_t* out) {
  __m512i t[8];
  for (int q = 0; q < 8; ++q) t[q] = _mm512_loadu_si512(table + 32 * q);
  const __m512i bit6 = _mm512_set1_epi16(0x40), bit7 = _mm512_set1_epi16(0x80);
  std::int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m512i idx =
        _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i)));
    const __m512i q0 = _mm512_permutex2var_epi16(t[0], idx, t[1]);  // codes 0-63
    const __m512i q1 = _mm512_permutex2var_epi16(t[2], idx, t[3]);  // 64-127
    const __m512i q2 = _mm512_permutex2var_epi16(t[4], idx, t[5]);  // 128-191
    const __m512i q3 = _mm512_permutex2var_epi16(t[6], idx, t[7]);  // 192-255
    const __mmask32 high6 = _mm512_test_epi16_mask(idx, bit6);
    const __m512i low = _mm512_mask_blend_epi16(high6, q0, q1);
    const __m512i high = _mm512_mask_blend_epi16(high6, q2, q3);
    _mm512_storeu_si512(out + i,
                        _mm512_mask_blend_epi16(_mm512_test_epi16_mask(idx, bit7), low, high));
  }
  for (; i < len; ++i) out[i] = table[codes[i]];
}

// What a decode's tables are formed from: the element values, the grid of block scales, the
// tensor scale and out's dtype.
struct TableSource {
  const float* values;
  const BlockScales& scales;
  std::int64_t block_rows;
  double tensor_scale;
  sdk::DType dtype;
};

// A table per block, for the block row a thread is in, built when it enters one.
class BlockRowTables {
 public:
  explicit BlockRowTables(const TableSource& s)
      : s_(s), tables_(static_cast<std::size_t>(s.scales.grid_cols * 256)) {}
  const std::uint16_t* table(std::int64_t r, std::int64_t b) {
    if (const std::int64_t block_row = r / s_.block_rows; block_row != built_) {
      for (std::int64_t k = 0; k < s_.scales.grid_cols; ++k)
        block_table(s_.values, s_.scales.at(block_row, k), s_.tensor_scale, s_.dtype,
                    tables_.data() + k * 256);
      built_ = block_row;
    }
    return tables_.data() + b * 256;
  }

 private:
  const TableSource& s_;
  std::vector<std::uint16_t> tables_;
  std::int64_t built_ = -1;
};

// A table per scale code, built the first time a block of that code asks: byte-coded scales
// (E8M0, E4M3) name at most 256 values however many blocks there are (MX's 1x32 ones), so a small
// block shares its table with every block of the same code, found by the code itself.
class CodeTables {
 public:
  // Not zeroed: a table is read only once built (256 of them are 128 KiB, per thread and call).
  explicit CodeTables(const TableSource& s)
      : s_(s), tables_(std::make_unique_for_overwrite<std::uint16_t[]>(256 * 256)) {}
  const std::uint16_t* table(std::int64_t r, std::int64_t b) {
    const std::uint8_t code = s_.scales.codes[(r / s_.block_rows) * s_.scales.grid_cols + b];
    std::uint16_t* t = tables_.get() + code * 256;
    if (!built_[code]) {
      block_table(s_.values, (*s_.scales.code_values)[code], s_.tensor_scale, s_.dtype, t);
      built_[code] = true;
    }
    return t;
  }

 private:
  const TableSource& s_;
  std::unique_ptr<std::uint16_t[]> tables_;
  std::array<bool, 256> built_{};
};

// y [cols] = row r's codes, each run of block_cols looked up in the table `tables` gives for
// (r, block column); one function a row, so that a block's lookups are inlined into the loop.
template <class Tables>
__attribute__((target("avx512f,avx512bw"))) void lookup_row(const std::uint8_t* codes,
                                                            std::int64_t r, std::int64_t cols,
                                                            std::int64_t block_cols, Tables& tables,
                                                            std::uint16_t* y) {
  for (std::int64_t b = 0, c0 = 0; c0 < cols; ++b, c0 += block_cols)
    lookup_codes(codes + c0, std::min(block_cols, cols - c0), tables.table(r, b), y + c0);
}

// out [rows, cols] (16-bit) from 1-byte codes, each row's run of block_cols codes looked up in
// the table its Tables (one per thread) gives for (row, block column).
template <class Tables>
void decode_by_tables(const std::uint8_t* codes, const TableSource& source, std::int64_t block_cols,
                      const sdk::TensorView& out) {
  const std::int64_t rows = out.shape[0], cols = out.shape[1];
  auto* y = static_cast<std::uint16_t*>(out.data);
#pragma omp parallel if (parallel_worth(rows * cols))
  {
    Tables tables(source);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r)
      lookup_row(codes + r * cols, r, cols, block_cols, tables, y + r * cols);
  }
}

}  // namespace

void decode_block_scaled(const std::uint8_t* codes, bool packed,
                         const std::array<float, 256>& values, const BlockScales& scales,
                         std::int64_t block_rows, std::int64_t block_cols, float tensor_scale,
                         const sdk::TensorView& out) {
  const std::int64_t rows = out.shape[0], cols = out.shape[1];
  const double ts = tensor_scale;
  if (!packed && !is_fp32_storage(out.dtype) && best_isa() == Isa::v4) {
    const TableSource source{values.data(), scales, block_rows, ts, out.dtype};
    if (block_rows * block_cols >= kTableBlockMin)
      return decode_by_tables<BlockRowTables>(codes, source, block_cols, out);
    // Blocks of byte-coded scales whose rows hold whole vectors of codes (MX along the columns).
    if (scales.coded() && block_cols >= 32)
      return decode_by_tables<CodeTables>(codes, source, block_cols, out);
  }
  const std::int64_t grid_cols = scales.grid_cols;
#pragma omp parallel if (parallel_worth(rows * cols))
  {
    std::vector<float> buf;  // a 16-bit row in fp32, one per thread for all its rows
    // A block row's scales as fp32 when they come as codes, decoded when a thread enters it.
    std::vector<float> coded_row(scales.coded() ? static_cast<std::size_t>(grid_cols) : 0);
    std::int64_t coded_block_row = -1;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t block_row = r / block_rows;
      if (scales.coded() && block_row != coded_block_row) {
        for (std::int64_t k = 0; k < grid_cols; ++k)
          coded_row[static_cast<std::size_t>(k)] = scales.at(block_row, k);
        coded_block_row = block_row;
      }
      const float* row_scales =
          scales.coded() ? coded_row.data() : scales.values + block_row * grid_cols;
      float* y = row_target(out, r, cols, buf);
      decode_one_row_best(codes, packed, r * cols, cols, values.data(), row_scales, block_cols, ts,
                          y);
      commit_row(out, r, cols, y);
    }
  }
}

}  // namespace mixtrain::backend_cpu
