// AMX-BF16 tile products on the calling thread, for flash attention's bf16 tiles where the CPU has
// the tile instructions: the right-hand operand packed once (a head's keys and values) and
// multiplied by many left-hand tiles (its query blocks).
//
// Contract
// - Nothing here may be called unless cpu_features.h's amx_tiles_usable() is true: the products
//   and the packing run AMX and AVX-512 BW instructions.
// - AmxPackedB::pack(k, n, b, transposed): B [k, n] bf16, dense row-major (`transposed`: stored
//   [n, k]), copied into the pairs of k the tile instruction reads, in blocks of 32 columns, each
//   [kp / 2][32][2], zero-padded to kp = k rounded up to 32 plus 32 (so a product may start at any
//   even row of k below k) and to n rounded up to 32. The buffers are kept and grown.
// - amx_product(m, k, a, b, k0, j0, n, c, scratch, store): C [m, n] fp32, dense row-major (ld n),
//   overwritten (AmxStore::overwrite), or added to (AmxStore::add: C[i] + P[i], the bits of
//   adding the whole product after it, added a 32 x 32 block at a time while the block is in L1),
//   with P = A [m, k] (bf16, dense row-major) · B's rows k0 .. k0 + k and columns j0 .. j0 + n. k0
//   is even and j0 a multiple of 32; where k is not a multiple of 32, the slice ends B's rows (the
//   products read on to the next multiple of 32, and only the packing's zeros may be there: A's
//   padding times a value of B past the slice could be 0 · inf). A and C are read and written in
//   place where m is a multiple of 16, k of 32 and n of 16, else through the thread's zero-padded
//   scratch.
// - Numbers: what TDPBF16PS computes, as oneDNN's AMX matmul does (Bf16TileMatmul): exact products
//   summed in FP32, k in steps of 32 in order, subnormal bf16 inputs and FP32 results treated as
//   zero. test_backend_cpu_tile_matmul.cpp holds the products to Bf16TileMatmul's bits on aligned
//   and unaligned slices, and test_backend_cpu_attention.cpp flash attention's outputs and
//   gradients at a head dimension of 64 (at 16, oneDNN's q·kᵀ summed a few elements otherwise,
//   so flash attention takes these products at multiples of 32 only).
// - Why the blocks of 32 columns: with a head's 1024 keys in one row of pairs, a tile load's 16
//   rows were 4 KiB apart, all in one L1 set; blocked, they are 128 bytes apart. Flash attention's
//   tiles (bench_flash_attention, 12 heads of 1024 tokens, bf16, AMX Xeon) against oneDNN's:
//   forward 5.18-5.34 -> 4.56-4.80 ms, backward 9.96-10.03 -> 9.18-9.24 (bench/RESULTS.md,
//   session 70).
// - Thread-safe: each call configures and releases the calling thread's tiles.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu_bf16_bits.h"
#include "cpu_features.h"  // amx_tiles_usable

namespace mixtrain::backend_cpu {

// One thread's zero-padded copies of A and C.
struct AmxTileScratch {
  std::vector<std::uint16_t> a;
  std::vector<float> c;
};

enum class AmxStore { overwrite, add };

class AmxPackedB {
 public:
  void pack(std::int64_t k, std::int64_t n, const Bf16Bits* b, bool transposed);

 private:
  friend void amx_product(std::int64_t, std::int64_t, const Bf16Bits*, const AmxPackedB&,
                          std::int64_t, std::int64_t, std::int64_t, float*, AmxTileScratch&,
                          AmxStore);
  std::vector<std::uint16_t> pairs_;
  std::int64_t np_ = 0, pair_rows_ = 0;  // columns padded to 32, rows of pairs a block
};

void amx_product(std::int64_t m, std::int64_t k, const Bf16Bits* a, const AmxPackedB& b,
                 std::int64_t k0, std::int64_t j0, std::int64_t n, float* c,
                 AmxTileScratch& scratch, AmxStore store = AmxStore::overwrite);

}  // namespace mixtrain::backend_cpu
