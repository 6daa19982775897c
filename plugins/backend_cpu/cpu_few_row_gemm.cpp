#include "cpu_few_row_gemm.h"

#include <immintrin.h>

#include <algorithm>

#include "cpu_access.h"
#include "cpu_isa.h"

namespace mixtrain::backend_cpu {

namespace {

// The sum's lanes (the header's definition): product p of a row goes to lane (p mod 32) / 2 of
// the even sum when p is even, of the odd sum when p is odd; each lane adds its products in order.
// It is how one 512-bit load of 32 bf16 values splits into two fp32 vectors with a shift and a
// mask, no shuffle: the even elements are the low halves of its 32-bit words.
constexpr int kHalf = 16;
constexpr int kLaneChunk = 2 * kHalf;
// B's rows summed together: interleaved sums keep the adds independent (one chain of dependent
// adds would wait on the add's latency rather than on memory); 2 * M * 4 sums and B's 8 vectors
// fit the 32 vector registers.
constexpr int kRowsTogether = 4;
// B's rows a parallel task takes: small enough to share a 768-row product between two cores.
constexpr std::int64_t kTaskRows = 64;

// The 16 lanes of even + odd, added pairwise in a fixed tree.
[[gnu::always_inline]] inline float lanes_total(const float* even, const float* odd) {
  alignas(64) float acc[kHalf];
  for (int l = 0; l < kHalf; ++l) acc[l] = even[l] + odd[l];
  for (int w = kHalf / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// One sum's last steps, both kernels': the products [from, k) of the rows x and w (the tail after
// the whole chunks) join their lanes in order, then the lanes add up (lanes_total).
[[gnu::always_inline]] inline float finish_sum(float* even, float* odd, const float* x,
                                               const Bf16Bits* w, std::int64_t from,
                                               std::int64_t k) {
  for (std::int64_t p = from; p < k; ++p) {
    float& lane = (p % 2 == 0 ? even : odd)[(p % kLaneChunk) / 2];
    lane = lane + x[p] * float_from_bf16(w[p]);
  }
  return lanes_total(even, odd);
}

[[gnu::always_inline]] inline void store(void* c, bool c_bf16, std::int64_t at, float v) {
  if (c_bf16)
    static_cast<Bf16Bits*>(c)[at] = bf16_from_float(v);
  else
    static_cast<float*>(c)[at] = v;
}

// --- Any ISA: the definition written out, compiled per ISA variant (cpu_isa.h) -----------------

template <int M, int R>
[[gnu::always_inline]] inline void rows_generic(const float* x, const Bf16Bits* b,
                                                const float* bias, std::int64_t n, std::int64_t k,
                                                std::int64_t j, void* c, bool c_bf16) {
  alignas(64) float even[M][R][kHalf] = {}, odd[M][R][kHalf] = {};
  const std::int64_t whole = k / kLaneChunk * kLaneChunk;
  for (std::int64_t i = 0; i < whole; i += kLaneChunk)
    for (int r = 0; r < R; ++r) {
      const Bf16Bits* w = b + (j + r) * k + i;
      for (int mm = 0; mm < M; ++mm) {
        const float* xr = x + mm * k + i;
        for (int l = 0; l < kHalf; ++l) {
          even[mm][r][l] = even[mm][r][l] + xr[2 * l] * float_from_bf16(w[2 * l]);
          odd[mm][r][l] = odd[mm][r][l] + xr[2 * l + 1] * float_from_bf16(w[2 * l + 1]);
        }
      }
    }
  for (int mm = 0; mm < M; ++mm)
    for (int r = 0; r < R; ++r) {
      const float sum = finish_sum(even[mm][r], odd[mm][r], x + mm * k, b + (j + r) * k, whole, k);
      store(c, c_bf16, mm * n + j + r, bias != nullptr ? sum + bias[j + r] : sum);
    }
}

template <int M>
[[gnu::always_inline]] inline void columns_generic(const float* x, const Bf16Bits* b,
                                                   const float* bias, std::int64_t n,
                                                   std::int64_t k, std::int64_t j0, std::int64_t j1,
                                                   void* c, bool c_bf16) {
  std::int64_t j = j0;
  for (; j + kRowsTogether <= j1; j += kRowsTogether)
    rows_generic<M, kRowsTogether>(x, b, bias, n, k, j, c, c_bf16);
  for (; j < j1; ++j) rows_generic<M, 1>(x, b, bias, n, k, j, c, c_bf16);
}

[[gnu::always_inline]] inline void few_rows_generic(const float* x, const Bf16Bits* b,
                                                    const float* bias, std::int64_t m,
                                                    std::int64_t n, std::int64_t k, std::int64_t j0,
                                                    std::int64_t j1, void* c, bool c_bf16) {
  switch (m) {
    case 1:
      return columns_generic<1>(x, b, bias, n, k, j0, j1, c, c_bf16);
    default:
      return columns_generic<2>(x, b, bias, n, k, j0, j1, c, c_bf16);
  }
}

MIXTRAIN_ISA_VARIANTS(few_rows_generic)

// --- AVX-512: the same sums, a chunk of 32 products a load ------------------------------------
// x_split holds A's rows with each chunk's even elements first, then its odd ones
// ([M, chunks, 2, 16], whole chunks only); the tail of k runs as the definition does.

#define MIXTRAIN_FEW_ROWS_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
// GCC 12 takes the undefined pass-through operand inside its AVX-512 intrinsics for an
// uninitialised read (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// lanes_total's additions, in its order, in registers: lane l + lane l + 8, then + 4, + 2, + 1.
[[gnu::always_inline]] MIXTRAIN_FEW_ROWS_AVX512 inline float lanes_total_avx512(__m512 even,
                                                                                __m512 odd) {
  const __m512 v = _mm512_add_ps(even, odd);
  const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  const __m128 t1 = _mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1));
  return _mm_cvtss_f32(t1);
}

template <int M, int R>
[[gnu::always_inline]] MIXTRAIN_FEW_ROWS_AVX512 inline void rows_avx512(
    const float* x, const float* x_split, const Bf16Bits* b, const float* bias, std::int64_t n,
    std::int64_t k, std::int64_t j, void* c, bool c_bf16) {
  const std::int64_t chunks = k / kLaneChunk;
  __m512 even[M][R], odd[M][R];
  for (int mm = 0; mm < M; ++mm)
    for (int r = 0; r < R; ++r) even[mm][r] = odd[mm][r] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));

