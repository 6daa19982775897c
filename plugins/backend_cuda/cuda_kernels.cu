// CUDA kernels for casts, element-wise ops and the layer kernels (bias, activations, layernorm,
// softmax cross-entropy). Math in fp32 (row statistics in double, as the CPU reference); storage per
// tensor as the SDK allows (fp32/bf16/fp16, fp8 for casts), decoded and encoded by
// cuda_element_math.h, which follows sdk/float_formats.h bit for bit and is tested on the host.
//
// Element-wise kernels are templates over the storage types, chosen once at launch; when every
// pointer is 16-byte aligned they move 16-byte packs (4 x fp32, 8 x bf16/fp16, 16 x fp8) and finish
// the n % V tail element by element, otherwise they go element by element throughout; both paths
// compute the same function per element. Row kernels use one warp per row; column reductions use a
// fixed split of the rows and a fixed summation order, so results are reproducible run to run.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

// --- casts and element-wise ------------------------------------------------------------------------

// dst = Dst::store(Src::load(src) * scale, saturate) (no multiply when scale is 1); amax, when
// given, folds in max |Src::load(src)|.
template <class Src, class Dst>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(const elem_t<Src>* src, elem_t<Dst>* dst, std::int64_t n, float scale,
                bool saturate, bool vectorised, float* amax) {
  constexpr int V = pack_width<elem_t<Src>, elem_t<Dst>>();
  std::uint32_t m = 0;  // max |x| as fp32 bits: non-negative floats order as integers, NaNs on top
  auto convert = [&](elem_t<Src> s) {
    const float x = Src::load(s);
    m = max(m, element::abs_bits(x));
    return Dst::store(scale != 1.0f ? x * scale : x, saturate);
  };
  for_each_element<V>(
      n, vectorised,
      [&](std::int64_t i0) {
        const Pack<elem_t<Src>, V> in = load_pack<V>(src + i0);
        Pack<elem_t<Dst>, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = convert(in.v[k]);
        store_pack<V>(dst + i0, out);
      },
      [&](std::int64_t i) { dst[i] = convert(src[i]); });
  if (amax != nullptr) fold_amax(amax, m);
}

