// The layer norm facet's kernels: one warp per row, statistics in double as the CPU reference;
// the backward's parameter sums in the row pass or as column sums (cuda_layer_norm_plan.h).
#include "cuda_device.cuh"
#include "cuda_layer_norm.h"

#include <algorithm>

namespace mixtrain::backend_cuda::kernels {

namespace {

// Row `row` of y = layernorm(x), its mean and rstd, by one warp: the routine both forward
// kernels run, so the fused add + layer norm writes the same bits as the layer norm alone.
__device__ void normalize_row(const void* x, Elem xt, const void* gamma, Elem gt, const void* beta,
                              Elem bt, float eps, void* y, Elem yt, float* mean, float* rstd,
                              std::int64_t row, std::int64_t n, int lane) {
  const std::int64_t base = row * n;
  // Statistics in double, as the CPU reference.
  double sum = 0.0;
  for (std::int64_t j = lane; j < n; j += 32) sum += load(x, xt, base + j);
  const float mu = static_cast<float>(warp_sum(sum) / static_cast<double>(n));
  double sq = 0.0;  // two-pass variance: no cancellation for large means
  for (std::int64_t j = lane; j < n; j += 32) {
    const float d = load(x, xt, base + j) - mu;
    sq += static_cast<double>(d) * d;
  }
  const float rs = static_cast<float>(
      1.0 / sqrt(warp_sum(sq) / static_cast<double>(n) + static_cast<double>(eps)));
  for (std::int64_t j = lane; j < n; j += 32) {
    const float g = gamma != nullptr ? load(gamma, gt, j) : 1.0f;
    const float b = beta != nullptr ? load(beta, bt, j) : 0.0f;
    store(y, yt, base + j, (load(x, xt, base + j) - mu) * rs * g + b);
  }
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// One warp per row.
__global__ void layernorm_forward_kernel(const void* x, Elem xt, const void* gamma, Elem gt,
                                         const void* beta, Elem bt, float eps, void* y, Elem yt,
                                         float* mean, float* rstd, std::int64_t rows,
                                         std::int64_t n) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  normalize_row(x, xt, gamma, gt, beta, bt, eps, y, yt, mean, rstd, row, n, threadIdx.x & 31);
}

// One warp per row: sum = a + b rounded once, then the row normalised from the sum as stored.
// Each lane reads back only the elements it wrote (the same j's in every pass), so the stores
// are visible to it without a fence; sum may be a or b (element-wise).
__global__ void layernorm_add_forward_kernel(const void* a, Elem at, const void* b, Elem bt_in,
                                             void* sum, Elem st, const void* gamma, Elem gt,
                                             const void* beta, Elem bt, float eps, void* y, Elem yt,
                                             float* mean, float* rstd, std::int64_t rows,
                                             std::int64_t n) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const std::int64_t base = row * n;
  for (std::int64_t j = lane; j < n; j += 32)  // sum is [rows, n]; a, b of its numel
    store(sum, st, base + j, load(a, at, base + j) + load(b, bt_in, base + j));
  normalize_row(sum, st, gamma, gt, beta, bt, eps, y, yt, mean, rstd, row, n, lane);
}

// Row `row` of dx by one warp, from the row's dy, x, mean and rstd (dx may alias dy: each lane
// rewrites only the elements it read). With s1 and s2 (the one-pass backward's shared slices of
// this warp), each column's dy·xhat and dy are added to them on the way.
__device__ void backward_row(const void* dy, Elem dyt, const void* x, Elem xt, const void* gamma,
                             Elem gt, const float* mean, const float* rstd, void* dx, Elem dxt,
                             std::int64_t row, std::int64_t n, int lane, bool add_into_dx,
                             float* s1, float* s2) {
  const std::int64_t base = row * n;
  const float mu = mean[row], rs = rstd[row];
  double sum_g = 0.0, sum_gx = 0.0;  // double, as the CPU reference
  for (std::int64_t j = lane; j < n; j += 32) {
    const float xhat = (load(x, xt, base + j) - mu) * rs;
    const float d = load(dy, dyt, base + j);
    const float g = d * (gamma != nullptr ? load(gamma, gt, j) : 1.0f);
    sum_g += g;
    sum_gx += static_cast<double>(g) * xhat;
    if (s1 != nullptr) {
      s1[j] += d * xhat;
      s2[j] += d;
    }
  }
  const float mean_g = static_cast<float>(warp_sum(sum_g) / static_cast<double>(n));
  const float mean_gx = static_cast<float>(warp_sum(sum_gx) / static_cast<double>(n));
  for (std::int64_t j = lane; j < n; j += 32) {
    const float xhat = (load(x, xt, base + j) - mu) * rs;
    const float g = load(dy, dyt, base + j) * (gamma != nullptr ? load(gamma, gt, j) : 1.0f);
    const float v = rs * (g - mean_g - xhat * mean_gx);
    if (add_into_dx)
      static_cast<float*>(dx)[base + j] += v;  // fp32, apart from dy and x: the host's sum
    else
      store(dx, dxt, base + j, v);
  }
}

// One warp per row; dgamma / dbeta summed apart (the column sums) or not at all.
__global__ void layernorm_backward_kernel(const void* dy, Elem dyt, const void* x, Elem xt,
                                          const void* gamma, Elem gt, const float* mean,
                                          const float* rstd, void* dx, Elem dxt, std::int64_t rows,
                                          std::int64_t n, bool add_into_dx) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  backward_row(dy, dyt, x, xt, gamma, gt, mean, rstd, dx, dxt, row, n, threadIdx.x & 31,
               add_into_dx, nullptr, nullptr);
}

