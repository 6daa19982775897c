// Bf16TileMatmul (cpu_tile_matmul.h), flash attention's bf16 tile products: every transpose pair
// at the tile sizes flash attention uses and odd ones, against a double sum of the same bf16
// values; the same bits from several threads at once; sizes out of range refused. And AMX's own
// products (cpu_amx_tile_product.h) from a packed B: oneDNN's bits for every slice a flash
// attention tile takes, aligned or not.
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend_test_util.h"
#include "cpu_amx_tile_product.h"
#include "cpu_bf16_bits.h"
#include "cpu_tile_matmul.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

// Random bf16 values in [-2, 2] (normal numbers: AMX treats subnormal inputs as zero).
std::vector<Bf16Bits> random_bf16(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<Bf16Bits> v(n);
  for (auto& x : v) x = bf16_from_float(u(rng));
  return v;
}

// C [m, n] = op(A) · op(B) in double, A stored [m, k] (or [k, m] transposed), B [k, n] (or
// [n, k]); also Σ |products| per element, for the FP32 sum's bound.
void reference(std::int64_t m, std::int64_t n, std::int64_t k, const std::vector<Bf16Bits>& a,
               bool at, const std::vector<Bf16Bits>& b, bool bt, std::vector<double>& c,
               std::vector<double>& mag) {
  c.assign(static_cast<std::size_t>(m * n), 0.0);
  mag.assign(c.size(), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = float_from_bf16(a[static_cast<std::size_t>(at ? p * m + i : i * k + p)]);
        const double y = float_from_bf16(b[static_cast<std::size_t>(bt ? j * k + p : p * n + j)]);
        c[static_cast<std::size_t>(i * n + j)] += x * y;
        mag[static_cast<std::size_t>(i * n + j)] += std::abs(x * y);
      }
}

TEST(BackendCpuTileMatmul, EveryTransposeIsTheExactProductsSummedInFp32) {
  if (!Bf16TileMatmul::available())
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (flash attention runs FP32 products)";
  struct Size {
    std::int64_t m, n, k;
  };
  for (const Size sz : {Size{64, 64, 64}, Size{17, 64, 64}, Size{64, 33, 64}, Size{5, 7, 3}})
    for (const bool at : {false, true})
      for (const bool bt : {false, true}) {
        const auto a = random_bf16(static_cast<std::size_t>(sz.m * sz.k), 1);
        const auto b = random_bf16(static_cast<std::size_t>(sz.k * sz.n), 2);
        std::vector<float> c(static_cast<std::size_t>(sz.m * sz.n), -1.0f);
        Bf16TileScratch scratch;
        Bf16TileMatmul::run(sz.m, sz.n, sz.k, a.data(), at, b.data(), bt, c.data(), scratch);
        std::vector<double> want, mag;
        reference(sz.m, sz.n, sz.k, a, at, b, bt, want, mag);
        // Exact products, k FP32 additions: within γ(k)·Σ|products| of the exact sum.
        const double gamma = static_cast<double>(sz.k) * 0x1p-24 / (1 - sz.k * 0x1p-24);
        for (std::size_t i = 0; i < c.size(); ++i)
          ASSERT_LE(std::abs(c[i] - want[i]), gamma * mag[i] + 1e-30)
              << sz.m << "x" << sz.n << "x" << sz.k << " A^T " << at << " B^T " << bt << " at "
              << i;
        EXPECT_FALSE(Bf16TileMatmul::implementation(sz.m, sz.n, sz.k, at, bt).empty());
      }
}

TEST(BackendCpuTileMatmul, ThreadsRunningAtOnceGetTheBitsOfOne) {
  if (!Bf16TileMatmul::available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  const std::int64_t m = 64, n = 64, k = 64, calls = 16;
  std::vector<std::vector<Bf16Bits>> as, bs;
  for (std::int64_t i = 0; i < calls; ++i) {
    as.push_back(random_bf16(static_cast<std::size_t>(m * k), 10 + static_cast<unsigned>(i)));
    bs.push_back(random_bf16(static_cast<std::size_t>(k * n), 40 + static_cast<unsigned>(i)));
  }
  std::vector<std::vector<float>> alone(calls), together(calls);
  Bf16TileScratch one;
  for (std::int64_t i = 0; i < calls; ++i) {
    alone[i].resize(static_cast<std::size_t>(m * n));
    Bf16TileMatmul::run(m, n, k, as[i].data(), i % 2 == 1, bs[i].data(), true, alone[i].data(),
                        one);
  }
#pragma omp parallel num_threads(2)
  {
    Bf16TileScratch mine;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < calls; ++i) {
      together[i].resize(static_cast<std::size_t>(m * n));
      Bf16TileMatmul::run(m, n, k, as[i].data(), i % 2 == 1, bs[i].data(), true, together[i].data(),
                          mine);
    }
  }
  for (std::int64_t i = 0; i < calls; ++i) EXPECT_EQ(together[i], alone[i]) << "call " << i;
}

