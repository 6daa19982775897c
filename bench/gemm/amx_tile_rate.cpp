// A standalone measurement aid (not in the CMake build): how fast this CPU's AMX tile unit runs
// bf16 products, from no memory at all up to whole GEMMs, on one thread or two. It answers
// whether a GEMM of our own could beat oneDNN's AMX matmul here. bench/RESULTS.md, session 72,
// has the figures (an AMX Xeon VM: no, both reach about 0.9 TFLOP/s a core once the operands come
// from L2, where the unit sustains about 2.2 with them in L1).
//
//   g++ -O2 -std=c++20 -fopenmp -Iplugins/backend_cpu bench/gemm/amx_tile_rate.cpp
//     plugins/backend_cpu/cpu_amx_tile_product.cpp plugins/backend_cpu/cpu_features.cpp
//     -o /tmp/amx_tile_rate                                          (one line)
//   /tmp/amx_tile_rate
//
// Cases, each the best of 5 rounds:
// - chains: TDPBF16PS into 4 independent accumulators, operands never reloaded (the unit's rate);
// - l1: the 2 x 2 blocking of cpu_amx_tile_product.cpp (2 A and 2 B tiles loaded per 4 products),
//   its operands 16 KiB of A and 32 KiB of B that stay in L1;
// - gemm: amx_product (the CPU backend's tile loop, B packed once) on GPT-2 small's shapes,
//   C [m, n] fp32 = A [m, k] · B, the columns split between the threads in 256-column calls.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cpu_amx_tile_product.h"

namespace {

using mixtrain::backend_cpu::AmxPackedB;
using mixtrain::backend_cpu::AmxTileScratch;
using mixtrain::backend_cpu::Bf16Bits;

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

#define AMX __attribute__((target("amx-tile,amx-bf16")))

AMX void configure() {
  static TileConfig cfg = [] {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.rows[t] = 16;
      c.colsb[t] = 64;
    }
    return c;
  }();
  _tile_loadconfig(&cfg);
}

AMX void release() {
  _tile_release();
}

// `steps` rounds of 4 products; with `load`, each round first loads 2 A and 2 B tiles, walking
// k over 8 steps of A [32, 256] and B's 8 blocks of [16 pairs, 32 columns].
AMX void products(long steps, bool load, const std::uint16_t* a, const std::uint16_t* b) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < steps; ++i) {
    if (load) {
      const long kk = (i & 7) * 32;
      _tile_loadd(4, a + kk, 512);
      _tile_loadd(5, a + 16 * 256 + kk, 512);
      _tile_loadd(6, b + (i & 7) * 1024, 128);
      _tile_loadd(7, b + (i & 7) * 1024 + 32, 128);
    }
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

template <class F>
double best_seconds(F&& run) {
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void tile_case(const char* name, bool load, int threads) {
  constexpr long kSteps = 1'000'000;
  alignas(64) static std::uint16_t a[32 * 256], b[8 * 16 * 64];
  std::fill(std::begin(a), std::end(a), std::uint16_t{0x3f80});  // 1.0
  std::fill(std::begin(b), std::end(b), std::uint16_t{0x3f80});
  const double s = best_seconds([&] {
#pragma omp parallel num_threads(threads)
    {
      configure();
      products(kSteps, load, a, b);
      release();
    }
  });
  const double flops = 4.0 * kSteps * 16 * 16 * 32 * 2 * threads;
  std::printf("%-8s threads %d: %5.2f ns a product a thread, %5.2f TFLOP/s\n", name, threads,
              s / (4.0 * kSteps) * 1e9, flops / s / 1e12);
}

void gemm_case(const char* name, long m, long k, long n, int threads) {
  std::vector<std::uint16_t> a(static_cast<std::size_t>(m * k), 0x3f80);
  std::vector<std::uint16_t> w(static_cast<std::size_t>(n * k), 0x3c00);  // B stored [n, k]
  std::vector<float> c(static_cast<std::size_t>(m * n));
  const long per = (n / threads + 31) / 32 * 32;
  std::vector<AmxPackedB> packed(static_cast<std::size_t>(threads));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const long j0 = t * per, j1 = std::min(n, j0 + per);
    packed[static_cast<std::size_t>(t)].pack(
        k, j1 - j0, reinterpret_cast<const Bf16Bits*>(w.data() + j0 * k), true);
  }
  const double s = best_seconds([&] {
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      AmxTileScratch scratch;
      const long j0 = t * per, j1 = std::min(n, j0 + per);
      for (long j = j0; j < j1; j += 256)
        mixtrain::backend_cpu::amx_product(m, k, reinterpret_cast<const Bf16Bits*>(a.data()),
                                           packed[static_cast<std::size_t>(t)], 0, j - j0,
                                           std::min(256L, j1 - j), c.data() + m * j, scratch);
    }
  });
  std::printf("%-8s threads %d: [%ld, %ld] x [%ld, %ld] %7.2f ms, %5.2f TFLOP/s\n", name, threads,
              m, k, k, n, s * 1e3, 2.0 * m * k * n / s / 1e12);
}

}  // namespace

int main() {
  if (!mixtrain::backend_cpu::amx_tiles_usable()) {
    std::puts("this CPU or kernel gives no AMX tiles to this process");
    return 1;
  }
  for (int threads : {1, 2}) {
    tile_case("chains", false, threads);
    tile_case("l1", true, threads);
  }
  for (int threads : {1, 2}) {
    gemm_case("qkv", 1024, 768, 2304, threads);
    gemm_case("c_fc", 1024, 768, 3072, threads);
    gemm_case("c_proj", 1024, 3072, 768, threads);
    gemm_case("lm_head", 512, 768, 50304, threads);
  }
}