// The one-pass backward (cuda_layer_norm_plan.h): block b takes rows [b·16, b·16 + 16), warp w
// of it every kWarps-th of them from w; per row the warp computes the row's sums and writes dx as
// layernorm_backward_kernel does, and adds each column's dy·xhat and dy to its own shared slice
// (lane l owns columns l, l + 32, ...: no two threads touch one float). The block then folds its
// warps' slices in order into partial1 / partial2 [blocks, n].
// dy, x, dx are [rows, n]; gamma [n] or null; mean, rstd [rows].
__global__ void layernorm_backward_one_pass_kernel(const void* dy, Elem dyt, const void* x, Elem xt,
                                                   const void* gamma, Elem gt, const float* mean,
                                                   const float* rstd, void* dx, Elem dxt,
                                                   std::int64_t rows, std::int64_t n,
                                                   bool add_into_dx, float* partial1,
                                                   float* partial2) {
  extern __shared__ float slices[];  // [kWarps][2][n]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* s1 = slices + static_cast<std::int64_t>(warp) * 2 * n;  // Σ dy·xhat of this warp's rows
  float* s2 = s1 + n;                                            // Σ dy
  for (std::int64_t j = lane; j < n; j += 32) s1[j] = s2[j] = 0.0f;
  const std::int64_t r_begin =
      static_cast<std::int64_t>(blockIdx.x) * layer_norm_plan::kRowsPerBlock;
  const std::int64_t r_end = min(rows, r_begin + layer_norm_plan::kRowsPerBlock);
  for (std::int64_t row = r_begin + warp; row < r_end; row += layer_norm_plan::kWarps)
    backward_row(dy, dyt, x, xt, gamma, gt, mean, rstd, dx, dxt, row, n, lane, add_into_dx, s1, s2);
  __syncthreads();
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float t1 = 0.0f, t2 = 0.0f;
    for (int w = 0; w < layer_norm_plan::kWarps; ++w) {
      t1 += slices[static_cast<std::int64_t>(w) * 2 * n + j];
      t2 += slices[static_cast<std::int64_t>(w) * 2 * n + n + j];
    }
    partial1[static_cast<std::int64_t>(blockIdx.x) * n + j] = t1;
    partial2[static_cast<std::int64_t>(blockIdx.x) * n + j] = t2;
  }
}

}  // namespace

cudaError_t layernorm_forward(const void* x, Elem xt, const void* gamma, Elem gt, const void* beta,
                              Elem bt, float eps, void* y, Elem yt, float* mean, float* rstd,
                              std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  layernorm_forward_kernel<<<warp_row_blocks(rows), kThreads, 0, stream>>>(
      x, xt, gamma, gt, beta, bt, eps, y, yt, mean, rstd, rows, n);
  return cudaGetLastError();
}

cudaError_t layernorm_add_forward(const void* a, Elem at, const void* b, Elem bt_in, void* sum,
                                  Elem st, const void* gamma, Elem gt, const void* beta, Elem bt,
                                  float eps, void* y, Elem yt, float* mean, float* rstd,
                                  std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  layernorm_add_forward_kernel<<<warp_row_blocks(rows), kThreads, 0, stream>>>(
      a, at, b, bt_in, sum, st, gamma, gt, beta, bt, eps, y, yt, mean, rstd, rows, n);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(const void* dy, Elem dyt, const void* x, Elem xt, const void* gamma,
                               Elem gt, const float* mean, const float* rstd, void* dx, Elem dxt,
                               float* dgamma, float* dbeta, bool accumulate, std::int64_t rows,
                               std::int64_t n, float* partial, cudaStream_t stream,
                               bool add_into_dx, layer_norm_plan::BackwardRoute route) {
  if (n == 0) return cudaSuccess;
  using layer_norm_plan::BackwardRoute;
  if (route == BackwardRoute::one_pass) {
    const std::int64_t blocks = layer_norm_plan::one_pass_blocks(rows);
    const std::size_t shared = layer_norm_plan::one_pass_shared_bytes(n);
    // Above the default 48 KiB a kernel must opt in (the route checked the device allows it).
    if (shared > 48 * 1024) {
      const cudaError_t set = cudaFuncSetAttribute(layernorm_backward_one_pass_kernel,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(shared));
      if (set != cudaSuccess) return set;
    }
    float* partial2 = partial + std::max<std::int64_t>(1, blocks) * n;
    if (blocks > 0)
      layernorm_backward_one_pass_kernel<<<static_cast<unsigned>(blocks),
                                           32 * layer_norm_plan::kWarps, shared, stream>>>(
          dy, dyt, x, xt, gamma, gt, mean, rstd, dx, dxt, rows, n, add_into_dx, partial, partial2);
    // No rows: no partial row, so the sums are zero (or left as they are when accumulating).
    launch_column_finish(partial, partial2, blocks, n, dgamma, dbeta, accumulate, stream);
    return cudaGetLastError();
  }
  // Column sums first: dx may alias dy.
  if (route == BackwardRoute::column_sums_then_rows)
    launch_column_sums(dy, dyt, x, xt, mean, rstd, rows, n, dgamma, dbeta, accumulate, partial,
                       stream);
  if (rows > 0)
    layernorm_backward_kernel<<<warp_row_blocks(rows), kThreads, 0, stream>>>(
        dy, dyt, x, xt, gamma, gt, mean, rstd, dx, dxt, rows, n, add_into_dx);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
