// The layer norm's row kernels (cpu_layernorm_kernels.h). Why inline conversions and ISA
// variants: the facet's first path decoded each bf16 row through the SDK's bulk converter (an
// AVX-512 call per 128-element row) into baseline SSE code, and the fused add + layer norm ran at
// half the speed of a separate add and layer norm (bench/gpt/bench_add_layer_norm).
#include "cpu_layernorm_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "cpu_access.h"
#include "cpu_isa.h"
#include "cpu_lane_reductions.h"

namespace mixtrain::backend_cpu {

namespace {

// The lambdas the kernels call must be inlined into each ISA variant too (cpu_isa.h).
#define MIXTRAIN_INLINE __attribute__((always_inline))

// Σ f(j) over [0, n) in double, in the fixed order the header states: 32 lanes, whatever the
// vector width the compiler gives them (cpu_lane_reductions.h). 32 and not 8: eight lanes are one
// AVX-512 register, so every add waited on the one before it, and the two sums of a row took
// about a cycle an element (bench/RESULTS.md, session 66).
template <class F>
[[gnu::always_inline]] inline double ordered_sum(std::int64_t n, F&& f) {
  return lane_sum<double, 32>(n, f);
}

// Row `in` [n] normalised into `out` (may be `in`), its mean and rstd.
template <class T, class Y>
[[gnu::always_inline]] inline void normalize(const T* in, Y* out, std::int64_t n, float eps,
                                             const float* gamma, const float* beta, float* mean,
                                             float* rstd) {
  const double count = static_cast<double>(n);
  const float mu = static_cast<float>(
      ordered_sum(n, [&](std::int64_t j) MIXTRAIN_INLINE { return double{load_as_float(in, j)}; }) /
      count);
  // Two-pass variance: no cancellation for large means.
  const double sq = ordered_sum(n, [&](std::int64_t j) MIXTRAIN_INLINE {
    const float d = load_as_float(in, j) - mu;
    return static_cast<double>(d) * d;
  });
  const float rs = static_cast<float>(1.0 / std::sqrt(sq / count + static_cast<double>(eps)));
  *mean = mu;
  *rstd = rs;
  for (std::int64_t j = 0; j < n; ++j)
    store_rounded(out, j, (load_as_float(in, j) - mu) * rs * gamma[j] + beta[j]);
}

// Rows [r0, r1) of x [rows, n] normalised into y.
template <class T, class Y>
[[gnu::always_inline]] inline void range_layernorm(const T* x, Y* y, std::int64_t r0,
                                                   std::int64_t r1, std::int64_t n, float eps,
                                                   const float* gamma, const float* beta,
                                                   float* mean, float* rstd) {
  for (std::int64_t r = r0; r < r1; ++r)
    normalize(x + r * n, y + r * n, n, eps, gamma, beta, mean + r, rstd + r);
}

// Rows [r0, r1): sum = a + b rounded into T, then its layer norm as stored.
template <class T, class Y>
[[gnu::always_inline]] inline void range_add_layernorm(const T* a, const T* b, T* sum, Y* y,
                                                       std::int64_t r0, std::int64_t r1,
                                                       std::int64_t n, float eps,
                                                       const float* gamma, const float* beta,
                                                       float* mean, float* rstd) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t at = r * n;
    for (std::int64_t j = 0; j < n; ++j)
      store_rounded(sum + at, j, load_as_float(a + at, j) + load_as_float(b + at, j));
    normalize(sum + at, y + at, n, eps, gamma, beta, mean + r, rstd + r);
  }
}

// Rows [r0, r1) of the backward (the header's layernorm_backward_range).
template <class T, class D>
[[gnu::always_inline]] inline void range_layernorm_backward(
    const T* x, const T* dy, const float* gamma, const float* mean, const float* rstd, D* dx,
    bool add_into_dx, std::int64_t r0, std::int64_t r1, std::int64_t n, double* dgamma_part,
    double* dbeta_part) {
  const double count = static_cast<double>(n);
  for (std::int64_t r = r0; r < r1; ++r) {
    const T* xs = x + r * n;
    const T* gy = dy + r * n;
    const float mu = mean[r], rs = rstd[r];
    const double sum_g = ordered_sum(
        n, [&](std::int64_t j) MIXTRAIN_INLINE { return double{load_as_float(gy, j) * gamma[j]}; });
    const double sum_gx = ordered_sum(n, [&](std::int64_t j) MIXTRAIN_INLINE {
      const float xhat = (load_as_float(xs, j) - mu) * rs;
      return static_cast<double>(load_as_float(gy, j) * gamma[j]) * xhat;
    });
    if (dgamma_part != nullptr)
      for (std::int64_t j = 0; j < n; ++j)
        dgamma_part[j] +=
            static_cast<double>(load_as_float(gy, j)) * ((load_as_float(xs, j) - mu) * rs);
    if (dbeta_part != nullptr)
      for (std::int64_t j = 0; j < n; ++j) dbeta_part[j] += load_as_float(gy, j);
    const float mean_g = static_cast<float>(sum_g / count);
    const float mean_gx = static_cast<float>(sum_gx / count);
    D* out = dx + r * n;  // may be dy's row (same storage): each element read before it is written
    for (std::int64_t j = 0; j < n; ++j) {
      const float xhat = (load_as_float(xs, j) - mu) * rs;
      const float g = rs * (load_as_float(gy, j) * gamma[j] - mean_g - xhat * mean_gx);
      store_rounded(out, j, add_into_dx ? load_as_float(out, j) + g : g);
    }
  }
}

