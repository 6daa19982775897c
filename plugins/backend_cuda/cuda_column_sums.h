// Launchers of the reproducible column reductions (cuda_column_sums.cu) that the activation
// facet's bias gradient and the layer norm's dgamma / dbeta share: a fixed split of the rows (a
// function of rows only), FP32 partial sums within a split, double across splits in order.
// Contract: cuda_kernel_types.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// Floats of scratch one set of column sums of [rows, n] needs.
std::size_t column_sum_scratch(std::int64_t rows, std::int64_t n);
// Column sums of dy [rows, n], n > 0: out1[j] (+)= Σ_r dy[r, j] without x, or with x (xhat =
// (x - mean[r]) * rstd[r]) out1[j] (+)= Σ_r dy * xhat and out2[j] (+)= Σ_r dy. out1 / out2
// nullable (not written); "+=" when accumulate. partial: column_sum_scratch(rows, n) floats, twice
// that with x.
void launch_column_sums(const void* dy, Elem dyt, const void* x, Elem xt, const float* mean,
                        const float* rstd, std::int64_t rows, std::int64_t n, float* out1,
                        float* out2, bool accumulate, float* partial, cudaStream_t stream);
// out1[j] (+)= Σ_s partial1[s, j] and out2[j] (+)= Σ_s partial2[s, j] over `splits` rows of
// partial1 / partial2 [splits, n], in double and in split order: the last step of the reductions
// above, for a kernel that wrote its own partials (the layer norm's one-pass backward). out1 /
// out2 nullable (not written; its partial then unread).
void launch_column_finish(const float* partial1, const float* partial2, std::int64_t splits,
                          std::int64_t n, float* out1, float* out2, bool accumulate,
                          cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
