// The layer norm facet's kernels: one warp per row, statistics in double as the CPU reference;
// the backward's parameter sums in the row pass or as column sums (cuda_layer_norm_plan.h).
// The row tensors' storage types (x, dy; the fused add's a, b and sum) are template parameters
// chosen once per launch, so each of their loads is one typed load. Each row pass takes a lane's
// columns kUnroll at a time: the round's loads first, then its columns in column order, each
// through the same operations as one column at a time. A lane's sums and every element therefore
// see the same operations in the same order (the same bits), with kUnroll loads of each tensor in
// flight instead of one. gamma, beta ([n], read again by every row) and the outputs keep a run-time
// tag, switched once per round, so the instantiations stay those of the row tensors' types.
#include "cuda_device.cuh"
#include "cuda_layer_norm.h"

#include <algorithm>

namespace mixtrain::backend_cuda::kernels {

namespace {

// Columns a lane loads before it uses them, per pass: 8 to 16 loads a round where registers allow.
// The forward kernels stay within 32 registers (8 blocks of 8 warps an SM; 38 and 42 before) and
// the two-pass backward within 40 (6 blocks; 42 before); 16 columns of the statistics or 8 of the
// others would cost blocks. The one-pass backward has ~4 blocks of 4 warps an SM at GPT-2's shape
// (8192 rows of 768), so each lane keeps 8 columns of x, dy (and dx) in flight; kOnePassMinBlocks
// caps it at 56 registers (ptxas would take 64) so that it keeps the 9 blocks an SM that 768
// columns' slices allow (24 KiB + 1 KiB reserved a block, of Hopper's 228 KiB), as the
// 48-register kernel before did.
constexpr int kStatisticsUnroll = 8;  // the forward's mean and variance passes: x alone
constexpr int kNormalizeUnroll = 4;   // the forward's last pass: x, gamma and beta
constexpr int kAddUnroll = 8;         // the fused add's first pass: a and b
constexpr int kBackwardUnroll = 4;    // x, dy, gamma (and dx)
constexpr int kOnePassUnroll = 8;
constexpr int kOnePassMinBlocks = 9;

bool is_float_storage(Elem t) {
  return with_float_storage(t, [](auto) {});
}

// A run-time-typed tensor of a round (gamma, beta, y, dx): absent, or a storage type the rounds'
// switches decode and encode.
bool absent_or_float_storage(const void* p, Elem t) {
  return p == nullptr || is_float_storage(t);
}

// f(S1{}, S2{}, ...) with the storage type of each tag, fp32, bf16 or fp16 (the launchers check
// the tags first; another calls nothing).
template <class F>
void with_float_storages(F&& f) {
  f();
}
template <class F, class... Tags>
void with_float_storages(F&& f, Elem first, Tags... rest) {
  with_float_storage(
      first, [&](auto s) { with_float_storages([&](auto... more) { f(s, more...); }, rest...); });
}

// A lane's columns of a row of n, j = lane, lane + 32, ... in order: round(j) for each full run of
// kUnroll of them from j (j, j + 32, ..., j + 32·(kUnroll - 1)), then one(j) for each of the
// fewer than kUnroll left.
template <int kUnroll, class Round, class One>
__device__ __forceinline__ void lane_columns(std::int64_t n, int lane, Round&& round, One&& one) {
  std::int64_t j = lane;
  for (; j + 32 * (kUnroll - 1) < n; j += 32 * kUnroll) round(j);
  for (; j < n; j += 32) one(j);
}

// v[u] = p[32·u] decoded, every load issued before the first decode.
template <class S, int kUnroll>
__device__ __forceinline__ void load_round(const typename S::T* p, float (&v)[kUnroll]) {
  typename S::T raw[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) raw[u] = p[32 * u];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) v[u] = S::load(raw[u]);
}

// gamma or beta at j (`absent` where it is null), as the row passes read them one at a time.
__device__ __forceinline__ float param_at(const void* p, Elem t, std::int64_t j, float absent) {
  return p != nullptr ? load(p, t, j) : absent;
}

// param_at for j + 32·u, u < kUnroll, with one switch on the tag for the round (fp32, bf16 or
// fp16: the launchers refuse another).
template <int kUnroll>
__device__ __forceinline__ void load_param_round(const void* p, Elem t, std::int64_t j,
                                                 float absent, float (&v)[kUnroll]) {
  if (p == nullptr) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = absent;
    return;
  }
  switch (t) {
    case Elem::bf16:
      return load_round<storage::Bf16>(static_cast<const std::uint16_t*>(p) + j, v);
    case Elem::f16:
      return load_round<storage::F16>(static_cast<const std::uint16_t*>(p) + j, v);
    default:
      return load_round<storage::F32>(static_cast<const float*>(p) + j, v);
  }
}

