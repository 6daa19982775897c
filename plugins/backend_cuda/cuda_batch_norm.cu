// Batch norm over channels-last [rows, C] (launchers in cuda_batch_norm.h).
//
// Statistics: one pass over x. Block (32 channels) x (8 row lanes), grid (channel tiles) x (row
// splits, a function of rows only); each thread sums d = x - x[0, c] and d² in double over its
// rows, the block folds its 8 lanes in order, and one lane per channel folds the splits in
// order (split_sums, cuda_device.cuh: a block per 32 channels stages them in shared memory):
// mean = x0 + Σd/n, var = (Σd² - (Σd)²/n)/n. The shift by the channel's first value keeps the
// one-pass variance free of cancellation for data far from zero (it cancels only against
// (mean - x0)², of the order of the variance). Bit-reproducible: no atomics, fixed orders.
// The backward's sums Σg and Σg·(x - mean) use the same partition, in double from the stored
// values on (the difference too), so a channel whose sums cancel keeps its digits
// (docs/model-graph.md, batch norm). Per element (normalise, affine, the optional residual add,
// ReLU, the backward's dx) is cuda_element_math.h's batch-norm section, operation for operation
// the CPU backend's (including its fused multiply-adds).
#include <algorithm>

#include "cuda_batch_norm.h"
#include "cuda_channel_walk.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

constexpr int kTileC = 32, kLanes = 8;
// Rows a statistics thread loads before it adds them: at C = 64 the split grid is under a wave
// (512 blocks of 256), so each thread needs many loads in flight: 4 left about 8 KB in flight per
// SM, half the ~16 KB that covers HBM's latency at full bandwidth (an estimate, not measured).
constexpr int kUnroll = 16;

int bn_splits(std::int64_t rows) {
  const std::int64_t s = (rows + 255) / 256;
  return static_cast<int>(std::min<std::int64_t>(std::max<std::int64_t>(s, 1), 256));
}

// Folds the block's 8 lanes of (a, b) per channel in lane order; lane 0 writes the split's sums.
__device__ __forceinline__ void fold_lanes(double a, double b, double* out_a, double* out_b,
                                           bool valid) {
  __shared__ double sa[kLanes][kTileC], sb[kLanes][kTileC];
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || !valid) return;
  double ta = 0.0, tb = 0.0;
  for (int l = 0; l < kLanes; ++l) {
    ta += sa[l][threadIdx.x];
    tb += sb[l][threadIdx.x];
  }
  *out_a = ta;
  *out_b = tb;
}

// partial[(split * 2 + 0) * C + c] = Σ (x - x0), [.. + 1] = Σ (x - x0)².
template <class S>
__global__ void __launch_bounds__(kTileC* kLanes)
    bn_moments_kernel(const elem_t<S>* x, std::int64_t rows, std::int64_t channels,
                      double* partial) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kTileC + threadIdx.x;
  const bool valid = c < channels;
  const std::int64_t per = (rows + gridDim.y - 1) / gridDim.y;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * per;
  const std::int64_t r1 = min(rows, r0 + per);
  double s1 = 0.0, s2 = 0.0;
  if (valid) {
    const double x0 = S::load(x[c]);
    std::int64_t r = r0 + threadIdx.y;
    // kUnroll rows' loads in flight before their adds, which run in the one-at-a-time order (the
    // same bits): one 2-byte load per thread at a time would leave most of HBM's bandwidth idle.
    for (; r + (kUnroll - 1) * kLanes < r1; r += kUnroll * kLanes) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = S::load(x[(r + u * kLanes) * channels + c]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const double d = static_cast<double>(v[u]) - x0;
        s1 += d;
        s2 += d * d;
      }
    }
    for (; r < r1; r += kLanes) {
      const double d = static_cast<double>(S::load(x[r * channels + c])) - x0;
      s1 += d;
      s2 += d * d;
    }
  }
  double* out = partial + static_cast<std::int64_t>(blockIdx.y) * 2 * channels;
  fold_lanes(s1, s2, out + c, out + channels + c, valid);
}

