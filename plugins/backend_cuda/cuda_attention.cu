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

}  // namespace mixtrain::backend_cuda::kernels