// x = value (already encoded on the host).
template <class S>
__global__ void __launch_bounds__(kThreads)
    fill_kernel(elem_t<S>* x, std::int64_t n, elem_t<S> value, bool vectorised) {
  constexpr int V = pack_width<elem_t<S>>();
  Pack<elem_t<S>, V> p;
#pragma unroll
  for (int k = 0; k < V; ++k) p.v[k] = value;
  for_each_element<V>(
      n, vectorised, [&](std::int64_t i0) { store_pack<V>(x + i0, p); },
      [&](std::int64_t i) { x[i] = value; });
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    scale_kernel(elem_t<S>* x, std::int64_t n, float alpha, bool vectorised) {
  constexpr int V = pack_width<elem_t<S>>();
  auto scaled = [&](elem_t<S> v) { return S::store(S::load(v) * alpha, false); };
  for_each_element<V>(
      n, vectorised,
      [&](std::int64_t i0) {
        Pack<elem_t<S>, V> v = load_pack<V>(x + i0);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = scaled(v.v[k]);
        store_pack<V>(x + i0, v);
      },
      [&](std::int64_t i) { x[i] = scaled(x[i]); });
}

// y (fp32) += alpha * x.
template <class S>
__global__ void __launch_bounds__(kThreads)
    axpy_kernel(float alpha, const elem_t<S>* x, float* y, std::int64_t n, bool vectorised) {
  constexpr int V = pack_width<elem_t<S>, float>();
  for_each_element<V>(
      n, vectorised,
      [&](std::int64_t i0) {
        const Pack<elem_t<S>, V> xv = load_pack<V>(x + i0);
        Pack<float, V> yv = load_pack<V>(y + i0);
#pragma unroll
        for (int k = 0; k < V; ++k) yv.v[k] += alpha * S::load(xv.v[k]);
        store_pack<V>(y + i0, yv);
      },
      [&](std::int64_t i) { y[i] += alpha * S::load(x[i]); });
}

// y = act(x); y may be x.
template <int kAct, class X, class Y>
__global__ void __launch_bounds__(kThreads)
    act_fwd_kernel(const elem_t<X>* x, elem_t<Y>* y, std::int64_t n, bool vectorised) {
  constexpr int V = pack_width<elem_t<X>, elem_t<Y>>();
  auto f = [](elem_t<X> v) { return Y::store(element::activation<kAct>(X::load(v)), false); };
  for_each_element<V>(
      n, vectorised,
      [&](std::int64_t i0) {
        const Pack<elem_t<X>, V> in = load_pack<V>(x + i0);
        Pack<elem_t<Y>, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = f(in.v[k]);
        store_pack<V>(y + i0, out);
      },
      [&](std::int64_t i) { y[i] = f(x[i]); });
}

// dx = act'(x) * dy; dx may be dy or x.
template <int kAct, class X, class DY, class DX>
__global__ void __launch_bounds__(kThreads)
    act_bwd_kernel(const elem_t<X>* x, const elem_t<DY>* dy, elem_t<DX>* dx, std::int64_t n,
                   bool vectorised) {
  constexpr int V = pack_width<elem_t<X>, elem_t<DY>, elem_t<DX>>();
  auto f = [](elem_t<X> xv, elem_t<DY> g) {
    return DX::store(element::activation_grad<kAct>(X::load(xv), DY::load(g)), false);
  };
  for_each_element<V>(
      n, vectorised,
      [&](std::int64_t i0) {
        const Pack<elem_t<X>, V> xs = load_pack<V>(x + i0);
        const Pack<elem_t<DY>, V> gs = load_pack<V>(dy + i0);
        Pack<elem_t<DX>, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = f(xs.v[k], gs.v[k]);
        store_pack<V>(dx + i0, out);
      },
      [&](std::int64_t i) { dx[i] = f(x[i], dy[i]); });
}

// Tiles of 32 x 32; blockIdx.y strides over row tiles (gridDim.y is capped at 65535).
template <class T>
__global__ void transpose_kernel(const T* in, T* out, std::int64_t rows, std::int64_t cols) {
  __shared__ T tile[32][33];
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  for (std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 32; r0 < rows;
       r0 += static_cast<std::int64_t>(gridDim.y) * 32) {
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      const std::int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[k][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      const std::int64_t c = c0 + k, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][k];
    }
    __syncthreads();  // the tile is rewritten by the next row tile
  }
}

// --- layer kernels ------------------------------------------------------------------------------------

// y[r, :] += bias. blockIdx.y walks rows, x covers columns (packs of V when vectorised: y and
// bias 16-byte aligned and n a multiple of V, so every row starts aligned).
template <class Y, class B>
__global__ void __launch_bounds__(kThreads)
    add_bias_kernel(elem_t<Y>* y, const elem_t<B>* bias, std::int64_t rows, std::int64_t n,
                    bool vectorised) {
  constexpr int V = pack_width<elem_t<Y>, elem_t<B>>();
  auto add = [](elem_t<Y> v, elem_t<B> b) { return Y::store(Y::load(v) + B::load(b), false); };
  const std::int64_t first = global_thread(), stride = grid_threads();
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    elem_t<Y>* row = y + r * n;
    if (vectorised) {
      for (std::int64_t p = first; p < n / V; p += stride) {
        Pack<elem_t<Y>, V> v = load_pack<V>(row + p * V);
        const Pack<elem_t<B>, V> b = load_pack<V>(bias + p * V);
#pragma unroll
        for (int k = 0; k < V; ++k) v.v[k] = add(v.v[k], b.v[k]);
        store_pack<V>(row + p * V, v);
      }
    } else {
      for (std::int64_t j = first; j < n; j += stride) row[j] = add(row[j], bias[j]);
    }
  }
}

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

