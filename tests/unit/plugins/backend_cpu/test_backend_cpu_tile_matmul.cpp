// Bf16TileMatmul (cpu_tile_matmul.h), flash attention's bf16 tile products: every transpose pair
// at the tile sizes flash attention uses and odd ones, against a double sum of the same bf16
// values; the same bits from several threads at once; sizes out of range refused.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend_test_util.h"
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

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