template <class S, int kUnroll>
__device__ __forceinline__ void store_typed_round(typename S::T* p, const float (&v)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) p[32 * u] = S::store(v[u], false);
}

// store(p, t, i + 32·u, v[u]) for u < kUnroll, with one switch on the tag for the round (fp32,
// bf16 or fp16: the launchers refuse another).
template <int kUnroll>
__device__ __forceinline__ void store_round(void* p, Elem t, std::int64_t i,
                                            const float (&v)[kUnroll]) {
  switch (t) {
    case Elem::bf16:
      return store_typed_round<storage::Bf16>(static_cast<std::uint16_t*>(p) + i, v);
    case Elem::f16:
      return store_typed_round<storage::F16>(static_cast<std::uint16_t*>(p) + i, v);
    default:
      return store_typed_round<storage::F32>(static_cast<float*>(p) + i, v);
  }
}

// f(row[j]) for a lane's columns j in order, kUnroll loads ahead.
template <class S, int kUnroll, class F>
__device__ __forceinline__ void for_lane_values(const typename S::T* row, std::int64_t n, int lane,
                                                F&& f) {
  lane_columns<kUnroll>(
      n, lane,
      [&](std::int64_t j) {
        float v[kUnroll];
        load_round<S>(row + j, v);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) f(v[u]);
      },
      [&](std::int64_t j) { f(S::load(row[j])); });
}

// Row `row` of y = layernorm(x), its mean and rstd, by one warp: the routine both forward
// kernels run, so the fused add + layer norm writes the same bits as the layer norm alone.
// x, y are [rows, n] (y may be x: each lane rewrites only the elements it has just read);
// gamma, beta [n] or null; mean, rstd [rows].
template <class X>
__device__ void normalize_row(const typename X::T* x, const void* gamma, Elem gt, const void* beta,
                              Elem bt, float eps, void* y, Elem yt, float* mean, float* rstd,
                              std::int64_t row, std::int64_t n, int lane) {
  const std::int64_t base = row * n;
  const typename X::T* xr = x + base;
  // Statistics in double, as the CPU reference.
  double sum = 0.0;
  for_lane_values<X, kStatisticsUnroll>(xr, n, lane, [&](float v) { sum += v; });
  const float mu = static_cast<float>(warp_sum(sum) / static_cast<double>(n));
  double sq = 0.0;  // two-pass variance: no cancellation for large means
  for_lane_values<X, kStatisticsUnroll>(xr, n, lane, [&](float v) {
    const float d = v - mu;
    sq += static_cast<double>(d) * d;
  });
  const float rs = static_cast<float>(
      1.0 / sqrt(warp_sum(sq) / static_cast<double>(n) + static_cast<double>(eps)));
  const auto normalized = [&](float v, float g, float b) { return (v - mu) * rs * g + b; };
  constexpr int kUnroll = kNormalizeUnroll;
  lane_columns<kUnroll>(
      n, lane,
      [&](std::int64_t j) {
        float v[kUnroll], g[kUnroll], b[kUnroll], out[kUnroll];
        load_round<X>(xr + j, v);
        load_param_round(gamma, gt, j, 1.0f, g);
        load_param_round(beta, bt, j, 0.0f, b);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) out[u] = normalized(v[u], g[u], b[u]);
        store_round(y, yt, base + j, out);
      },
      [&](std::int64_t j) {
        store(
            y, yt, base + j,
            normalized(X::load(xr[j]), param_at(gamma, gt, j, 1.0f), param_at(beta, bt, j, 0.0f)));
      });
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// One warp per row. x, y are [rows, n]; gamma, beta [n] or null; mean, rstd [rows].
template <class X>
__global__ void layernorm_forward_kernel(const typename X::T* x, const void* gamma, Elem gt,
                                         const void* beta, Elem bt, float eps, void* y, Elem yt,
                                         float* mean, float* rstd, std::int64_t rows,
                                         std::int64_t n) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  normalize_row<X>(x, gamma, gt, beta, bt, eps, y, yt, mean, rstd, row, n, threadIdx.x & 31);
}