MIXTRAIN_ISA_VARIANTS(range_layernorm)
MIXTRAIN_ISA_VARIANTS(range_add_layernorm)
MIXTRAIN_ISA_VARIANTS(range_layernorm_backward)

#undef MIXTRAIN_INLINE

// Calls body(first_row, end_row) on each thread's contiguous share of the rows, or once on the
// calling thread when the tensor is small.
template <class Body>
void for_row_ranges(std::int64_t rows, std::int64_t n, Body&& body) {
  if (!parallel_worth(rows * n)) {
    body(std::int64_t{0}, rows);
    return;
  }
#pragma omp parallel
  {
    const std::int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    body(rows * t / team, rows * (t + 1) / team);
  }
}

}  // namespace

template <class T, class Y>
void layernorm_rows(const T* x, Y* y, std::int64_t rows, std::int64_t n, float eps,
                    const float* gamma, const float* beta, float* mean, float* rstd) {
  for_row_ranges(rows, n, [&](std::int64_t r0, std::int64_t r1) {
    range_layernorm_best(x, y, r0, r1, n, eps, gamma, beta, mean, rstd);
  });
}

template <class T, class Y>
void add_layernorm_rows(const T* a, const T* b, T* sum, Y* y, std::int64_t rows, std::int64_t n,
                        float eps, const float* gamma, const float* beta, float* mean,
                        float* rstd) {
  for_row_ranges(rows, n, [&](std::int64_t r0, std::int64_t r1) {
    range_add_layernorm_best(a, b, sum, y, r0, r1, n, eps, gamma, beta, mean, rstd);
  });
}

void normalize_float_row(const float* in, std::int64_t n, float eps, const float* gamma,
                         const float* beta, float* out, float* mean, float* rstd) {
  range_layernorm_best(in, out, std::int64_t{0}, std::int64_t{1}, n, eps, gamma, beta, mean, rstd);
}

template <class T, class D>
void layernorm_backward_range(const T* x, const T* dy, const float* gamma, const float* mean,
                              const float* rstd, D* dx, bool add_into_dx, std::int64_t r0,
                              std::int64_t r1, std::int64_t n, double* dgamma_part,
                              double* dbeta_part) {
  range_layernorm_backward_best(x, dy, gamma, mean, rstd, dx, add_into_dx, r0, r1, n, dgamma_part,
                                dbeta_part);
}

template void layernorm_backward_range<float, float>(const float*, const float*, const float*,
                                                     const float*, const float*, float*, bool,
                                                     std::int64_t, std::int64_t, std::int64_t,
                                                     double*, double*);
template void layernorm_backward_range<Bf16Bits, Bf16Bits>(const Bf16Bits*, const Bf16Bits*,
                                                           const float*, const float*, const float*,
                                                           Bf16Bits*, bool, std::int64_t,
                                                           std::int64_t, std::int64_t, double*,
                                                           double*);

#define MIXTRAIN_LAYERNORM_KERNELS(T, Y)                                                         \
  template void layernorm_rows<T, Y>(const T*, Y*, std::int64_t, std::int64_t, float,            \
                                     const float*, const float*, float*, float*);                \
  template void add_layernorm_rows<T, Y>(const T*, const T*, T*, Y*, std::int64_t, std::int64_t, \
                                         float, const float*, const float*, float*, float*);
MIXTRAIN_LAYERNORM_KERNELS(float, float)
MIXTRAIN_LAYERNORM_KERNELS(float, Bf16Bits)
MIXTRAIN_LAYERNORM_KERNELS(Bf16Bits, float)
MIXTRAIN_LAYERNORM_KERNELS(Bf16Bits, Bf16Bits)
#undef MIXTRAIN_LAYERNORM_KERNELS

}  // namespace mixtrain::backend_cpu