// The splits' sums per channel of partial [splits, 2, C] (Σ d then Σ d² of each split) in split
// order, with the loads of a block of kThreads per 32 channels (split_sums); the lane holding
// channel c's totals returns c, every other thread -1.
__device__ __forceinline__ std::int64_t bn_split_totals(const double* partial, int splits,
                                                        std::int64_t channels, double& s1,
                                                        double& s2) {
  const double* const sums[2] = {partial, partial + channels};
  double total[2];
  const std::int64_t c = split_sums(sums, splits, 2 * channels, channels, total);
  s1 = total[0];
  s2 = total[1];
  return c;
}

// A lane per channel (blocks of kThreads per 32 channels): statistics, running statistics, scale
// and shift.
template <class S>
__global__ void __launch_bounds__(kThreads)
    bn_finish_moments_kernel(const elem_t<S>* x, const double* partial, int splits,
                             std::int64_t rows, std::int64_t channels, const float* gamma,
                             const float* beta, float eps, float momentum, float* save_mean,
                             float* save_var, float* running_mean, float* running_var,
                             float* scale_shift) {
  double s1, s2;
  const std::int64_t c = bn_split_totals(partial, splits, channels, s1, s2);
  if (c < 0) return;
  const double n = static_cast<double>(rows);
  const double x0 = S::load(x[c]);
  // Clamped at 0 against cancellation, but a NaN (an inf or NaN in x) stays NaN, as on the CPU:
  // max() would turn it into 0 and hide it.
  const double raw_var = (s2 - s1 * s1 / n) / n;
  const double var = raw_var < 0.0 ? 0.0 : raw_var;
  const float mean_f = static_cast<float>(x0 + s1 / n);
  const float var_f = static_cast<float>(var);
  save_mean[c] = mean_f;
  save_var[c] = var_f;
  const double m = momentum;
  if (running_mean != nullptr)
    running_mean[c] = element::bn_running_mean(running_mean[c], m, mean_f);
  if (running_var != nullptr)
    running_var[c] = element::bn_running_var(running_var[c], m, n / (n - 1.0), var_f);
  const auto ss =
      element::bn_scale_shift(var_f, eps, gamma != nullptr, gamma != nullptr ? gamma[c] : 1.0f,
                              beta != nullptr ? beta[c] : 0.0f);
  scale_shift[c] = ss.scale;
  scale_shift[channels + c] = ss.shift;
}

__global__ void bn_inference_coefficients_kernel(const float* running_var, const float* gamma,
                                                 const float* beta, float eps,
                                                 std::int64_t channels, float* scale_shift) {
  // Grid-stride: grid_for caps the grid at 8192 blocks, 2,097,152 channels a round.
  for (std::int64_t c = global_thread(); c < channels; c += grid_threads()) {
    const auto ss = element::bn_scale_shift(running_var[c], eps, gamma != nullptr,
                                            gamma != nullptr ? gamma[c] : 1.0f,
                                            beta != nullptr ? beta[c] : 0.0f);
    scale_shift[c] = ss.scale;
    scale_shift[channels + c] = ss.shift;
  }
}

// Elements a thread of the element-wise passes (apply, input gradient) takes a round: their loads
// are issued together, then each element's math runs as before (the same bits).
constexpr int kElementUnroll = 4;