  for (std::int64_t q = 0; q < chunks; ++q) {
    __m512 we[R], wo[R];
    for (int r = 0; r < R; ++r) {
      const __m512i w = _mm512_loadu_si512(b + (j + r) * k + q * kLaneChunk);
      we[r] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      wo[r] = _mm512_castsi512_ps(_mm512_and_si512(w, high));
    }
    for (int mm = 0; mm < M; ++mm) {
      const float* xs = x_split + (mm * chunks + q) * kLaneChunk;
      const __m512 xe = _mm512_loadu_ps(xs), xo = _mm512_loadu_ps(xs + kHalf);
      for (int r = 0; r < R; ++r) {
        even[mm][r] = _mm512_add_ps(even[mm][r], _mm512_mul_ps(xe, we[r]));
        odd[mm][r] = _mm512_add_ps(odd[mm][r], _mm512_mul_ps(xo, wo[r]));
      }
    }
  }
  const bool tail = chunks * kLaneChunk < k;
  for (int mm = 0; mm < M; ++mm)
    for (int r = 0; r < R; ++r) {
      float sum;
      if (tail) {
        alignas(64) float e[kHalf], o[kHalf];
        _mm512_store_ps(e, even[mm][r]);
        _mm512_store_ps(o, odd[mm][r]);
        sum = finish_sum(e, o, x + mm * k, b + (j + r) * k, chunks * kLaneChunk, k);
      } else {
        sum = lanes_total_avx512(even[mm][r], odd[mm][r]);
      }
      store(c, c_bf16, mm * n + j + r, bias != nullptr ? sum + bias[j + r] : sum);
    }
}

template <int M>
MIXTRAIN_FEW_ROWS_AVX512 void columns_avx512(const float* x, const float* x_split,
                                             const Bf16Bits* b, const float* bias, std::int64_t n,
                                             std::int64_t k, std::int64_t j0, std::int64_t j1,
                                             void* c, bool c_bf16) {
  std::int64_t j = j0;
  for (; j + kRowsTogether <= j1; j += kRowsTogether)
    rows_avx512<M, kRowsTogether>(x, x_split, b, bias, n, k, j, c, c_bf16);
  for (; j < j1; ++j) rows_avx512<M, 1>(x, x_split, b, bias, n, k, j, c, c_bf16);
}

void few_rows_avx512(const float* x, const float* x_split, const Bf16Bits* b, const float* bias,
                     std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t j0,
                     std::int64_t j1, void* c, bool c_bf16) {
  switch (m) {
    case 1:
      return columns_avx512<1>(x, x_split, b, bias, n, k, j0, j1, c, c_bf16);
    default:
      return columns_avx512<2>(x, x_split, b, bias, n, k, j0, j1, c, c_bf16);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

void few_row_gemm_bf16(const Bf16Bits* a, const Bf16Bits* b, const float* bias, std::int64_t m,
                       std::int64_t n, std::int64_t k, void* c, bool c_bf16, float* a_fp32) {
  // A decoded as it is ([m, k], the generic kernel's operand and the tail's) and, for the AVX-512
  // kernel, split by chunk too.
  const bool avx512 = best_isa() == Isa::v4;
  float* x = a_fp32;
  float* x_split = a_fp32 + m * k;
  for (std::int64_t i = 0; i < m * k; ++i) x[i] = float_from_bf16(a[i]);
  const std::int64_t chunks = avx512 ? k / kLaneChunk : 0;
  for (std::int64_t mm = 0; mm < m; ++mm)
    for (std::int64_t q = 0; q < chunks; ++q)
      for (int l = 0; l < kHalf; ++l) {
        const float* xc = x + mm * k + q * kLaneChunk;
        x_split[(mm * chunks + q) * kLaneChunk + l] = xc[2 * l];
        x_split[(mm * chunks + q) * kLaneChunk + kHalf + l] = xc[2 * l + 1];
      }
  const std::int64_t tasks = (n + kTaskRows - 1) / kTaskRows;
#pragma omp parallel for schedule(static) if (parallel_worth(n * k))
  for (std::int64_t t = 0; t < tasks; ++t) {
    const std::int64_t j0 = t * kTaskRows, j1 = std::min(n, j0 + kTaskRows);
    if (avx512)
      few_rows_avx512(x, x_split, b, bias, m, n, k, j0, j1, c, c_bf16);
    else
      few_rows_generic_best(static_cast<const float*>(x), b, bias, m, n, k, j0, j1, c, c_bf16);
  }
}

}  // namespace mixtrain::backend_cpu
