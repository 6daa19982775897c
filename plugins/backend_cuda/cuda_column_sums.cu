// Column reductions with a fixed partition and order, so results are reproducible run to run:
// block (32 columns) x (8 row lanes) per split of the rows, the lanes folded in order, then each
// column's splits added in order in double (split_sums, cuda_device.cuh: a block per 32 columns
// stages the partials in shared memory and one lane per column adds them). Plain sums (mode 0)
// of a 16-byte-aligned dy whose columns come in whole packs run in packs: a thread takes the
// columns of one 16-byte load per row (8 of bf16, 4 of fp32) with the rows, lanes and order of
// those columns' threads above, so the partials are the same bits in fewer, wider loads (a warp
// moved 64 bytes of a bf16 row a load; the bias gradients of GPT-2 small took 0.84 ms a step on
// an H200, about 1.6 TB/s).
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

// Mode 0 in packs of V = 16 bytes of columns (see the top): thread (x, y) of block (b, s) sums
// columns [(b * 32 + x) * V, +V) over rows s * rps + y, +8, ... of its split. n % V == 0.
template <class S>
__global__ void __launch_bounds__(32 * kColRows)
    column_partial_packs_kernel(const elem_t<S>* __restrict__ dy, std::int64_t rows, std::int64_t n,
                                std::int64_t rps, float* __restrict__ partial) {
  constexpr int V = pack_width<elem_t<S>>();
  __shared__ float s[kColRows][V][33];
  const std::int64_t j0 = (static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x) * V;
  const std::int64_t r_begin = static_cast<std::int64_t>(blockIdx.y) * rps;
  const std::int64_t r_end = min(rows, r_begin + rps);
  float a[V];
#pragma unroll
  for (int v = 0; v < V; ++v) a[v] = 0.0f;
  if (j0 < n) {
#pragma unroll 4
    for (std::int64_t r = r_begin + threadIdx.y; r < r_end; r += kColRows) {
      const Pack<elem_t<S>, V> p = load_pack<V>(dy + r * n + j0);
#pragma unroll
      for (int v = 0; v < V; ++v) a[v] += S::load(p.v[v]);
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) s[threadIdx.y][v][threadIdx.x] = a[v];
  __syncthreads();
  if (threadIdx.y == 0 && j0 < n) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float t = 0.0f;
      for (int k = 0; k < kColRows; ++k) t += s[k][v][threadIdx.x];
      partial[static_cast<std::int64_t>(blockIdx.y) * n + j0 + v] = t;
    }
  }
}

// Launches column_partial_packs_kernel where dy's dtype, alignment and n allow; false otherwise.
bool launch_partial_packs(const void* dy, Elem dyt, std::int64_t rows, std::int64_t n,
                          std::int64_t rps, std::int64_t splits, float* partial,
                          cudaStream_t stream) {
  if (!aligned16(dy)) return false;
  bool launched = false;
  with_float_storage(dyt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int V = pack_width<elem_t<S>>();
    if (n % V != 0) return;
    const dim3 grid(static_cast<unsigned>((n / V + 31) / 32), static_cast<unsigned>(splits));
    column_partial_packs_kernel<S><<<grid, dim3(32, kColRows), 0, stream>>>(
        static_cast<const elem_t<S>*>(dy), rows, n, rps, partial);
    launched = true;
  });
  return launched;
}

// The finishing partials and outputs of one launch: out[k] (+)= the in-order total of partial[k].
template <int kOutputs>
struct FinishColumns {
  const float* partial[kOutputs];
  float* out[kOutputs];
};

// partial[k] is [splits, n]; out[k] is [n]. One block of kThreads per 32 columns (split_sums).
template <int kOutputs>
__global__ void __launch_bounds__(kThreads)
    column_finish_kernel(FinishColumns<kOutputs> sums, std::int64_t splits, std::int64_t n,
                         bool accumulate) {
  double total[kOutputs];
  const std::int64_t j = split_sums(sums.partial, splits, n, n, total);
  if (j < 0) return;
#pragma unroll
  for (int k = 0; k < kOutputs; ++k) {
    float* out = sums.out[k];
    out[j] = static_cast<float>((accumulate ? static_cast<double>(out[j]) : 0.0) + total[k]);
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
    if (splits > 0 && !launch_partial_packs(dy, dyt, rows, n, rps, splits, partial, stream))
      column_partial_kernel<0><<<grid, dim3(32, kColRows), 0, stream>>>(
          dy, dyt, nullptr, Elem::f32, nullptr, nullptr, rows, n, rps, partial, nullptr);
    launch_column_finish(partial, nullptr, splits, n, out1, nullptr, accumulate, stream);
    return;
  }
  float* partial2 = partial + column_sum_scratch(rows, n);
  if (splits > 0)
    column_partial_kernel<1><<<grid, dim3(32, kColRows), 0, stream>>>(
        dy, dyt, x, xt, mean, rstd, rows, n, rps, partial, partial2);
  launch_column_finish(partial, partial2, splits, n, out1, out2, accumulate, stream);
}

void launch_column_finish(const float* partial1, const float* partial2, std::int64_t splits,
                          std::int64_t n, float* out1, float* out2, bool accumulate,
                          cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = split_sum_blocks(n);
  // Both sums in one launch where both are wanted: each lane's two chains of adds overlap.
  if (out1 != nullptr && out2 != nullptr) {
    column_finish_kernel<2><<<blocks, kThreads, 0, stream>>>(
        FinishColumns<2>{{partial1, partial2}, {out1, out2}}, splits, n, accumulate);
  } else if (out1 != nullptr || out2 != nullptr) {
    const FinishColumns<1> one = out1 != nullptr ? FinishColumns<1>{{partial1}, {out1}}
                                                 : FinishColumns<1>{{partial2}, {out2}};
    column_finish_kernel<1><<<blocks, kThreads, 0, stream>>>(one, splits, n, accumulate);
  }
}

}  // namespace mixtrain::backend_cuda::kernels