// y = act((x - mean)·scale + shift [+ residual]), rounded once. residual nullable; it may be y:
// the thread that writes y[i] has read residual[i] first.
template <class S>
__global__ void __launch_bounds__(kThreads)
    bn_apply_kernel(const elem_t<S>* x, const elem_t<S>* residual, elem_t<S>* y, std::int64_t n,
                    std::int64_t channels, const float* mean, const float* scale_shift, bool relu) {
  const std::int64_t stride = grid_threads();
  ChannelWalk walk(global_thread(), stride, channels);
  for (std::int64_t i0 = global_thread(); i0 < n; i0 += kElementUnroll * stride) {
    std::int64_t c[kElementUnroll];
    float xv[kElementUnroll], rv[kElementUnroll];
#pragma unroll
    for (int u = 0; u < kElementUnroll; ++u) {
      const std::int64_t i = i0 + u * stride;
      c[u] = walk.c;
      walk.advance();
      xv[u] = i < n ? S::load(x[i]) : 0.0f;
      rv[u] = residual != nullptr && i < n ? S::load(residual[i]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kElementUnroll; ++u) {
      const std::int64_t i = i0 + u * stride;
      if (i >= n) break;
      const float m = mean[c[u]], scale = scale_shift[c[u]], shift = scale_shift[channels + c[u]];
      const float v = residual != nullptr
                          ? element::bn_add_forward(xv[u], rv[u], m, scale, shift, relu)
                          : element::bn_forward(xv[u], m, scale, shift, relu);
      y[i] = S::store(v, false);
    }
  }
}

// The element-wise passes in packs of 8 elements where C % 8 == 0 and every tensor is 16-byte
// aligned: a pack is 8 consecutive channels of one row, so its x, dy, y and residual move as
// 16-byte vectors and its channels' parameters as 32-byte ones, instead of a 2-byte load and
// three or four parameter loads per element (ResNet-50 bf16 on an H200: bn_apply 5.9 ms and
// bn_grad_input 6.2 ms a step before, bench/RESULTS.md, session 57). Each element's arithmetic is
// the one-element kernels' (cuda_element_math.h), so both paths write the same bits.
constexpr int kPack = 8;

bool packs_fit(std::int64_t channels, std::initializer_list<const void*> pointers) {
  if (channels % kPack != 0) return false;
  for (const void* p : pointers)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

// The channel of pack p's first element, p walked as a grid-stride loop walks it.
__device__ __forceinline__ ChannelWalk pack_walk(std::int64_t channels) {
  return ChannelWalk(global_thread() * kPack, grid_threads() * kPack, channels);
}

// bn_apply_kernel on packs (packs_fit).
template <class S>
__global__ void __launch_bounds__(kThreads)
    bn_apply_packs_kernel(const elem_t<S>* x, const elem_t<S>* residual, elem_t<S>* y,
                          std::int64_t n, std::int64_t channels, const float* mean,
                          const float* scale_shift, bool relu) {
  using P = Pack<elem_t<S>, kPack>;
  ChannelWalk walk = pack_walk(channels);
  for (std::int64_t p = global_thread(); p < n / kPack; p += grid_threads(), walk.advance()) {
    const std::int64_t i = p * kPack, c = walk.c;
    const P xv = load_pack<kPack>(x + i);
    P rv{};
    if (residual != nullptr) rv = load_pack<kPack>(residual + i);
    const auto m = load_pack<kPack>(mean + c);
    const auto scale = load_pack<kPack>(scale_shift + c);
    const auto shift = load_pack<kPack>(scale_shift + channels + c);
    P out;
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
      const float v =
          residual != nullptr
              ? element::bn_add_forward(S::load(xv.v[j]), S::load(rv.v[j]), m.v[j], scale.v[j],
                                        shift.v[j], relu)
              : element::bn_forward(S::load(xv.v[j]), m.v[j], scale.v[j], shift.v[j], relu);
      out.v[j] = S::store(v, false);
    }
    store_pack<kPack>(y + i, out);
  }
}

template <class S>
void launch_apply(const BnForward& a, const float* mean, const float* scale_shift,
                  cudaStream_t stream) {
  const std::int64_t n = a.rows * a.channels;
  const auto* x = static_cast<const elem_t<S>*>(a.x);
  const auto* residual = static_cast<const elem_t<S>*>(a.residual);
  auto* y = static_cast<elem_t<S>*>(a.y);
  if (packs_fit(a.channels, {x, residual, y, mean, scale_shift}))
    bn_apply_packs_kernel<S><<<grid_for(n / kPack), kThreads, 0, stream>>>(
        x, residual, y, n, a.channels, mean, scale_shift, a.relu);
  else
    bn_apply_kernel<S><<<grid_for(n), kThreads, 0, stream>>>(x, residual, y, n, a.channels, mean,
                                                             scale_shift, a.relu);
}

// g: dy masked by the fused ReLU, from the element's decoded dy, x (read for mask 1) and y
// (mask 2).
__device__ __forceinline__ float bn_mask_rule(const BnBackward& a, float dy, float x, float y,
                                              std::int64_t c) {
  if (a.mask == 1)
    return element::bn_relu_mask(x, dy, a.save_mean[c], a.scale_shift[c],
                                 a.scale_shift[a.channels + c]);
  if (a.mask == 2) return y > 0.0f ? dy : 0.0f;
  return dy;
}

// bn_mask_rule on element i, loading only what the mask reads.
template <class S>
__device__ __forceinline__ float bn_masked(const BnBackward& a, const elem_t<S>* x,
                                           const elem_t<S>* dy, const elem_t<S>* y, std::int64_t i,
                                           std::int64_t c) {
  return bn_mask_rule(a, S::load(dy[i]), a.mask == 1 ? S::load(x[i]) : 0.0f,
                      a.mask == 2 ? S::load(y[i]) : 0.0f, c);
}

// partial[(split * 2 + 0) * C + c] = Σ g, [.. + 1] = Σ g·(x - mean).
template <class S>
__global__ void __launch_bounds__(kTileC* kLanes)
    bn_grad_sums_kernel(BnBackward a, double* partial) {
  const auto* x = static_cast<const elem_t<S>*>(a.x);
  const auto* dy = static_cast<const elem_t<S>*>(a.dy);
  const auto* y = static_cast<const elem_t<S>*>(a.y);
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kTileC + threadIdx.x;
  const bool valid = c < a.channels;
  const std::int64_t per = (a.rows + gridDim.y - 1) / gridDim.y;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * per;
  const std::int64_t r1 = min(a.rows, r0 + per);
  double s1 = 0.0, s2 = 0.0;
  if (valid) {
    const float m = a.save_mean[c];
    // x - mean in double too: an fp32 difference rounds each term by up to half an ulp, which a
    // channel whose Σg·(x - mean) cancels would not survive.
    const auto add = [&](float g, float xv) {
      s1 += g;
      s2 += static_cast<double>(g) * (static_cast<double>(xv) - static_cast<double>(m));
    };
    std::int64_t r = r0 + threadIdx.y;
    // As bn_moments_kernel: kUnroll rows' loads first, their adds in row order (the same bits).
    for (; r + (kUnroll - 1) * kLanes < r1; r += kUnroll * kLanes) {
      float g[kUnroll], xv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::int64_t i = (r + u * kLanes) * a.channels + c;
        g[u] = bn_masked<S>(a, x, dy, y, i, c);
        xv[u] = S::load(x[i]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) add(g[u], xv[u]);
    }
    for (; r < r1; r += kLanes) {
      const std::int64_t i = r * a.channels + c;
      add(bn_masked<S>(a, x, dy, y, i, c), S::load(x[i]));
    }
  }
  double* out = partial + static_cast<std::int64_t>(blockIdx.y) * 2 * a.channels;
  fold_lanes(s1, s2, out + c, out + a.channels + c, valid);
}

// A lane per channel, as bn_finish_moments_kernel: dx's coefficients, dgamma and dbeta.
__global__ void __launch_bounds__(kThreads)
    bn_finish_grad_kernel(const double* partial, int splits, std::int64_t rows,
                          std::int64_t channels, const float* save_var, const float* gamma,
                          float eps, float* coeff, float* dgamma, float* dbeta, bool accumulate) {
  double s1, s2;
  const std::int64_t c = bn_split_totals(partial, splits, channels, s1, s2);
  if (c < 0) return;
  const auto k = element::bn_grad_coefficients(save_var[c], eps, gamma != nullptr ? gamma[c] : 1.0f,
                                               s1, s2, static_cast<double>(rows));
  coeff[c] = k.a;
  coeff[channels + c] = k.b;
  coeff[2 * channels + c] = k.d;
  if (dgamma != nullptr) dgamma[c] = accumulate ? dgamma[c] + k.dgamma : k.dgamma;
  if (dbeta != nullptr) dbeta[c] = accumulate ? dbeta[c] + k.dbeta : k.dbeta;
}

template <class S>
__global__ void __launch_bounds__(kThreads) bn_grad_input_kernel(BnBackward a, const float* coeff) {
  const auto* x = static_cast<const elem_t<S>*>(a.x);
  const auto* dy = static_cast<const elem_t<S>*>(a.dy);
  const auto* y = static_cast<const elem_t<S>*>(a.y);
  auto* dx = static_cast<elem_t<S>*>(a.dx);
  const std::int64_t n = a.rows * a.channels, ch = a.channels, stride = grid_threads();
  ChannelWalk walk(global_thread(), stride, ch);
  for (std::int64_t i0 = global_thread(); i0 < n; i0 += kElementUnroll * stride) {
    std::int64_t c[kElementUnroll];
    float gv[kElementUnroll], xv[kElementUnroll], yv[kElementUnroll];
#pragma unroll
    for (int u = 0; u < kElementUnroll; ++u) {
      const std::int64_t i = i0 + u * stride;
      c[u] = walk.c;
      walk.advance();
      const bool in = i < n;
      gv[u] = in ? S::load(dy[i]) : 0.0f;
      xv[u] = in ? S::load(x[i]) : 0.0f;
      yv[u] = in && a.mask == 2 ? S::load(y[i]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kElementUnroll; ++u) {
      const std::int64_t i = i0 + u * stride;
      if (i >= n) break;
      const float g = bn_mask_rule(a, gv[u], xv[u], yv[u], c[u]);
      dx[i] = S::store(element::bn_grad_input(g, xv[u], a.save_mean[c[u]], coeff[c[u]],
                                              coeff[ch + c[u]], coeff[2 * ch + c[u]]),
                       false);
    }
  }
}

// bn_grad_input_kernel on packs (packs_fit), one instantiation per mask (0, 1, 2: a.mask), so
// each keeps live only what its mask reads: with the mask a run-time branch the bf16 kernel took
// 80 registers, 3 blocks of 256 an SM.
template <class S, int kMask>
__global__ void __launch_bounds__(kThreads)
    bn_grad_input_packs_kernel(BnBackward a, const float* coeff) {
  using P = Pack<elem_t<S>, kPack>;
  const auto* x = static_cast<const elem_t<S>*>(a.x);
  const auto* dy = static_cast<const elem_t<S>*>(a.dy);
  const auto* y = static_cast<const elem_t<S>*>(a.y);
  auto* dx = static_cast<elem_t<S>*>(a.dx);
  const std::int64_t ch = a.channels, packs = a.rows * ch / kPack;
  ChannelWalk walk = pack_walk(ch);
  for (std::int64_t p = global_thread(); p < packs; p += grid_threads(), walk.advance()) {
    const std::int64_t i = p * kPack, c = walk.c;
    const P dyv = load_pack<kPack>(dy + i), xv = load_pack<kPack>(x + i);
    P yv{};
    if constexpr (kMask == 2) yv = load_pack<kPack>(y + i);
    const auto mean = load_pack<kPack>(a.save_mean + c);
    Pack<float, kPack> scale{}, shift{};
    if constexpr (kMask == 1) {
      scale = load_pack<kPack>(a.scale_shift + c);
      shift = load_pack<kPack>(a.scale_shift + ch + c);
    }
    float g[kPack];
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
      const float g0 = S::load(dyv.v[j]);
      if constexpr (kMask == 1)
        g[j] = element::bn_relu_mask(S::load(xv.v[j]), g0, mean.v[j], scale.v[j], shift.v[j]);
      else if constexpr (kMask == 2)
        g[j] = S::load(yv.v[j]) > 0.0f ? g0 : 0.0f;
      else
        g[j] = g0;
    }
    const auto k0 = load_pack<kPack>(coeff + c), k1 = load_pack<kPack>(coeff + ch + c),
               k2 = load_pack<kPack>(coeff + 2 * ch + c);
    P out;
#pragma unroll
    for (int j = 0; j < kPack; ++j)
      out.v[j] = S::store(
          element::bn_grad_input(g[j], S::load(xv.v[j]), mean.v[j], k0.v[j], k1.v[j], k2.v[j]),
          false);
    store_pack<kPack>(dx + i, out);
  }
}

template <class S>
void launch_grad_input(const BnBackward& a, const float* coeff, cudaStream_t stream) {
  const std::int64_t n = a.rows * a.channels;
  if (packs_fit(a.channels, {a.x, a.dy, a.mask == 2 ? a.y : nullptr, a.dx, a.save_mean, coeff,
                             a.mask == 1 ? a.scale_shift : nullptr})) {
    const unsigned grid = grid_for(n / kPack);
    if (a.mask == 1)
      bn_grad_input_packs_kernel<S, 1><<<grid, kThreads, 0, stream>>>(a, coeff);
    else if (a.mask == 2)
      bn_grad_input_packs_kernel<S, 2><<<grid, kThreads, 0, stream>>>(a, coeff);
    else
      bn_grad_input_packs_kernel<S, 0><<<grid, kThreads, 0, stream>>>(a, coeff);
  } else
    bn_grad_input_kernel<S><<<grid_for(n), kThreads, 0, stream>>>(a, coeff);
}

__global__ void bn_sync_coefficients_kernel(const float* var, const float* gamma, float eps,
                                            const float* mean_g, const float* mean_gx_hat,
                                            std::int64_t channels, float* coeff) {
  // Grid-stride, as the inference coefficients: grid_for's cap would leave channels unset.
  for (std::int64_t c = global_thread(); c < channels; c += grid_threads()) {
    const auto k = element::bn_sync_coefficients(var[c], eps, gamma != nullptr ? gamma[c] : 1.0f,
                                                 mean_g[c], mean_gx_hat[c]);
    coeff[c] = k.a;
    coeff[channels + c] = k.b;
    coeff[2 * channels + c] = k.d;
  }
}

dim3 reduction_grid(std::int64_t rows, std::int64_t channels) {
  return dim3(static_cast<unsigned>((channels + kTileC - 1) / kTileC),
              static_cast<unsigned>(bn_splits(rows)));
}

// The per-channel mean and biased variance of x (and, given them, the running statistics and
// the affine scale and shift): the training forward's first two passes, which
// synchronized batch norm's statistics op runs alone.
template <class S>
void launch_moments(const BnForward& a, const float* gamma, const float* beta, float momentum,
                    float* mean, float* var, float* running_mean, float* running_var,
                    float* scale_shift, double* partial, cudaStream_t stream) {
  const auto* x = static_cast<const elem_t<S>*>(a.x);
  bn_moments_kernel<S><<<reduction_grid(a.rows, a.channels), dim3(kTileC, kLanes), 0, stream>>>(
      x, a.rows, a.channels, partial);
  bn_finish_moments_kernel<S><<<split_sum_blocks(a.channels), kThreads, 0, stream>>>(
      x, partial, bn_splits(a.rows), a.rows, a.channels, gamma, beta, a.eps, momentum, mean, var,
      running_mean, running_var, scale_shift);
}

// Σ g and Σ g·x̂ per channel into dbeta and dgamma (and, given gamma, the coefficients of dx):
// the fused backward's first two passes, which synchronized batch norm's reduce op runs alone.
template <class S>
void launch_grad_sums(const BnBackward& a, const float* gamma, float* coeff, float* dgamma,
                      float* dbeta, bool accumulate, double* partial, cudaStream_t stream) {
  bn_grad_sums_kernel<S>
      <<<reduction_grid(a.rows, a.channels), dim3(kTileC, kLanes), 0, stream>>>(a, partial);
  bn_finish_grad_kernel<<<split_sum_blocks(a.channels), kThreads, 0, stream>>>(
      partial, bn_splits(a.rows), a.rows, a.channels, a.save_var, gamma, a.eps, coeff, dgamma,
      dbeta, accumulate);
}

}  // namespace

