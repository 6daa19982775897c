// The block-scaled weight decode (contract in cpu_block_scaled_decode.h).
#include "cpu_block_scaled_decode.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
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

// The 256 codes' 16-bit values in registers, and a lookup of 32 codes in them: vpermi2w looks
// the codes up in a 64-entry quarter by their low 6 bits, and bit 6 picks between two quarters.
// Where the upper half of the codes is the lower half negated (an FP8 format's sign bit, and so
// every table formed from its values: the products and the rounding are sign-symmetric), bit 7
// sets the sign of the lower half's value: two quarters in four registers, half the permutes
// (vpermi2w is the loop's costliest instruction). Otherwise bit 7 picks between the halves
// (AVX-512 BW).
// A table of the 256 codes' 16-bit values, and whether its upper half is its lower one negated.
struct CodeTable {
  const std::uint16_t* values;
  bool signed_half;
};

template <bool kSignedHalf>
struct CodeRegisters {
  __m512i quarter[kSignedHalf ? 4 : 8];
};

// Whether table [256]'s codes 128-255 are codes 0-127 with the sign bit set.
bool sign_symmetric(const std::uint16_t* table) {
  for (int code = 0; code < 128; ++code)
    if (table[code + 128] != (table[code] | 0x8000u)) return false;
  return true;
}

template <bool kSignedHalf>
[[gnu::always_inline]] inline __attribute__((target("avx512f,avx512bw"))) CodeRegisters<kSignedHalf>
code_registers(const std::uint16_t* table) {
  CodeRegisters<kSignedHalf> t;
  for (int q = 0; q < (kSignedHalf ? 4 : 8); ++q) t.quarter[q] = _mm512_loadu_si512(table + 32 * q);
  return t;
}

// idx: 32 codes widened to 16 bits.
template <bool kSignedHalf>
[[gnu::always_inline]] inline __attribute__((target("avx512f,avx512bw"))) __m512i lookup32(
    const CodeRegisters<kSignedHalf>& t, __m512i idx) {
  const __mmask32 bit6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x40));
  const __mmask32 bit7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x80));
  const __m512i q0 = _mm512_permutex2var_epi16(t.quarter[0], idx, t.quarter[1]);  // codes 0-63
  const __m512i q1 = _mm512_permutex2var_epi16(t.quarter[2], idx, t.quarter[3]);  // 64-127
  const __m512i low = _mm512_mask_blend_epi16(bit6, q0, q1);
  if constexpr (kSignedHalf) {
    return _mm512_mask_blend_epi16(bit7, low, _mm512_or_si512(low, _mm512_set1_epi16(-0x8000)));
  } else {
    const __m512i q2 = _mm512_permutex2var_epi16(t.quarter[4], idx, t.quarter[5]);  // 128-191
    const __m512i q3 = _mm512_permutex2var_epi16(t.quarter[6], idx, t.quarter[7]);  // 192-255
    const __m512i high = _mm512_mask_blend_epi16(bit6, q2, q3);
    return _mm512_mask_blend_epi16(bit7, low, high);
  }
}

[[gnu::always_inline]] inline __attribute__((target("avx512f,avx512bw"))) __m512i load32_codes(
    const std::uint8_t* codes) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
}

// out [len] = table[codes[i]], 32 codes a step.
template <bool kSignedHalf>
[[gnu::always_inline]] inline __attribute__((target("avx512f,avx512bw"))) void lookup_run(
    const std::uint8_t* codes, std::int64_t len, const std::uint16_t* table, std::uint16_t* out) {
  const auto t = code_registers<kSignedHalf>(table);
  std::int64_t i = 0;
  for (; i + 32 <= len; i += 32) _mm512_storeu_si512(out + i, lookup32(t, load32_codes(codes + i)));
  for (; i < len; ++i) out[i] = table[codes[i]];
}