// One warp per row.
__global__ void layernorm_forward_kernel(const void* x, Elem xt, const void* gamma, Elem gt,
                                         const void* beta, Elem bt, float eps, void* y, Elem yt,
                                         float* mean, float* rstd, std::int64_t rows,
                                         std::int64_t n) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
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

__global__ void layernorm_backward_kernel(const void* dy, Elem dyt, const void* x, Elem xt,
                                          const void* gamma, Elem gt, const float* mean,
                                          const float* rstd, void* dx, Elem dxt, std::int64_t rows,
                                          std::int64_t n) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const std::int64_t base = row * n;
  const float mu = mean[row], rs = rstd[row];
  double sum_g = 0.0, sum_gx = 0.0;  // double, as the CPU reference
  for (std::int64_t j = lane; j < n; j += 32) {
    const float xhat = (load(x, xt, base + j) - mu) * rs;
    const float g = load(dy, dyt, base + j) * (gamma != nullptr ? load(gamma, gt, j) : 1.0f);
    sum_g += g;
    sum_gx += static_cast<double>(g) * xhat;
  }
  const float mean_g = static_cast<float>(warp_sum(sum_g) / static_cast<double>(n));
  const float mean_gx = static_cast<float>(warp_sum(sum_gx) / static_cast<double>(n));
  for (std::int64_t j = lane; j < n; j += 32) {  // dx may alias dy: each lane rewrites its own
    const float xhat = (load(x, xt, base + j) - mu) * rs;
    const float g = load(dy, dyt, base + j) * (gamma != nullptr ? load(gamma, gt, j) : 1.0f);
    store(dx, dxt, base + j, rs * (g - mean_g - xhat * mean_gx));
  }
}

__global__ void check_labels_kernel(const std::int32_t* labels, std::int64_t rows,
                                    std::int64_t classes, ErrorRecord* error) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += stride) {
    const std::int32_t y = labels[r];
    if (y < 0 || y >= classes) {
      atomicMin(&error->first, (static_cast<unsigned long long>(r) << 32) |
                                   static_cast<unsigned long long>(static_cast<std::uint32_t>(y)));
      error->flag = 1;
      error->classes = static_cast<int>(classes);
    }
  }
}

// One warp per row: max and argmax (the CPU's scan: first maximum; a NaN z[0] stays), log-sum-exp
// and the row's loss in double (sum of fp32 exponentials, as the CPU reference), dlogits.
__global__ void softmax_xent_rows_kernel(const void* logits, Elem lt, const std::int32_t* labels,
                                         float grad_factor, float eps, void* dlogits, Elem dt,
                                         std::int64_t rows, std::int64_t classes, double* row_loss,
                                         int* row_ok, const ErrorRecord* error) {
  if (error->flag != 0) return;  // a bad label: write nothing, the host raises
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const std::int64_t base = row * classes;
  float best = 0.0f;
  long long arg = -1;  // -1: no element seen yet (lanes beyond `classes`)
  for (std::int64_t j = lane; j < classes; j += 32) {
    const float z = load(logits, lt, base + j);
    // A lane's first candidate: z[0] always, else any non-NaN (NaNs past z[0] never win).
    if (arg < 0 ? (j == 0 || z == z) : element::argmax_beats(z, j, best, arg)) {
      best = z;
      arg = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {  // a total order: every lane ends with the same winner
    const float ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
    const long long oa = __shfl_xor_sync(0xFFFFFFFFu, arg, o);
    if (element::argmax_beats(ob, oa, best, arg)) {
      best = ob;
      arg = oa;
    }
  }
  // z[y] is read by every lane before warp_sum's shuffles, so no lane's dlogits write below can
  // precede it even when dlogits shares the logits' buffer.
  const std::int32_t y = labels[row];
  const float zy = load(logits, lt, base + y);
  double sum = 0.0;
  for (std::int64_t j = lane; j < classes; j += 32) sum += expf(load(logits, lt, base + j) - best);
  const double lse = static_cast<double>(best) + log(warp_sum(sum));
  // Label smoothing's term needs the row's logit sum; without smoothing the pass is skipped (eps
  // is the same for every lane, so the warp's shuffles stay uniform).
  double z_sum = 0.0;
  if (eps != 0.0f) {
    for (std::int64_t j = lane; j < classes; j += 32)
      z_sum += static_cast<double>(load(logits, lt, base + j));
    z_sum = warp_sum(z_sum);
  }
  if (lane == 0) {
    row_loss[row] = element::xent_row_loss(lse, zy, z_sum, eps, classes);
    row_ok[row] = arg == y ? 1 : 0;
  }
  __syncwarp();
  if (dlogits != nullptr) {
    const float on = element::xent_target_on(eps, classes);
    const float off = element::xent_target_off(eps, classes);
    for (std::int64_t j = lane; j < classes; j += 32) {
      const float p = static_cast<float>(exp(static_cast<double>(load(logits, lt, base + j)) - lse));
      store(dlogits, dt, base + j, element::xent_grad(p, j == y ? on : off, grad_factor));
    }
  }
}

// One block: fixed-order sums of the per-row losses (double) and correct flags.
__global__ void softmax_xent_finish_kernel(const double* row_loss, const int* row_ok,
                                           std::int64_t rows, float* loss, std::int32_t* correct,
                                           const ErrorRecord* error) {
  if (error->flag != 0) return;
  __shared__ double s_loss[kThreads];
  __shared__ long long s_ok[kThreads];
  double l = 0.0;
  long long ok = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    l += row_loss[r];
    ok += row_ok[r];
  }
  s_loss[threadIdx.x] = l;
  s_ok[threadIdx.x] = ok;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) {
      s_loss[threadIdx.x] += s_loss[threadIdx.x + w];
      s_ok[threadIdx.x] += s_ok[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    loss[0] = static_cast<float>(s_loss[0] / static_cast<double>(rows));
    if (correct != nullptr) correct[0] = static_cast<std::int32_t>(s_ok[0]);
  }
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32));
}

}  // namespace