std::size_t bn_partial_doubles(std::int64_t rows, std::int64_t channels) {
  return static_cast<std::size_t>(bn_splits(rows)) * 2 * static_cast<std::size_t>(channels);
}

cudaError_t bn_forward_training(const BnForward& a, float momentum, float* save_mean,
                                float* save_var, float* running_mean, float* running_var,
                                float* scale_shift, double* partial, cudaStream_t stream) {
  if (a.rows * a.channels == 0) return cudaSuccess;
  const bool ok = with_float_storage(a.t, [&](auto s) {
    using S = decltype(s);
    launch_moments<S>(a, a.gamma, a.beta, momentum, save_mean, save_var, running_mean, running_var,
                      scale_shift, partial, stream);
    launch_apply<S>(a, save_mean, scale_shift, stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t bn_forward_inference(const BnForward& a, const float* running_mean,
                                 const float* running_var, float* scale_shift,
                                 cudaStream_t stream) {
  if (a.rows * a.channels == 0) return cudaSuccess;
  const bool ok = with_float_storage(a.t, [&](auto s) {
    using S = decltype(s);
    bn_inference_coefficients_kernel<<<grid_for(a.channels), kThreads, 0, stream>>>(
        running_var, a.gamma, a.beta, a.eps, a.channels, scale_shift);
    launch_apply<S>(a, running_mean, scale_shift, stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t bn_backward(const BnBackward& a, float* dgamma, float* dbeta, bool accumulate,
                        float* coeff, double* partial, cudaStream_t stream) {
  if (a.rows * a.channels == 0) return cudaSuccess;
  const bool ok = with_float_storage(a.t, [&](auto s) {
    using S = decltype(s);
    launch_grad_sums<S>(a, a.gamma, coeff, dgamma, dbeta, accumulate, partial, stream);
    launch_grad_input<S>(a, coeff, stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t bn_statistics(const BnForward& a, float* mean, float* var, float* scale_shift,
                          double* partial, cudaStream_t stream) {
  if (a.rows * a.channels == 0) return cudaSuccess;
  const bool ok = with_float_storage(a.t, [&](auto s) {
    // The training forward's passes, without running statistics or affine parameters: the same
    // mean and variance bit for bit (its scale and shift land in scratch).
    launch_moments<decltype(s)>(a, nullptr, nullptr, 0.0f, mean, var, nullptr, nullptr, scale_shift,
                                partial, stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t bn_backward_reduce(const BnBackward& a, float* sum_g, float* sum_gx_hat, float* coeff,
                               double* partial, cudaStream_t stream) {
  if (a.rows * a.channels == 0) return cudaSuccess;
  const bool ok = with_float_storage(a.t, [&](auto s) {
    // The fused backward's passes write dbeta = Σ g and dgamma = Σ g·(x - mean)·inv: the sums.
    launch_grad_sums<decltype(s)>(a, nullptr, coeff, sum_gx_hat, sum_g, false, partial, stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t bn_backward_elementwise(const BnBackward& a, const float* mean_g,
                                    const float* mean_gx_hat, float* coeff, cudaStream_t stream) {
  if (a.rows * a.channels == 0) return cudaSuccess;
  const bool ok = with_float_storage(a.t, [&](auto s) {
    using S = decltype(s);
    bn_sync_coefficients_kernel<<<grid_for(a.channels), kThreads, 0, stream>>>(
        a.save_var, a.gamma, a.eps, mean_g, mean_gx_hat, a.channels, coeff);
    launch_grad_input<S>(a, coeff, stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
