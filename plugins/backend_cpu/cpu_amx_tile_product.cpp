// AMX-BF16 tile products (contract in the header). The functions that use the tile instructions
// and AVX-512 BW (every AMX CPU has it) say so in a target attribute, not the file in compile
// flags: the standard library's inline functions this file instantiates stay baseline code, which
// the linker may pick for every other file too. Nothing here runs unless amx_tiles_usable() said
// yes.
#include "cpu_amx_tile_product.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace mixtrain::backend_cpu {

namespace {

#define MIXTRAIN_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

// The 64-byte tile configuration (palette 1): 8 tiles of 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

constexpr std::int64_t kRows = 16;   // a tile's rows (C and A), and B's rows of k pairs
constexpr std::int64_t kDepth = 32;  // bf16 values of k in one A tile row
// B is packed in blocks of 32 columns, each block's pair rows 128 bytes apart: with a head's 1024
// keys in one row of pairs, a tile load's 16 rows were 4 KiB apart, one L1 set for all of them.
constexpr std::int64_t kBlockCols = 32;

std::int64_t round_up(std::int64_t v, std::int64_t to) {
  return (v + to - 1) / to * to;
}

// Every tile 16 rows of 64 bytes, in read-only memory: built on the stack, GCC 12 dropped the
// stores of rows and colsb before ldtilecfg in a target-attribute function (a fault at the first
// tile instruction).
constexpr TileConfig full_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kRows;
    cfg.colsb[t] = 64;
  }
  return cfg;
}
alignas(64) constexpr TileConfig kFullTiles = full_tiles();

MIXTRAIN_AMX void configure_tiles() {
  _tile_loadconfig(&kFullTiles);
}

MIXTRAIN_AMX void release_tiles() {
  _tile_release();
}

// c [rows, cols] (ld ldc) += t [rows, cols] (ld ldt), cols a multiple of 16: a product's tiles,
// just stored into L1, added into their accumulator (the same sums as adding the whole product
// afterwards, element by element).
MIXTRAIN_AMX void add_tile(std::int64_t rows, std::int64_t cols, const float* t, std::int64_t ldt,
                           float* c, std::int64_t ldc) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; j += 16)
      _mm512_storeu_ps(c + r * ldc + j, _mm512_add_ps(_mm512_loadu_ps(c + r * ldc + j),
                                                      _mm512_loadu_ps(t + r * ldt + j)));
}

