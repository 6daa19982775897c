// Column reductions with a fixed partition and order, so results are reproducible run to run:
// block (32 columns) x (8 row lanes) per split of the rows, the lanes folded in order, then one
// thread per column sums the splits in double.
#include "cuda_column_sums.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

constexpr int kColRows = 8;  // threadIdx.y lanes per column block

std::int64_t rows_per_split(std::int64_t rows) {
  const std::int64_t target = (rows + 255) / 256;  // at most 256 splits
  return target < 64 ? 64 : target;
}

// partial[s, j] (and partial2) = sums over rows [s*rps, (s+1)*rps) of column j; mode 0: dy,
// mode 1: dy * xhat (and dy into partial2).
template <int kMode>
__global__ void column_partial_kernel(const void* dy, Elem dyt, const void* x, Elem xt,
                                      const float* mean, const float* rstd, std::int64_t rows,
                                      std::int64_t n, std::int64_t rps, float* partial,
                                      float* partial2) {
  __shared__ float s1[kColRows][33];
  __shared__ float s2[kColRows][33];
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t r_begin = static_cast<std::int64_t>(blockIdx.y) * rps;
  const std::int64_t r_end = min(rows, r_begin + rps);
  float a1 = 0.0f, a2 = 0.0f;
  if (j < n)
    for (std::int64_t r = r_begin + threadIdx.y; r < r_end; r += kColRows) {
      const float g = load(dy, dyt, r * n + j);
      if (kMode == 0) {
        a1 += g;
      } else {
        const float xhat = (load(x, xt, r * n + j) - mean[r]) * rstd[r];
        a1 += g * xhat;
        a2 += g;
      }
    }
  s1[threadIdx.y][threadIdx.x] = a1;
  s2[threadIdx.y][threadIdx.x] = a2;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float t1 = 0.0f, t2 = 0.0f;
    for (int k = 0; k < kColRows; ++k) {
      t1 += s1[k][threadIdx.x];
      t2 += s2[k][threadIdx.x];
    }
    partial[static_cast<std::int64_t>(blockIdx.y) * n + j] = t1;
    if (kMode == 1) partial2[static_cast<std::int64_t>(blockIdx.y) * n + j] = t2;
  }
}

// Grid-stride over columns: grid_for() caps the grid, and rows can be wider than it covers.
__global__ void column_finish_kernel(const float* partial, std::int64_t splits, std::int64_t n,
                                     float* out, bool accumulate) {
  if (out == nullptr) return;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += stride) {
    double acc = 0.0;
    for (std::int64_t s = 0; s < splits; ++s) acc += partial[s * n + j];
    out[j] = static_cast<float>((accumulate ? static_cast<double>(out[j]) : 0.0) + acc);
  }
}

}  // namespace

std::size_t column_sum_scratch(std::int64_t rows, std::int64_t n) {
  const std::int64_t rps = rows_per_split(rows);
  const std::int64_t splits = rows == 0 ? 1 : (rows + rps - 1) / rps;
  return static_cast<std::size_t>(splits * n);
}

void launch_column_sums(const void* dy, Elem dyt, const void* x, Elem xt, const float* mean,
                        const float* rstd, std::int64_t rows, std::int64_t n, float* out1,
                        float* out2, bool accumulate, float* partial, cudaStream_t stream) {
  const std::int64_t rps = rows_per_split(rows);
  const std::int64_t splits = rows == 0 ? 0 : (rows + rps - 1) / rps;
  const dim3 grid(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(splits));
  if (x == nullptr) {
    if (splits > 0)
      column_partial_kernel<0><<<grid, dim3(32, kColRows), 0, stream>>>(
          dy, dyt, nullptr, Elem::f32, nullptr, nullptr, rows, n, rps, partial, nullptr);
    column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial, splits, n, out1,
                                                               accumulate);
    return;
  }
  float* partial2 = partial + column_sum_scratch(rows, n);
  if (splits > 0)
    column_partial_kernel<1><<<grid, dim3(32, kColRows), 0, stream>>>(
        dy, dyt, x, xt, mean, rstd, rows, n, rps, partial, partial2);
  column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial, splits, n, out1, accumulate);
  column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial2, splits, n, out2, accumulate);
}

void launch_column_finish(const float* partial, std::int64_t splits, std::int64_t n, float* out,
                          bool accumulate, cudaStream_t stream) {
  if (out == nullptr || n == 0) return;
  column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial, splits, n, out, accumulate);
}

}  // namespace mixtrain::backend_cuda::kernels
