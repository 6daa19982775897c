#include "cpu_softmax_row.h"

#include <algorithm>
#include <cmath>

#include "cpu_exp.h"
#include "cpu_isa.h"

namespace mixtrain::backend_cpu {

namespace {

// Elements summed in fp32 before their sum joins the row's double: each of a vector's lanes adds
// 16 or fewer terms (8 with AVX-512), so a block's sum is within about 16 ulp in the worst case,
// and the block sums add in double.
constexpr std::int64_t kSumBlock = 64;

[[gnu::always_inline]] inline void softmax_row_kernel(const float* z, std::int64_t classes,
                                                      float* p, bool want_z_sum, SoftmaxRow* out) {
  // The argmax of a scan that starts at z[0] and moves on a strictly greater z (the CUDA
  // backend's argmax_beats orders candidates the same way): a NaN z[0] stays, other NaNs never
  // win, ties go to the lower index. So the max of the non-NaN values, then its first index.
  float top = z[0];
  std::int64_t arg = 0;
  if (top == top) {
#pragma omp simd reduction(max : top)
    for (std::int64_t j = 0; j < classes; ++j) top = z[j] > top ? z[j] : top;
    for (std::int64_t j = 0; j < classes; ++j)
      if (z[j] == top) {
        arg = j;
        break;
      }
  }

  double sum = 0.0, z_sum = 0.0;
  // Before p is written: p may be z.
  if (want_z_sum) {
#pragma omp simd reduction(+ : z_sum)
    for (std::int64_t j = 0; j < classes; ++j) z_sum += static_cast<double>(z[j]);
  }
  // e_j = e^(z_j - max) into p when it is wanted (the gradient's pass then reads it back from
  // cache instead of taking a second exponential), else only summed.
  for (std::int64_t b = 0; b < classes; b += kSumBlock) {
    const std::int64_t end = std::min(classes, b + kSumBlock);
    float block = 0.0f;
    if (p != nullptr) {
#pragma omp simd reduction(+ : block)
      for (std::int64_t j = b; j < end; ++j) {
        const float e = exp_shifted(z[j] - top);
        p[j] = e;
        block += e;
      }
    } else {
#pragma omp simd reduction(+ : block)
      for (std::int64_t j = b; j < end; ++j) block += exp_shifted(z[j] - top);
    }
    sum += static_cast<double>(block);
  }
  if (p != nullptr) {
    const float inv = static_cast<float>(1.0 / sum);
#pragma omp simd
    for (std::int64_t j = 0; j < classes; ++j) p[j] *= inv;
  }
  out->lse = static_cast<double>(top) + std::log(sum);
  out->argmax = arg;
  out->z_sum = z_sum;
}

MIXTRAIN_ISA_VARIANTS(softmax_row_kernel)

}  // namespace

SoftmaxRow softmax_row(const float* z, std::int64_t classes, float* p, bool want_z_sum) {
  SoftmaxRow row;
  softmax_row_kernel_best(z, classes, p, want_z_sum, &row);
  return row;
}

}  // namespace mixtrain::backend_cpu