// --- launchers ------------------------------------------------------------------------------------------

cudaError_t cast(const void* src, Elem src_t, void* dst, Elem dst_t, bool tf32_out, std::int64_t n,
                 float scale, bool saturate, float* amax, cudaStream_t stream) {
  if (n == 0 && amax == nullptr) return cudaSuccess;  // with amax: still fold in max|{}| = 0
  const bool vectorised = aligned16(src) && aligned16(dst);
  bool known = false;
  with_cast_storage(src_t, [&](auto src_tag) {
    using Src = decltype(src_tag);
    auto launch = [&](auto dst_tag) {
      using Dst = decltype(dst_tag);
      constexpr int V = pack_width<elem_t<Src>, elem_t<Dst>>();
      cast_kernel<Src, Dst><<<grid_for(vectorised ? (n + V - 1) / V : n), kThreads, 0, stream>>>(
          static_cast<const elem_t<Src>*>(src), static_cast<elem_t<Dst>*>(dst), n, scale,
          saturate, vectorised, amax);
      known = true;
    };
    if (tf32_out)
      launch(storage::Tf32{});
    else
      with_cast_storage(dst_t, launch);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t fill(void* x, Elem t, std::int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto launch = [&](auto tag) {
    using S = decltype(tag);
    constexpr int V = pack_width<elem_t<S>>();
    const bool vectorised = aligned16(x);
    fill_kernel<S><<<grid_for(vectorised ? (n + V - 1) / V : n), kThreads, 0, stream>>>(
        static_cast<elem_t<S>*>(x), n, S::store(value, false), vectorised);  // encoded once, here
  };
  if (t == Elem::i32)
    launch(storage::I32{});
  else if (!with_cast_storage(t, launch))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t scale(void* x, Elem t, std::int64_t n, float alpha, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool known = with_float_storage(t, [&](auto tag) {
    using S = decltype(tag);
    constexpr int V = pack_width<elem_t<S>>();
    const bool vectorised = aligned16(x);
    scale_kernel<S><<<grid_for(vectorised ? (n + V - 1) / V : n), kThreads, 0, stream>>>(
        static_cast<elem_t<S>*>(x), n, alpha, vectorised);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t axpy(float alpha, const void* x, Elem xt, float* y, std::int64_t n,
                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool known = with_float_storage(xt, [&](auto tag) {
    using S = decltype(tag);
    constexpr int V = pack_width<elem_t<S>, float>();
    const bool vectorised = aligned16(x) && aligned16(y);
    axpy_kernel<S><<<grid_for(vectorised ? (n + V - 1) / V : n), kThreads, 0, stream>>>(
        alpha, static_cast<const elem_t<S>*>(x), y, n, vectorised);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

namespace {

// Calls f(std::integral_constant<int, act>{}) for act 0 (relu) or 1 (gelu).
template <class F>
bool with_activation(int act, F&& f) {
  switch (act) {
    case 0: f(std::integral_constant<int, 0>{}); return true;
    case 1: f(std::integral_constant<int, 1>{}); return true;
    default: return false;
  }
}

}  // namespace

cudaError_t activation_forward(int act, const void* x, Elem xt, void* y, Elem yt, std::int64_t n,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vectorised = aligned16(x) && aligned16(y);
  bool known = false;  // set where a kernel launches: every tag was one we have
  with_activation(act, [&](auto act_tag) {
    with_float_storage(xt, [&](auto x_tag) {
      with_float_storage(yt, [&](auto y_tag) {
        using X = decltype(x_tag);
        using Y = decltype(y_tag);
        constexpr int V = pack_width<elem_t<X>, elem_t<Y>>();
        act_fwd_kernel<decltype(act_tag)::value, X, Y>
            <<<grid_for(vectorised ? (n + V - 1) / V : n), kThreads, 0, stream>>>(
                static_cast<const elem_t<X>*>(x), static_cast<elem_t<Y>*>(y), n, vectorised);
        known = true;
      });
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t activation_backward(int act, const void* x, Elem xt, const void* dy, Elem dyt,
                                void* dx, Elem dxt, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vectorised = aligned16(x) && aligned16(dy) && aligned16(dx);
  bool known = false;
  with_activation(act, [&](auto act_tag) {
    with_float_storage(xt, [&](auto x_tag) {
      with_float_storage(dyt, [&](auto dy_tag) {
        with_float_storage(dxt, [&](auto dx_tag) {
          using X = decltype(x_tag);
          using DY = decltype(dy_tag);
          using DX = decltype(dx_tag);
          constexpr int V = pack_width<elem_t<X>, elem_t<DY>, elem_t<DX>>();
          act_bwd_kernel<decltype(act_tag)::value, X, DY, DX>
              <<<grid_for(vectorised ? (n + V - 1) / V : n), kThreads, 0, stream>>>(
                  static_cast<const elem_t<X>*>(x), static_cast<const elem_t<DY>*>(dy),
                  static_cast<elem_t<DX>*>(dx), n, vectorised);
          known = true;
        });
      });
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t transpose(const void* in, void* out, std::int64_t rows, std::int64_t cols,
                      int elem_bytes, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32),
                  static_cast<unsigned>(std::min<std::int64_t>((rows + 31) / 32, 65535)));
  switch (elem_bytes) {
    case 1:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint8_t*>(in),
                                                   static_cast<std::uint8_t*>(out), rows, cols);
      break;
    case 2:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint16_t*>(in),
                                                   static_cast<std::uint16_t*>(out), rows, cols);
      break;
    default:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint32_t*>(in),
                                                   static_cast<std::uint32_t*>(out), rows, cols);
      break;
  }
  return cudaGetLastError();
}

cudaError_t add_bias(void* y, Elem yt, const void* bias, Elem bt, std::int64_t rows, std::int64_t n,
                     cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  bool known = false;
  with_float_storage(yt, [&](auto y_tag) {
    with_float_storage(bt, [&](auto b_tag) {
      using Y = decltype(y_tag);
      using B = decltype(b_tag);
      constexpr int V = pack_width<elem_t<Y>, elem_t<B>>();
      const bool vectorised = aligned16(y) && aligned16(bias) && n % V == 0;
      const std::int64_t cols = vectorised ? n / V : n;
      const unsigned gx =
          static_cast<unsigned>(std::min<std::int64_t>((cols + kThreads - 1) / kThreads, 64));
      const unsigned gy = static_cast<unsigned>(std::min<std::int64_t>(rows, 4096));
      add_bias_kernel<Y, B><<<dim3(gx, gy), kThreads, 0, stream>>>(
          static_cast<elem_t<Y>*>(y), static_cast<const elem_t<B>*>(bias), rows, n, vectorised);
      known = true;
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

std::size_t column_sum_scratch(std::int64_t rows, std::int64_t n) {
  const std::int64_t rps = rows_per_split(rows);
  const std::int64_t splits = rows == 0 ? 1 : (rows + rps - 1) / rps;
  return static_cast<std::size_t>(splits * n);
}

cudaError_t bias_grad(const void* dy, Elem dyt, float* dbias, std::int64_t rows, std::int64_t n,
                      bool accumulate, float* partial, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const std::int64_t rps = rows_per_split(rows);
  const std::int64_t splits = rows == 0 ? 0 : (rows + rps - 1) / rps;
  if (splits > 0)
    column_partial_kernel<0><<<dim3(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(splits)),
                               dim3(32, kColRows), 0, stream>>>(dy, dyt, nullptr, Elem::f32, nullptr,
                                                                nullptr, rows, n, rps, partial,
                                                                nullptr);
  column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial, splits, n, dbias, accumulate);
  return cudaGetLastError();
}

cudaError_t layernorm_forward(const void* x, Elem xt, const void* gamma, Elem gt, const void* beta,
                              Elem bt, float eps, void* y, Elem yt, float* mean, float* rstd,
                              std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  layernorm_forward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, xt, gamma, gt, beta, bt, eps,
                                                                     y, yt, mean, rstd, rows, n);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(const void* dy, Elem dyt, const void* x, Elem xt, const void* gamma,
                               Elem gt, const float* mean, const float* rstd, void* dx, Elem dxt,
                               float* dgamma, float* dbeta, bool accumulate, std::int64_t rows,
                               std::int64_t n, float* partial, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Column sums first: dx may alias dy.
  if (dgamma != nullptr || dbeta != nullptr) {
    const std::int64_t rps = rows_per_split(rows);
    const std::int64_t splits = rows == 0 ? 0 : (rows + rps - 1) / rps;
    float* partial2 = partial + column_sum_scratch(rows, n);
    if (splits > 0)
      column_partial_kernel<1><<<dim3(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(splits)),
                                 dim3(32, kColRows), 0, stream>>>(dy, dyt, x, xt, mean, rstd, rows, n,
                                                                  rps, partial, partial2);
    column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial, splits, n, dgamma,
                                                               accumulate);
    column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial2, splits, n, dbeta,
                                                               accumulate);
  }
  if (rows > 0)
    layernorm_backward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(dy, dyt, x, xt, gamma, gt,
                                                                        mean, rstd, dx, dxt, rows, n);
  return cudaGetLastError();
}

cudaError_t softmax_cross_entropy(const void* logits, Elem lt, const std::int32_t* labels,
                                  float grad_scale, float label_smoothing, float* loss,
                                  std::int32_t* correct,
                                  void* dlogits, Elem dt, std::int64_t rows, std::int64_t classes,
                                  double* row_loss, int* row_ok, ErrorRecord* error,
                                  cudaStream_t stream) {
  check_labels_kernel<<<grid_for(rows), kThreads, 0, stream>>>(labels, rows, classes, error);
  const float grad_factor = grad_scale / static_cast<float>(rows);
  softmax_xent_rows_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(
      logits, lt, labels, grad_factor, label_smoothing, dlogits, dt, rows, classes, row_loss,
      row_ok, error);
  softmax_xent_finish_kernel<<<1, kThreads, 0, stream>>>(row_loss, row_ok, rows, loss, correct,
                                                         error);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