[[gnu::always_inline]] inline __attribute__((target("avx512f,avx512bw"))) void lookup_codes(
    const std::uint8_t* codes, std::int64_t len, CodeTable table, std::uint16_t* out) {
  if (table.signed_half)
    lookup_run<true>(codes, len, table.values, out);
  else
    lookup_run<false>(codes, len, table.values, out);
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
      : s_(s),
        tables_(static_cast<std::size_t>(s.scales.grid_cols * 256)),
        signed_half_(static_cast<std::size_t>(s.scales.grid_cols)) {}
  CodeTable table(std::int64_t r, std::int64_t b) {
    if (const std::int64_t block_row = r / s_.block_rows; block_row != built_) {
      for (std::int64_t k = 0; k < s_.scales.grid_cols; ++k) {
        std::uint16_t* t = tables_.data() + k * 256;
        block_table(s_.values, s_.scales.at(block_row, k), s_.tensor_scale, s_.dtype, t);
        signed_half_[static_cast<std::size_t>(k)] = sign_symmetric(t);
      }
      built_ = block_row;
    }
    return {tables_.data() + b * 256, signed_half_[static_cast<std::size_t>(b)] != 0};
  }

 private:
  const TableSource& s_;
  std::vector<std::uint16_t> tables_;
  std::vector<std::uint8_t> signed_half_;  // per table
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
  CodeTable table(std::int64_t r, std::int64_t b) {
    const std::uint8_t code = s_.scales.codes[(r / s_.block_rows) * s_.scales.grid_cols + b];
    std::uint16_t* t = tables_.get() + code * 256;
    if (!built_[code]) {
      block_table(s_.values, (*s_.scales.code_values)[code], s_.tensor_scale, s_.dtype, t);
      signed_half_[code] = sign_symmetric(t);
      built_[code] = true;
    }
    return {t, signed_half_[code]};
  }

 private:
  const TableSource& s_;
  std::unique_ptr<std::uint16_t[]> tables_;
  std::array<bool, 256> built_{}, signed_half_{};
};

// Into bf16 from power-of-two scale codes (MX's E8M0) without a table per scale: a block's
// value · 2^e is the code's own bf16 value with e added to its exponent field, exactly, wherever
// the result is a normal number. The element values are few-bit floats that bf16 holds exactly
// (an E4M3 value has 4 significant bits), so value · 2^e in fp32 is exact while normal, and so is
// its rounding into bf16: the row path's bits. A scale code whose 2^e would take some element out
// of bf16's normal range (E8M0's extremes: subnormals, overflow), or that is not a finite power of
// two (E8M0's NaN), keeps its CodeTables table. Zeros, infinities and NaN elements keep their
// bits: only lanes with an exponent field strictly between 0 and all ones move.
class ExponentShifts {
 public:
  static constexpr std::int32_t kNoShift = std::numeric_limits<std::int32_t>::min();

  // Whether a decode can run here: bf16 out, no tensor scale, byte-coded scales and element
  // values that bf16 holds exactly.
  static bool applies(const TableSource& s) {
    if (s.dtype != sdk::DType::bf16 || s.tensor_scale != 1.0 || !s.scales.coded()) return false;
    std::array<std::uint16_t, 256> unit;
    block_table(s.values, 1.0f, 1.0, s.dtype, unit.data());
    for (int code = 0; code < 256; ++code)
      if (std::isfinite(s.values[code]) &&
          sdk::decode_bf16(unit[static_cast<std::size_t>(code)]) != s.values[code])
        return false;
    return true;
  }

  explicit ExponentShifts(const TableSource& s) : s_(s) {
    block_table(s.values, 1.0f, 1.0, s.dtype, unit_.data());
    unit_signed_half_ = sign_symmetric(unit_.data());
    // The elements' binades: the shift keeps them all normal, or the code keeps its table.
    int lo = std::numeric_limits<int>::max(), hi = std::numeric_limits<int>::min();
    for (int code = 0; code < 256; ++code)
      if (const float v = s.values[code]; std::isfinite(v) && v != 0.0f) {
        lo = std::min(lo, std::ilogb(v));
        hi = std::max(hi, std::ilogb(v));
      }
    for (int code = 0; code < 256; ++code) {
      const float scale = (*s.scales.code_values)[static_cast<std::size_t>(code)];
      int e = 0;
      const bool power_of_two =
          std::isfinite(scale) && scale > 0.0f && std::frexp(scale, &e) == 0.5f;
      const bool normal = lo > hi || (lo + (e - 1) >= -126 && hi + (e - 1) <= 127);
      shift_[static_cast<std::size_t>(code)] =
          power_of_two && normal ? (e - 1) * 128 : kNoShift;  // the exponent field's unit
    }
  }

