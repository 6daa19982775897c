// The attention facet's kernels: the head-layout permutes and the masked scaled softmax forward
// and backward (contract: cuda_attention.h).
#include <type_traits>

#include "cuda_attention.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

constexpr int kRowsPerBlock = kThreads / 32;  // one warp per softmax row

// One thread per moved element, in y's order (p, n, h, t, d) so consecutive threads touch
// consecutive elements of y, and of x within a row of D. x is [N, T, P, H, D] in storage XS, y is
// [P, N, H, T', D] in storage YS.
template <class XS, class YS, bool kToHeads>
__global__ void __launch_bounds__(kThreads)
    permute_kernel(const elem_t<XS>* x_in, elem_t<XS>* x_out, const elem_t<YS>* y_in,
                   elem_t<YS>* y_out, PermuteShape s, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t d = e % s.head_dim;
    std::int64_t r = e / s.head_dim;
    const std::int64_t t = r % s.tokens;
    r /= s.tokens;
    const std::int64_t h = r % s.heads;
    r /= s.heads;
    const std::int64_t n = r % s.batch;
    const std::int64_t p = r / s.batch;
    const std::int64_t x_at = (((n * s.tokens + t) * s.parts + p) * s.heads + h) * s.head_dim + d;
    const std::int64_t y_at =
        (((p * s.batch + n) * s.heads + h) * s.capacity + s.offset + t) * s.head_dim + d;
    if constexpr (kToHeads) {
      if constexpr (std::is_same_v<XS, YS>)
        y_out[y_at] = x_in[x_at];  // same storage: the bits move
      else
        y_out[y_at] = YS::store(XS::load(x_in[x_at]), false);
    } else {
      if constexpr (std::is_same_v<XS, YS>)
        x_out[x_at] = y_in[y_at];
      else
        x_out[x_at] = XS::store(YS::load(y_in[y_at]), false);
    }
  }
}

// scores, probs: [batch * rows, cols] fp32; one warp per row q (query q % rows of its matrix).
__global__ void __launch_bounds__(kThreads)
    softmax_forward_kernel(const float* scores, float* probs, std::int64_t batch_rows,
                           std::int64_t rows, std::int64_t cols, bool causal, float scale) {
  const std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (q >= batch_rows) return;  // the whole warp: the shuffles below see all 32 lanes
  const int lane = threadIdx.x & 31;
  const float* s = scores + q * cols;  // [cols]
  float* p = probs + q * cols;         // [cols], may be s
  const std::int64_t visible = element::softmax_visible(rows, cols, q % rows, causal);
  float m = element::float_of(0xFF800000u);  // -inf
  for (std::int64_t j = lane; j < visible; j += 32) m = element::softmax_max(m, scale * s[j]);
  for (int o = 16; o > 0; o >>= 1) m = element::softmax_max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  // Each lane writes e^z over its own scores (read first): no other lane reads them.
  double sum = 0.0;
  for (std::int64_t j = lane; j < visible; j += 32) {
    const float e = element::exp_nonpos(element::softmax_shifted(s[j], scale, m));
    p[j] = e;
    sum += static_cast<double>(e);
  }
  sum = warp_sum(sum);
  for (std::int64_t j = lane; j < visible; j += 32) p[j] = element::softmax_normalise(p[j], sum);
  for (std::int64_t j = visible + lane; j < cols; j += 32) p[j] = 0.0f;
}

// probs, dprobs, dscores: [batch * rows, cols] fp32; one warp per row. dscores may be dprobs:
// each lane rewrites only the entries it read, after the warp's dot product.
__global__ void __launch_bounds__(kThreads)
    softmax_backward_kernel(const float* probs, const float* dprobs, float* dscores,
                            std::int64_t batch_rows, std::int64_t rows, std::int64_t cols,
                            bool causal, float scale) {
  const std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (q >= batch_rows) return;
  const int lane = threadIdx.x & 31;
  const float* p = probs + q * cols;
  const float* dp = dprobs + q * cols;
  float* ds = dscores + q * cols;
  const std::int64_t visible = element::softmax_visible(rows, cols, q % rows, causal);
  double dot = 0.0;  // the product of two floats is exact in double, as in the CPU's sum
  for (std::int64_t j = lane; j < visible; j += 32)
    dot += static_cast<double>(dp[j]) * static_cast<double>(p[j]);
  dot = warp_sum(dot);
  for (std::int64_t j = lane; j < visible; j += 32)
    ds[j] = element::softmax_grad(p[j], dp[j], dot, scale);
  for (std::int64_t j = visible + lane; j < cols; j += 32) ds[j] = 0.0f;
}