// One warp per row: sum = a + b rounded once, then the row normalised from the sum as stored.
// Each lane reads back only the elements it wrote (the same j's in every pass), so the stores
// are visible to it without a fence; sum may be a or b (element-wise: a lane loads a round's a
// and b before it writes the round's sums). sum and y are [rows, n], a and b of its numel, y apart
// from the other three; gamma, beta [n] or null; mean, rstd [rows].
template <class A, class B, class S>
__global__ void layernorm_add_forward_kernel(const typename A::T* a, const typename B::T* b,
                                             typename S::T* sum, const void* gamma, Elem gt,
                                             const void* beta, Elem bt, float eps, void* y, Elem yt,
                                             float* mean, float* rstd, std::int64_t rows,
                                             std::int64_t n) {
  constexpr int kUnroll = kAddUnroll;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const std::int64_t base = row * n;
  lane_columns<kUnroll>(
      n, lane,
      [&](std::int64_t j) {
        float va[kUnroll], vb[kUnroll];
        load_round<A>(a + base + j, va);
        load_round<B>(b + base + j, vb);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) sum[base + j + 32 * u] = S::store(va[u] + vb[u], false);
      },
      [&](std::int64_t j) {
        sum[base + j] = S::store(A::load(a[base + j]) + B::load(b[base + j]), false);
      });
  normalize_row<S>(sum, gamma, gt, beta, bt, eps, y, yt, mean, rstd, row, n, lane);
}

// Row `row` of dx by one warp, from the row's dy, x, mean and rstd (dx may alias dy or x: each
// lane rewrites only the elements it has just read). With s1 and s2 (the one-pass backward's
// shared slices of this warp), each column's dy·xhat and dy are added to them on the way.
// dy, x, dx are [rows, n]; gamma [n] or null; mean, rstd [rows].
template <class DY, class X, int kUnroll>
__device__ void backward_row(const typename DY::T* dy, const typename X::T* x, const void* gamma,
                             Elem gt, const float* mean, const float* rstd, void* dx, Elem dxt,
                             std::int64_t row, std::int64_t n, int lane, bool add_into_dx,
                             float* s1, float* s2) {
  const std::int64_t base = row * n;
  const typename DY::T* dyr = dy + base;
  const typename X::T* xr = x + base;
  const float mu = mean[row], rs = rstd[row];
  double sum_g = 0.0, sum_gx = 0.0;  // double, as the CPU reference
  const auto add_terms = [&](std::int64_t j, float xv, float d, float gm) {
    const float xhat = (xv - mu) * rs;
    const float g = d * gm;
    sum_g += g;
    sum_gx += static_cast<double>(g) * xhat;
    if (s1 != nullptr) {
      s1[j] += d * xhat;
      s2[j] += d;
    }
  };
  lane_columns<kUnroll>(
      n, lane,
      [&](std::int64_t j) {
        float xv[kUnroll], d[kUnroll], gm[kUnroll];
        load_round<X>(xr + j, xv);
        load_round<DY>(dyr + j, d);
        load_param_round(gamma, gt, j, 1.0f, gm);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) add_terms(j + 32 * u, xv[u], d[u], gm[u]);
      },
      [&](std::int64_t j) {
        add_terms(j, X::load(xr[j]), DY::load(dyr[j]), param_at(gamma, gt, j, 1.0f));
      });
  const float mean_g = static_cast<float>(warp_sum(sum_g) / static_cast<double>(n));
  const float mean_gx = static_cast<float>(warp_sum(sum_gx) / static_cast<double>(n));
  const auto grad = [&](float xv, float d, float gm) {
    const float xhat = (xv - mu) * rs;
    const float g = d * gm;
    return rs * (g - mean_g - xhat * mean_gx);
  };
  // add_into_dx: dx is fp32 and apart from dy and x (the host's sum), so its round is loaded with
  // theirs.
  float* const dx_sum = static_cast<float*>(dx);
  lane_columns<kUnroll>(
      n, lane,
      [&](std::int64_t j) {
        float xv[kUnroll], d[kUnroll], gm[kUnroll], prior[kUnroll], v[kUnroll];
        load_round<X>(xr + j, xv);
        load_round<DY>(dyr + j, d);
        if (add_into_dx) load_round<storage::F32>(dx_sum + base + j, prior);
        load_param_round(gamma, gt, j, 1.0f, gm);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = grad(xv[u], d[u], gm[u]);
        if (add_into_dx) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) dx_sum[base + j + 32 * u] = prior[u] + v[u];
        } else {
          store_round(dx, dxt, base + j, v);
        }
      },
      [&](std::int64_t j) {
        const float v = grad(X::load(xr[j]), DY::load(dyr[j]), param_at(gamma, gt, j, 1.0f));
        if (add_into_dx)
          dx_sum[base + j] += v;
        else
          store(dx, dxt, base + j, v);
      });
}

