// Bf16TileMatmul: small bf16 products on the calling thread, for kernels that tile their own work
// across an OpenMP team (flash attention's tiles of 128 tokens).
//
// Contract
// - run(): C [m, n] fp32, dense row-major (ld n), = A · B, where A is [m, k] bf16, dense,
//   row-major (`a_transposed`: its transpose, stored [k, m] row-major), and B is [k, n] bf16,
//   dense, row-major (`b_transposed`: its transpose, stored [n, k] row-major). C is overwritten.
//   The products are exact and the sums FP32, as oneDNN's bf16 matmul computes them: on AMX-BF16
//   its tile instructions, which treat subnormal inputs and results as zero.
// - One oneDNN matmul primitive per (m, n, k, transposes), created on first use and kept for the
//   process: oneDNN 2.6's brgemm matmul takes only dense operands, hence the dense tiles. It is
//   planned for one thread (cpu_single_thread.h) wherever it is first asked for, so a call never
//   starts a team and sums in one order: call it from inside the caller's team, each thread with
//   its own Bf16TileScratch.
// - Thread-safe: the cache is guarded; a primitive runs concurrently on many threads, each with
//   its own stream and scratchpad (Bf16TileScratch).
// - Errors: a dnnl::error (or one with m, n or k below 1) becomes sdk::BackendError; on a CPU
//   where available() is false every run() throws it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cpu_bf16_bits.h"

namespace mixtrain::backend_cpu {

// One thread's stream and oneDNN scratchpad for Bf16TileMatmul::run.
class Bf16TileScratch {
 public:
  Bf16TileScratch();
  ~Bf16TileScratch();
  Bf16TileScratch(const Bf16TileScratch&) = delete;
  Bf16TileScratch& operator=(const Bf16TileScratch&) = delete;

 private:
  friend class Bf16TileMatmul;
  struct State;
  std::unique_ptr<State> state_;
};

class Bf16TileMatmul {
 public:
  static void run(std::int64_t m, std::int64_t n, std::int64_t k, const Bf16Bits* a,
                  bool a_transposed, const Bf16Bits* b, bool b_transposed, float* c,
                  Bf16TileScratch& scratch);
  // Whether oneDNN offers a bf16 matmul on this CPU at all (oneDNN 2.6 has none on a CPU without
  // AVX-512, and refuses to create one there); probed once, with a 64 x 64 x 64 product.
  static bool available();
  // The oneDNN implementation a product of this shape runs ("brg:avx512_core_amx_bf16" on AMX),
  // for logs and tests.
  static std::string implementation(std::int64_t m, std::int64_t n, std::int64_t k,
                                    bool a_transposed, bool b_transposed);
};

}  // namespace mixtrain::backend_cpu