// c [mp, np] (ld ldc floats) = a [mp, kp] (ld lda bf16) · b (blocks of kBlockCols columns,
// b_block bf16 apart, each its pair rows of kBlockCols pairs), mp and np multiples of 16, kp of
// 32, or c += that product with `add`: 32 x 32 blocks of C in tiles 0-3, A in 4-5, B in 6-7; a
// lone 16-row or 16-column edge one tile at a time.
MIXTRAIN_AMX void multiply(std::int64_t mp, std::int64_t np, std::int64_t kp,
                           const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b,
                           std::int64_t b_block, float* c, std::int64_t ldc, bool add) {
  const std::int64_t a_stride = 2 * lda, c_stride = 4 * ldc;
  // With `add`, a block's tiles go here first (4 KiB, in L1), then into c.
  alignas(64) float block[2 * kRows * 2 * kRows];
  constexpr std::int64_t kBlockLd = 2 * kRows, kBlockStride = 4 * kBlockLd;
  auto b_at = [&](std::int64_t kk, std::int64_t j) {
    return b + (j / kBlockCols) * b_block + (kk / 2) * 2 * kBlockCols + 2 * (j % kBlockCols);
  };
  constexpr std::int64_t b_stride = 4 * kBlockCols;
  for (std::int64_t i = 0; i < mp; i += 2 * kRows) {
    const bool two_rows = i + 2 * kRows <= mp;
    for (std::int64_t j = 0; j < np; j += 2 * kRows) {
      if (two_rows && j + 2 * kRows <= np) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (std::int64_t kk = 0; kk < kp; kk += kDepth) {
          _tile_loadd(4, a + i * lda + kk, a_stride);
          _tile_loadd(5, a + (i + kRows) * lda + kk, a_stride);
          _tile_loadd(6, b_at(kk, j), b_stride);
          _tile_loadd(7, b_at(kk, j + kRows), b_stride);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        if (add) {
          _tile_stored(0, block, kBlockStride);
          _tile_stored(1, block + kRows, kBlockStride);
          _tile_stored(2, block + kRows * kBlockLd, kBlockStride);
          _tile_stored(3, block + kRows * kBlockLd + kRows, kBlockStride);
          add_tile(2 * kRows, 2 * kRows, block, kBlockLd, c + i * ldc + j, ldc);
          continue;
        }
        _tile_stored(0, c + i * ldc + j, c_stride);
        _tile_stored(1, c + i * ldc + j + kRows, c_stride);
        _tile_stored(2, c + (i + kRows) * ldc + j, c_stride);
        _tile_stored(3, c + (i + kRows) * ldc + j + kRows, c_stride);
        continue;
      }
      for (std::int64_t ii = i; ii < std::min(mp, i + 2 * kRows); ii += kRows)
        for (std::int64_t jj = j; jj < std::min(np, j + 2 * kRows); jj += kRows) {
          _tile_zero(0);
          for (std::int64_t kk = 0; kk < kp; kk += kDepth) {
            _tile_loadd(4, a + ii * lda + kk, a_stride);
            _tile_loadd(6, b_at(kk, jj), b_stride);
            _tile_dpbf16ps(0, 4, 6);
          }
          if (add) {
            _tile_stored(0, block, 4 * kRows);
            add_tile(kRows, kRows, block, kRows, c + ii * ldc + jj, ldc);
          } else {
            _tile_stored(0, c + ii * ldc + jj, c_stride);
          }
        }
    }
  }
}