TEST(BackendCpuTileMatmul, SizesOutOfRangeAreRefused) {
  std::vector<Bf16Bits> a(64, 0), b(64, 0);
  std::vector<float> c(64);
  Bf16TileScratch scratch;
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{1} << 20})
    EXPECT_THROW(
        Bf16TileMatmul::run(bad, 8, 8, a.data(), false, b.data(), false, c.data(), scratch),
        sdk::BackendError)
        << bad;
}

// B packed once, then products of its slices (rows k0.., columns j0..) by dense A tiles: the bits
// of Bf16TileMatmul on the same slice, which oneDNN's AMX matmul computes with the same
// instruction. The slices end B's rows or are 32-aligned, as amx_product asks.
TEST(BackendCpuTileMatmul, AmxProductsOfAPackedBGiveOneDnnsBits) {
  if (!amx_tiles_usable() || !Bf16TileMatmul::available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU (the tile products stay oneDNN's)";
  struct Case {
    std::int64_t m, k, n;             // the product [m, k] · [k, n]
    std::int64_t rows, cols, k0, j0;  // B's full shape and the slice's first row and column
    bool transposed;
  };
  // Flash attention's: qkᵀ against key tiles of a head's 1024 keys, p·v against a tile of values;
  // then the edges: a last key tile of 100, a head dimension of 80, odd and tiny sizes.
  const Case cases[] = {
      {128, 64, 128, 64, 1024, 0, 256, true}, {128, 128, 64, 1024, 64, 384, 0, false},
      {128, 64, 100, 64, 356, 0, 256, true},  {100, 100, 64, 356, 64, 256, 0, false},
      {128, 80, 128, 80, 512, 0, 128, true},  {33, 45, 17, 45, 17, 0, 0, true},
      {5, 3, 7, 3, 7, 0, 0, false},           {48, 64, 96, 192, 160, 128, 32, false}};
  for (const Case& t : cases) {
    const auto b = random_bf16(static_cast<std::size_t>(t.rows * t.cols), 7);
    const auto a = random_bf16(static_cast<std::size_t>(t.m * t.k), 8);
    AmxPackedB packed;
    packed.pack(t.rows, t.cols, b.data(), t.transposed);
    std::vector<float> got(static_cast<std::size_t>(t.m * t.n), -1.0f);
    AmxTileScratch scratch;
    amx_product(t.m, t.k, a.data(), packed, t.k0, t.j0, t.n, got.data(), scratch);
    // The same slice, dense, through oneDNN: B's rows k0.. and columns j0.. (stored transposed:
    // its rows j0.. and columns k0..).
    std::vector<Bf16Bits> slice(static_cast<std::size_t>(t.k * t.n));
    for (std::int64_t p = 0; p < t.k; ++p)
      for (std::int64_t j = 0; j < t.n; ++j)
        slice[static_cast<std::size_t>(p * t.n + j)] =
            t.transposed ? b[static_cast<std::size_t>((t.j0 + j) * t.rows + t.k0 + p)]
                         : b[static_cast<std::size_t>((t.k0 + p) * t.cols + t.j0 + j)];
    std::vector<float> want(got.size(), -2.0f);
    Bf16TileScratch onednn;
    Bf16TileMatmul::run(t.m, t.n, t.k, a.data(), false, slice.data(), false, want.data(), onednn);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
          << t.m << "x" << t.k << "x" << t.n << " at (" << t.k0 << ", " << t.j0 << "), element "
          << i << ": " << got[i] << " against " << want[i];
    // AmxStore::add: an accumulator plus the product, as adding the product after it would.
    std::vector<float> acc(got.size()), sums(got.size());
    const auto start = random_bf16(acc.size(), 9);
    for (std::size_t i = 0; i < acc.size(); ++i) {
      acc[i] = float_from_bf16(start[i]) * 3.0f;
      sums[i] = acc[i] + got[i];
    }
    amx_product(t.m, t.k, a.data(), packed, t.k0, t.j0, t.n, acc.data(), scratch, AmxStore::add);
    for (std::size_t i = 0; i < acc.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(acc[i]), std::bit_cast<std::uint32_t>(sums[i]))
          << "added: " << t.m << "x" << t.k << "x" << t.n << ", element " << i;
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