// One warp per row; dgamma / dbeta summed apart (the column sums) or not at all.
// dy, x, dx are [rows, n]; gamma [n] or null; mean, rstd [rows].
template <class DY, class X>
__global__ void layernorm_backward_kernel(const typename DY::T* dy, const typename X::T* x,
                                          const void* gamma, Elem gt, const float* mean,
                                          const float* rstd, void* dx, Elem dxt, std::int64_t rows,
                                          std::int64_t n, bool add_into_dx) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  backward_row<DY, X, kBackwardUnroll>(dy, x, gamma, gt, mean, rstd, dx, dxt, row, n,
                                       threadIdx.x & 31, add_into_dx, nullptr, nullptr);
}

// The one-pass backward (cuda_layer_norm_plan.h): block b takes rows [b·16, b·16 + 16), warp w
// of it every kWarps-th of them from w; per row the warp computes the row's sums and writes dx as
// layernorm_backward_kernel does, and adds each column's dy·xhat and dy to its own shared slice
// (lane l owns columns l, l + 32, ...: no two threads touch one float). The block then folds its
// warps' slices in order into partial1 / partial2 [blocks, n].
// dy, x, dx are [rows, n]; gamma [n] or null; mean, rstd [rows].
template <class DY, class X>
__global__ void __launch_bounds__(32 * layer_norm_plan::kWarps, kOnePassMinBlocks)
    layernorm_backward_one_pass_kernel(const typename DY::T* dy, const typename X::T* x,
                                       const void* gamma, Elem gt, const float* mean,
                                       const float* rstd, void* dx, Elem dxt, std::int64_t rows,
                                       std::int64_t n, bool add_into_dx, float* partial1,
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
    backward_row<DY, X, kOnePassUnroll>(dy, x, gamma, gt, mean, rstd, dx, dxt, row, n, lane,
                                        add_into_dx, s1, s2);
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

// The one-pass kernel over rows [0, rows) in `blocks` blocks, `shared` bytes of slices each.
template <class DY, class X>
cudaError_t launch_one_pass(const void* dy, const void* x, const void* gamma, Elem gt,
                            const float* mean, const float* rstd, void* dx, Elem dxt,
                            std::int64_t rows, std::int64_t n, bool add_into_dx,
                            std::int64_t blocks, std::size_t shared, float* partial1,
                            float* partial2, cudaStream_t stream) {
  const auto kernel = layernorm_backward_one_pass_kernel<DY, X>;
  // Above the default 48 KiB a kernel must opt in (the route checked the device allows it).
  if (shared > 48 * 1024) {
    const cudaError_t set = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (set != cudaSuccess) return set;
  }
  if (blocks > 0)
    kernel<<<static_cast<unsigned>(blocks), 32 * layer_norm_plan::kWarps, shared, stream>>>(
        static_cast<const typename DY::T*>(dy), static_cast<const typename X::T*>(x), gamma, gt,
        mean, rstd, dx, dxt, rows, n, add_into_dx, partial1, partial2);
  return cudaSuccess;
}

}  // namespace