unsigned row_blocks(std::int64_t batch_rows) {
  return static_cast<unsigned>((batch_rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

constexpr int kDecodeThreads = 128;  // threads per (head, query) block of flash_decode

// Block reduction of one float per thread (blockDim.x == kDecodeThreads) in a fixed tree order;
// `max` or sum. Every thread gets the result.
template <bool kMax>
__device__ float decode_reduce(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int w = kDecodeThreads / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) {
      const float o = red[threadIdx.x + w];
      red[threadIdx.x] = kMax ? element::softmax_max(red[threadIdx.x], o) : red[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();  // red is reused by the next call
  return r;
}

// One block per (query i, head h) of a decode step over the cache [3, 1, H, cap, D] (q at row
// start + i, keys and values at rows [0, start + i]). Keys go by tiles of kDecodeThreads: thread
// t scores key j0 + t (q·k in FP32, q in shared memory); the tile's max moves the running max M
// and rescales the running sum L and the output accumulator o [D] (shared, one dimension per
// thread), p_j = exp(s_j − M) in FP32, then o[c] += Σ_j p_j·v[j, c] over the tile in key order.
// out [1, rows, H, D] = o / L, rounded once. Fixed orders throughout: deterministic.
__global__ void __launch_bounds__(kDecodeThreads)
    flash_decode_kernel(const void* cache, Elem ct, std::int64_t heads, std::int64_t cap,
                        std::int64_t d, std::int64_t start, float scale, void* out, Elem ot) {
  extern __shared__ float sh[];  // q [d], o [d], p [kDecodeThreads], red [kDecodeThreads]
  float* q = sh;
  float* o = q + d;
  float* p = o + d;
  float* red = p + kDecodeThreads;
  const std::int64_t i = blockIdx.x, h = blockIdx.y;
  const std::int64_t part = heads * cap * d;
  const std::int64_t q_at = (h * cap + start + i) * d;
  const std::int64_t k_at = part + h * cap * d, v_at = 2 * part + h * cap * d;
  for (std::int64_t c = threadIdx.x; c < d; c += kDecodeThreads) {
    q[c] = load(cache, ct, q_at + c);
    o[c] = 0.0f;
  }
  __syncthreads();
  const std::int64_t keys = start + i + 1;
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t j0 = 0; j0 < keys; j0 += kDecodeThreads) {
    const std::int64_t j = j0 + threadIdx.x;
    float s = -INFINITY;
    if (j < keys) {
      float dot = 0.0f;
      for (std::int64_t c = 0; c < d; ++c) dot += q[c] * load(cache, ct, k_at + j * d + c);
      s = scale * dot;
    }
    const float top = element::softmax_max(m, decode_reduce<true>(s, red));
    // While every score so far is −inf (an infinite key) nothing is summed; m − top would be NaN
    // there, which no later finite tile could undo (the CPU's tiles do the same). At the first
    // finite tile the shrink is exp(−inf) = 0.
    const bool none = top == -INFINITY;
    const float shrink = none ? 1.0f : element::exp_nonpos(m - top);
    const float e = j < keys && !none ? element::exp_nonpos(s - top) : 0.0f;
    p[threadIdx.x] = e;
    l = l * shrink + decode_reduce<false>(e, red);
    m = top;
    const std::int64_t tile = min(static_cast<std::int64_t>(kDecodeThreads), keys - j0);
    for (std::int64_t c = threadIdx.x; c < d; c += kDecodeThreads) {
      float acc = o[c] * shrink;
      for (std::int64_t u = 0; u < tile; ++u)
        acc += p[u] * load(cache, ct, v_at + (j0 + u) * d + c);
      o[c] = acc;
    }
    __syncthreads();  // p is rewritten by the next tile
  }
  for (std::int64_t c = threadIdx.x; c < d; c += kDecodeThreads)
    store(out, ot, (i * heads + h) * d + c, o[c] / l);
}

}  // namespace

cudaError_t head_permute(const void* x, Elem xt, void* y, Elem yt, const PermuteShape& s,
                         bool to_heads, cudaStream_t stream) {
  const std::int64_t total = s.parts * s.batch * s.heads * s.tokens * s.head_dim;
  if (total == 0) return cudaSuccess;
  bool known = false;
  with_float_storage(xt, [&](auto xs) {
    known = with_float_storage(yt, [&](auto ys) {
      using XS = decltype(xs);
      using YS = decltype(ys);
      using XT = elem_t<XS>;
      using YT = elem_t<YS>;
      if (to_heads)
        permute_kernel<XS, YS, true><<<grid_for(total), kThreads, 0, stream>>>(
            static_cast<const XT*>(x), nullptr, nullptr, static_cast<YT*>(y), s, total);
      else
        permute_kernel<XS, YS, false><<<grid_for(total), kThreads, 0, stream>>>(
            nullptr, static_cast<XT*>(const_cast<void*>(x)), static_cast<const YT*>(y), nullptr, s,
            total);
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t softmax_forward(const float* scores, float* probs, std::int64_t batch,
                            std::int64_t rows, std::int64_t cols, bool causal, float scale,
                            cudaStream_t stream) {
  const std::int64_t batch_rows = batch * rows;
  if (batch_rows == 0 || cols == 0) return cudaSuccess;
  softmax_forward_kernel<<<row_blocks(batch_rows), kThreads, 0, stream>>>(
      scores, probs, batch_rows, rows, cols, causal, scale);
  return cudaGetLastError();
}

cudaError_t softmax_backward(const float* probs, const float* dprobs, float* dscores,
                             std::int64_t batch, std::int64_t rows, std::int64_t cols, bool causal,
                             float scale, cudaStream_t stream) {
  const std::int64_t batch_rows = batch * rows;
  if (batch_rows == 0 || cols == 0) return cudaSuccess;
  softmax_backward_kernel<<<row_blocks(batch_rows), kThreads, 0, stream>>>(
      probs, dprobs, dscores, batch_rows, rows, cols, causal, scale);
  return cudaGetLastError();
}

cudaError_t flash_decode(const void* cache, Elem ct, std::int64_t heads, std::int64_t cap,
                         std::int64_t d, std::int64_t start, std::int64_t rows, float scale,
                         void* out, Elem ot, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const std::size_t shared = (2 * static_cast<std::size_t>(d) + 2 * kDecodeThreads) * sizeof(float);
  if (shared > 48 * 1024) {
    const cudaError_t set = cudaFuncSetAttribute(
        flash_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (set != cudaSuccess) return set;
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads));
  flash_decode_kernel<<<grid, kDecodeThreads, shared, stream>>>(cache, ct, heads, cap, d, start,
                                                                scale, out, ot);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