  CodeTable unit() const { return {unit_.data(), unit_signed_half_}; }
  // Row r's scale codes, one per block column.
  const std::uint8_t* row_codes(std::int64_t r) const {
    return s_.scales.codes + (r / s_.block_rows) * s_.scales.grid_cols;
  }
  std::int32_t shift(std::uint8_t code) const { return shift_[code]; }
  // The table of a block whose code has no shift; its 128 KiB are taken only when one asks.
  CodeTable table(std::int64_t r, std::int64_t b) {
    if (!fallback_) fallback_.emplace(s_);
    return fallback_->table(r, b);
  }

  static std::uint16_t shifted(std::uint16_t v, std::int32_t shift) {
    const unsigned field = v & 0x7F80u;
    return field == 0 || field == 0x7F80u ? v : static_cast<std::uint16_t>(v + shift);
  }

 private:
  const TableSource& s_;
  std::optional<CodeTables> fallback_;
  std::array<std::uint16_t, 256> unit_{};
  bool unit_signed_half_ = false;
  std::array<std::int32_t, 256> shift_{};
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

// The same from one table of the codes' unit values, each block's lanes shifted by its exponent.
template <bool kSignedHalf>
[[gnu::always_inline]] inline __attribute__((target("avx512f,avx512bw"))) void shift_row(
    const std::uint8_t* codes, std::int64_t r, std::int64_t cols, std::int64_t block_cols,
    ExponentShifts& shifts, std::uint16_t* y) {
  const CodeTable unit_table = shifts.unit();
  const auto unit = code_registers<kSignedHalf>(unit_table.values);
  // The table's entries that move: an exponent field strictly between 0 and all ones.
  constexpr int kQuarters = kSignedHalf ? 4 : 8;
  const __m512i field = _mm512_set1_epi16(0x7F80);
  __mmask32 moves[kQuarters];
  for (int q = 0; q < kQuarters; ++q)
    moves[q] = _mm512_test_epi16_mask(unit.quarter[q], field) &
               _mm512_cmpneq_epi16_mask(_mm512_and_si512(unit.quarter[q], field), field);
  const std::uint8_t* scale_codes = shifts.row_codes(r);
  for (std::int64_t b = 0, c0 = 0; c0 < cols; ++b, c0 += block_cols) {
    const std::int64_t len = std::min(block_cols, cols - c0);
    const std::int32_t shift = shifts.shift(scale_codes[b]);
    if (shift == ExponentShifts::kNoShift) {
      lookup_codes(codes + c0, len, shifts.table(r, b), y + c0);
      continue;
    }
    // The block's table: the unit table with its exponents shifted, in registers.
    const __m512i add = _mm512_set1_epi16(static_cast<short>(shift));
    CodeRegisters<kSignedHalf> scaled;
    for (int q = 0; q < kQuarters; ++q)
      scaled.quarter[q] = _mm512_mask_add_epi16(unit.quarter[q], moves[q], unit.quarter[q], add);
    std::int64_t i = 0;
    for (; i + 32 <= len; i += 32)
      _mm512_storeu_si512(y + c0 + i, lookup32(scaled, load32_codes(codes + c0 + i)));
    for (; i < len; ++i)
      y[c0 + i] = ExponentShifts::shifted(unit_table.values[codes[c0 + i]], shift);
  }
}

__attribute__((target("avx512f,avx512bw"))) void lookup_row(const std::uint8_t* codes,
                                                            std::int64_t r, std::int64_t cols,
                                                            std::int64_t block_cols,
                                                            ExponentShifts& shifts,
                                                            std::uint16_t* y) {
  if (shifts.unit().signed_half)
    shift_row<true>(codes, r, cols, block_cols, shifts, y);
  else
    shift_row<false>(codes, r, cols, block_cols, shifts, y);
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
      return ExponentShifts::applies(source)
                 ? decode_by_tables<ExponentShifts>(codes, source, block_cols, out)
                 : decode_by_tables<CodeTables>(codes, source, block_cols, out);
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