// B [k, n] (transposed: stored [n, k]) into `out`: blocks of kBlockCols columns, `block` values
// apart, each [pair_rows][kBlockCols][2]; what the values do not fill is zeroed (the rows of pairs
// past k, the columns past n, the second half of a last odd pair), nothing twice.
MIXTRAIN_AMX void pack_blocked(std::int64_t k, std::int64_t n, const std::uint16_t* src,
                               bool transposed, std::int64_t pair_rows, std::int64_t np,
                               std::uint16_t* out) {
  const std::int64_t block = pair_rows * 2 * kBlockCols, filled = (k + 1) / 2;
  auto at = [&](std::int64_t p, std::int64_t j) {
    return out + (j / kBlockCols) * block + p * 2 * kBlockCols + 2 * (j % kBlockCols);
  };
  for (std::int64_t jb = 0; jb < np; jb += kBlockCols)
    std::memset(at(filled, jb), 0, static_cast<std::size_t>((pair_rows - filled) * 4 * kBlockCols));
  if (n < np)  // the last block's columns past n, in the filled rows
    for (std::int64_t p = 0; p < filled; ++p)
      std::memset(at(p, n), 0, static_cast<std::size_t>(4 * (np - n)));
  if (transposed && k % 2 == 0) {
    // src [n, k] is [n][k/2] words of pairs of k: word (j, p) goes to pair row p, column j.
    const auto* words = reinterpret_cast<const std::uint32_t*>(src);
    const std::int64_t half = k / 2;
    const __m512i step =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(static_cast<int>(half)));
    std::int64_t j = 0;
    for (; j + 16 <= n; j += 16)
      for (std::int64_t p = 0; p < half; ++p)
        _mm512_storeu_si512(at(p, j), _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xFFFF,
                                                                  step, words + j * half + p, 4));
    for (; j < n; ++j)
      for (std::int64_t p = 0; p < half; ++p) std::memcpy(at(p, j), words + j * half + p, 4);
    return;
  }
  if (transposed) {
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t kk = 0; kk < k; ++kk) at(kk / 2, j)[kk % 2] = src[j * k + kk];
    if (k % 2 != 0)
      for (std::int64_t j = 0; j < n; ++j) at(k / 2, j)[1] = 0;
    return;
  }
  // Rows 2p and 2p + 1 interleaved, 32 columns (one block's row of pairs) at a time.
  alignas(64) static constexpr std::uint16_t lo_idx[32] = {
      0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t hi_idx[32] = {
      16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
      24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  for (std::int64_t p = 0; p < filled; ++p) {
    const std::uint16_t* r0 = src + 2 * p * n;
    const std::uint16_t* r1 = 2 * p + 1 < k ? r0 + n : nullptr;
    std::int64_t j = 0;
    for (; j + kBlockCols <= n; j += kBlockCols) {
      const __m512i a = _mm512_loadu_si512(r0 + j);
      const __m512i b = r1 != nullptr ? _mm512_loadu_si512(r1 + j) : _mm512_setzero_si512();
      std::uint16_t* to = at(p, j);
      _mm512_storeu_si512(to, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(to + 32, _mm512_permutex2var_epi16(a, hi, b));
    }
    for (; j < n; ++j) {
      at(p, j)[0] = r0[j];
      at(p, j)[1] = r1 != nullptr ? r1[j] : std::uint16_t{0};
    }
  }
}

#undef MIXTRAIN_AMX

}  // namespace

void AmxPackedB::pack(std::int64_t k, std::int64_t n, const Bf16Bits* b, bool transposed) {
  np_ = round_up(n, kBlockCols);
  pair_rows_ = (round_up(k, kDepth) + kDepth) / 2;
  const auto size = static_cast<std::size_t>(np_ / kBlockCols * pair_rows_ * 2 * kBlockCols);
  if (pairs_.size() < size) pairs_.resize(size);
  pack_blocked(k, n, reinterpret_cast<const std::uint16_t*>(b), transposed, pair_rows_, np_,
               pairs_.data());
}

void amx_product(std::int64_t m, std::int64_t k, const Bf16Bits* a, const AmxPackedB& b,
                 std::int64_t k0, std::int64_t j0, std::int64_t n, float* c,
                 AmxTileScratch& scratch, AmxStore store) {
  const bool add = store == AmxStore::add;
  const std::int64_t mp = round_up(m, kRows), np = round_up(n, kRows), kp = round_up(k, kDepth);
  const auto* as = reinterpret_cast<const std::uint16_t*>(a);
  const bool direct_a = mp == m && kp == k, direct_c = mp == m && np == n;
  if (!direct_a) {
    scratch.a.assign(static_cast<std::size_t>(mp * kp), std::uint16_t{0});
    for (std::int64_t i = 0; i < m; ++i)
      std::memcpy(scratch.a.data() + i * kp, as + i * k, static_cast<std::size_t>(2 * k));
  }
  if (!direct_c) scratch.c.resize(static_cast<std::size_t>(mp * np));
  float* out = direct_c ? c : scratch.c.data();
  configure_tiles();
  const std::int64_t block = b.pair_rows_ * 2 * kBlockCols;
  multiply(mp, np, kp, direct_a ? as : scratch.a.data(), direct_a ? k : kp,
           b.pairs_.data() + (j0 / kBlockCols) * block + (k0 / 2) * 2 * kBlockCols, block, out,
           direct_c ? n : np, add && direct_c);
  release_tiles();
  if (direct_c) return;
  for (std::int64_t i = 0; i < m; ++i) {
    const float* from = out + i * np;
    float* to = c + i * n;
    if (add)
      for (std::int64_t j = 0; j < n; ++j) to[j] += from[j];
    else
      std::memcpy(to, from, static_cast<std::size_t>(4 * n));
  }
}

}  // namespace mixtrain::backend_cpu