cudaError_t layernorm_forward(const void* x, Elem xt, const void* gamma, Elem gt, const void* beta,
                              Elem bt, float eps, void* y, Elem yt, float* mean, float* rstd,
                              std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!is_float_storage(xt) || !absent_or_float_storage(gamma, gt) ||
      !absent_or_float_storage(beta, bt) || !is_float_storage(yt))
    return cudaErrorInvalidValue;
  with_float_storages(
      [&](auto x_s) {
        using X = decltype(x_s);
        layernorm_forward_kernel<X><<<warp_row_blocks(rows), kThreads, 0, stream>>>(
            static_cast<const typename X::T*>(x), gamma, gt, beta, bt, eps, y, yt, mean, rstd, rows,
            n);
      },
      xt);
  return cudaGetLastError();
}

cudaError_t layernorm_add_forward(const void* a, Elem at, const void* b, Elem bt_in, void* sum,
                                  Elem st, const void* gamma, Elem gt, const void* beta, Elem bt,
                                  float eps, void* y, Elem yt, float* mean, float* rstd,
                                  std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!is_float_storage(at) || !is_float_storage(bt_in) || !is_float_storage(st) ||
      !absent_or_float_storage(gamma, gt) || !absent_or_float_storage(beta, bt) ||
      !is_float_storage(yt))
    return cudaErrorInvalidValue;
  with_float_storages(
      [&](auto a_s, auto b_s, auto sum_s) {
        using A = decltype(a_s);
        using B = decltype(b_s);
        using S = decltype(sum_s);
        layernorm_add_forward_kernel<A, B, S><<<warp_row_blocks(rows), kThreads, 0, stream>>>(
            static_cast<const typename A::T*>(a), static_cast<const typename B::T*>(b),
            static_cast<typename S::T*>(sum), gamma, gt, beta, bt, eps, y, yt, mean, rstd, rows, n);
      },
      at, bt_in, st);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(const void* dy, Elem dyt, const void* x, Elem xt, const void* gamma,
                               Elem gt, const float* mean, const float* rstd, void* dx, Elem dxt,
                               float* dgamma, float* dbeta, bool accumulate, std::int64_t rows,
                               std::int64_t n, float* partial, cudaStream_t stream,
                               bool add_into_dx, layer_norm_plan::BackwardRoute route) {
  if (n == 0) return cudaSuccess;
  if (!is_float_storage(dyt) || !is_float_storage(xt) || !absent_or_float_storage(gamma, gt) ||
      !is_float_storage(dxt))
    return cudaErrorInvalidValue;
  using layer_norm_plan::BackwardRoute;
  if (route == BackwardRoute::one_pass) {
    const std::int64_t blocks = layer_norm_plan::one_pass_blocks(rows);
    const std::size_t shared = layer_norm_plan::one_pass_shared_bytes(n);
    float* partial2 = partial + std::max<std::int64_t>(1, blocks) * n;
    cudaError_t launched = cudaSuccess;
    with_float_storages(
        [&](auto dy_s, auto x_s) {
          launched = launch_one_pass<decltype(dy_s), decltype(x_s)>(
              dy, x, gamma, gt, mean, rstd, dx, dxt, rows, n, add_into_dx, blocks, shared, partial,
              partial2, stream);
        },
        dyt, xt);
    if (launched != cudaSuccess) return launched;
    // No rows: no partial row, so the sums are zero (or left as they are when accumulating).
    launch_column_finish(partial, partial2, blocks, n, dgamma, dbeta, accumulate, stream);
    return cudaGetLastError();
  }
  // Column sums first: dx may alias dy.
  if (route == BackwardRoute::column_sums_then_rows)
    launch_column_sums(dy, dyt, x, xt, mean, rstd, rows, n, dgamma, dbeta, accumulate, partial,
                       stream);
  if (rows > 0)
    with_float_storages(
        [&](auto dy_s, auto x_s) {
          using DY = decltype(dy_s);
          using X = decltype(x_s);
          layernorm_backward_kernel<DY, X><<<warp_row_blocks(rows), kThreads, 0, stream>>>(
              static_cast<const typename DY::T*>(dy), static_cast<const typename X::T*>(x), gamma,
              gt, mean, rstd, dx, dxt, rows, n, add_into_dx);
        },
        dyt, xt);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
