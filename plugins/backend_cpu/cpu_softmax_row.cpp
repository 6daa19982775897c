#include "cpu_softmax_row.h"

#include <algorithm>
#include <cmath>

#include "cpu_exp.h"
#include "cpu_isa.h"
#include "cpu_lane_reductions.h"

namespace mixtrain::backend_cpu {

namespace {

#define MIXTRAIN_SOFTMAX_INLINE __attribute__((always_inline))

// The row's sums (the exponentials, and Σ z for label smoothing) in 32 double lanes added in a
// fixed tree (cpu_lane_reductions.h), so a sum's bits follow its values alone, on every ISA. The
// exponentials were fp32 sums of 64-element blocks added in double: the blocks' order of additions
// followed the vector width, and each block ended in a chain of 16 dependent scalar adds, about a
// quarter of the row's time (bench/RESULTS.md, session 66).
constexpr int kLanes = 32;

// The first j with z[j] == top, top being one of z's values: blocks of 64 compared at the ISA's
// width, then the block that holds it scanned. A scalar scan from z[0] took about a third of a
// GPT-2 row's time (half of 50,257 compares on average).
template <class T>
[[gnu::always_inline]] inline std::int64_t first_equal(const T* z, std::int64_t n, float top) {
  constexpr std::int64_t kBlock = 64;
  std::int64_t b = 0;
  for (; b + kBlock <= n; b += kBlock) {
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (std::int64_t j = b; j < b + kBlock; ++j) hit |= load_as_float(z, j) == top ? 1 : 0;
    if (hit != 0) break;
  }
  for (std::int64_t j = b; j < n; ++j)
    if (load_as_float(z, j) == top) return j;
  return 0;
}

// z is fp32 or bf16 (read in place: a bf16 logit is exact in fp32, so the same values as a
// decoded row, without the decode's pass).
template <class T>
[[gnu::always_inline]] inline void softmax_row_kernel(const T* z, std::int64_t classes, float* p,
                                                      bool want_z_sum, SoftmaxRow* out) {
  // The argmax of a scan that starts at z[0] and moves on a strictly greater z (the CUDA
  // backend's argmax_beats orders candidates the same way): a NaN z[0] stays, other NaNs never
  // win, ties go to the lower index. So the max of the non-NaN values, then its first index.
  float top = load_as_float(z, 0);
  std::int64_t arg = 0;
  if (top == top) {
#pragma omp simd reduction(max : top)
    for (std::int64_t j = 0; j < classes; ++j) {
      const float v = load_as_float(z, j);
      top = v > top ? v : top;
    }
    arg = first_equal(z, classes, top);
  }

  // Before p is written: p may be z.
  const double z_sum =
      want_z_sum ? lane_sum<double, kLanes>(classes,
                                            [&](std::int64_t i) MIXTRAIN_SOFTMAX_INLINE {
                                              return static_cast<double>(load_as_float(z, i));
                                            })
                 : 0.0;
  // e_j = e^(z_j - max) into p when it is wanted (the gradient's pass then reads it back from
  // cache instead of taking a second exponential), else only summed.
  const double sum =
      p != nullptr
          ? lane_sum<double, kLanes>(classes,
                                     [&](std::int64_t i) MIXTRAIN_SOFTMAX_INLINE {
                                       const float e = exp_shifted(load_as_float(z, i) - top);
                                       p[i] = e;
                                       return static_cast<double>(e);
                                     })
          : lane_sum<double, kLanes>(classes, [&](std::int64_t i) MIXTRAIN_SOFTMAX_INLINE {
              return static_cast<double>(exp_shifted(load_as_float(z, i) - top));
            });
  if (p != nullptr) {
    const float inv = static_cast<float>(1.0 / sum);
#pragma omp simd
    for (std::int64_t j = 0; j < classes; ++j) p[j] *= inv;
  }
  out->lse = static_cast<double>(top) + std::log(sum);
  out->argmax = arg;
  out->z_sum = z_sum;
}

// The label's probability is read before the row is written: dst may be p.
template <class D>
[[gnu::always_inline]] inline void gradient_row_kernel(const float* p, std::int64_t classes,
                                                       std::int64_t label, float off, float on,
                                                       float grad_factor, D* dst) {
  const float p_label = p[label];
#pragma omp simd
  for (std::int64_t j = 0; j < classes; ++j) store_rounded(dst, j, (p[j] - off) * grad_factor);
  store_rounded(dst, label, (p_label - on) * grad_factor);
}

MIXTRAIN_ISA_VARIANTS(softmax_row_kernel)
MIXTRAIN_ISA_VARIANTS(gradient_row_kernel)

}  // namespace

SoftmaxRow softmax_row(const float* z, std::int64_t classes, float* p, bool want_z_sum) {
  SoftmaxRow row;
  softmax_row_kernel_best(z, classes, p, want_z_sum, &row);
  return row;
}

SoftmaxRow softmax_row(const Bf16Bits* z, std::int64_t classes, float* p, bool want_z_sum) {
  SoftmaxRow row;
  softmax_row_kernel_best(z, classes, p, want_z_sum, &row);
  return row;
}

void softmax_gradient_row(const float* p, std::int64_t classes, std::int64_t label, float off,
                          float on, float grad_factor, float* dst) {
  gradient_row_kernel_best(p, classes, label, off, on, grad_factor, dst);
}

void softmax_gradient_row(const float* p, std::int64_t classes, std::int64_t label, float off,
                          float on, float grad_factor, Bf16Bits* dst) {
  gradient_row_kernel_best(p, classes, label, off, on, grad_factor, dst);
}

}  // namespace mixtrain::backend_cpu
