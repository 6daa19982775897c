// Pooling (max, average) forward and backward over channels-last [N, H, W, C], and the
// channels-first <-> channels-last permutes (launchers in cuda_convolution.h).
//
// Forward: one thread per output element (channels innermost: coalesced), the window scanned row
// by row (kh outer, kw inner) over its in-image elements; max keeps the first maximum (a later
// element replaces it only when strictly greater: PyTorch's and oneDNN's tie rule, or when it is
// a NaN: PyTorch's NaN rule, so a window holding a NaN gives NaN, its argmax the last NaN; an all
// -inf window gives -inf, its argmax the first element) and can leave its window-relative index
// for the backward; average sums in fp32 in that order and divides
// once (element::pool_average). Backward: one thread per input element gathers dy of every
// window that contains it, in window order (oh, then ow), so no atomics and a fixed summation
// order; max routes only from windows whose argmax is this element (read from the forward's
// indices or recomputed from x with the same scan). Index math in 32 bits where every index fits
// (pool_index_fits): each element decomposes its index with several divisions.
#include <algorithm>

#include "cuda_convolution.h"
#include "cuda_device.cuh"
#include "cuda_pool_windows.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

// The first maximum of window (n, oh, ow, c) as kh*KW + kw, and its value; the last NaN if any.
// I is the index type (pool_index_fits: 32-bit where every index fits, its division being a few
// times cheaper than 64-bit's).
template <class S, class I>
__device__ __forceinline__ int window_argmax(const PoolShape& p, const elem_t<S>* x, I n, I oh,
                                             I ow, I c, float* value) {
  const I H = static_cast<I>(p.h), W = static_cast<I>(p.w), C = static_cast<I>(p.c);
  const I h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
  int best = -1;
  float bv = 0.0f;
  for (int i = 0; i < p.kh; ++i) {
    const I h = h0 + i;
    if (h < 0 || h >= H) continue;
    for (int j = 0; j < p.kw; ++j) {
      const I w = w0 + j;
      if (w < 0 || w >= W) continue;
      const float v = S::load(x[((n * H + h) * W + w) * C + c]);
      if (best < 0 || v > bv || v != v) {
        best = i * p.kw + j;
        bv = v;
      }
    }
  }
  // A NaN window gives the canonical quiet NaN, as the CPU backend writes (cpu_max_pool.h):
  // not the window's last NaN with its sign and payload.
  *value = bv == bv ? bv : __int_as_float(0x7FC00000);
  return best;
}

// The average's divisor for window (oh, ow).
template <class I>
__device__ __forceinline__ int window_count(const PoolShape& p, I oh, I ow) {
  if (p.include_pad) return p.kh * p.kw;
  const I H = static_cast<I>(p.h), W = static_cast<I>(p.w);
  const I h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
  const I hs = h0 > 0 ? h0 : 0, he = h0 + p.kh < H ? h0 + p.kh : H;
  const I ws = w0 > 0 ? w0 : 0, we = w0 + p.kw < W ? w0 + p.kw : W;
  return static_cast<int>((he - hs) * (we - ws));
}

// A (the argmax's element, pool_argmax_in_bytes): std::uint8_t or std::int32_t; a window with no
// element (-1) is stored as 255 in a byte, which no position of a window of at most 255 equals.
template <class S, class I, class A>
__global__ void __launch_bounds__(kThreads)
    pool_forward_kernel(PoolShape p, const elem_t<S>* x, elem_t<S>* y, A* argmax) {
  const I H = static_cast<I>(p.h), W = static_cast<I>(p.w), C = static_cast<I>(p.c);
  const I OH = static_cast<I>(p.oh), OW = static_cast<I>(p.ow);
  const std::int64_t total = p.n * p.oh * p.ow * p.c;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const I i = static_cast<I>(e);
    const I c = i % C, ow = i / C % OW, oh = i / (C * OW) % OH;
    const I n = i / (C * OW * OH);
    if (p.max) {
      float v = 0.0f;
      const int k = window_argmax<S, I>(p, x, n, oh, ow, c, &v);
      y[i] = S::store(v, false);
      if (argmax != nullptr) argmax[i] = static_cast<A>(k);
      continue;
    }
    const I h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
    float sum = 0.0f;
    for (int a = 0; a < p.kh; ++a) {
      const I h = h0 + a;
      if (h < 0 || h >= H) continue;
      for (int b = 0; b < p.kw; ++b) {
        const I w = w0 + b;
        if (w < 0 || w >= W) continue;
        sum += S::load(x[((n * H + h) * W + w) * C + c]);
      }
    }
    y[i] = S::store(element::pool_average(sum, window_count<I>(p, oh, ow)), false);
  }
}

// D: dy's storage, S: x's and dx's (D is S, or fp32: a gradient summed over several readers,
// rounded once into dx here instead of cast first).
template <class D, class S, class I, class A>
__global__ void __launch_bounds__(kThreads)
    pool_backward_kernel(PoolShape p, const elem_t<D>* dy, const elem_t<S>* x, const A* argmax,
                         elem_t<S>* dx) {
  const I H = static_cast<I>(p.h), W = static_cast<I>(p.w), C = static_cast<I>(p.c);
  const I OH = static_cast<I>(p.oh), OW = static_cast<I>(p.ow);
  const std::int64_t total = p.n * p.h * p.w * p.c;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const I i = static_cast<I>(e);
    const I c = i % C, w = i / C % W, h = i / (C * W) % H;
    const I n = i / (C * W * H);
    I oh0, oh1, ow0, ow1;
    pool_windows_of<I>(h, p.ph, p.kh, p.sh, OH, &oh0, &oh1);
    pool_windows_of<I>(w, p.pw, p.kw, p.sw, OW, &ow0, &ow1);
    float sum = 0.0f;
    for (I oh = oh0; oh <= oh1; ++oh)
      for (I ow = ow0; ow <= ow1; ++ow) {
        const I o = ((n * OH + oh) * OW + ow) * C + c;
        const float g = D::load(dy[o]);
        if (p.max) {
          const int here =
              static_cast<int>((h - (oh * p.sh - p.ph)) * p.kw + (w - (ow * p.sw - p.pw)));
          float unused = 0.0f;
          const int k = argmax != nullptr ? static_cast<int>(argmax[o])
                                          : window_argmax<S, I>(p, x, n, oh, ow, c, &unused);
          if (k == here) sum += g;
        } else {
          sum += element::pool_average(g, window_count<I>(p, oh, ow));
        }
      }
    dx[i] = S::store(sum, false);
  }
}

// pool_backward_kernel on packs of 8 channels of one pixel (C % 8 == 0, dy, dx and argmax 16-byte
// aligned, argmax given): the pixel's windows are found once for its 8 channels, not once per
// element with four divisions each, and dy, argmax and dx move as vectors. Each element sums the
// same terms in the same order (oh, then ow, ascending) as the one-element kernel: the same bits.
// ResNet-50's max-pool backward took 1.5 ms a step on an H200 in the one-element kernel (session
// 57), PyTorch's 0.9.
constexpr int kPoolPack = 8;

// The argmax of 8 consecutive outputs: one 8-byte load of bytes, or two 16-byte ones of int32.
__device__ __forceinline__ void load_argmax8(const std::uint8_t* a, int (&k)[kPoolPack]) {
  const uint2 w = *reinterpret_cast<const uint2*>(a);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    k[j] = static_cast<int>((w.x >> (8 * j)) & 0xFFu);
    k[j + 4] = static_cast<int>((w.y >> (8 * j)) & 0xFFu);
  }
}
__device__ __forceinline__ void load_argmax8(const std::int32_t* a, int (&k)[kPoolPack]) {
  const auto w = load_pack<kPoolPack>(a);
#pragma unroll
  for (int j = 0; j < kPoolPack; ++j) k[j] = w.v[j];
}

template <class D, class S, class I, class A>
__global__ void __launch_bounds__(kThreads)
    pool_backward_packs_kernel(PoolShape p, const elem_t<D>* dy, const A* argmax, elem_t<S>* dx) {
  const I H = static_cast<I>(p.h), W = static_cast<I>(p.w), C = static_cast<I>(p.c);
  const I OH = static_cast<I>(p.oh), OW = static_cast<I>(p.ow);
  const I packs_per_pixel = C / kPoolPack;
  const std::int64_t total = p.n * p.h * p.w * (p.c / kPoolPack);
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const I q = static_cast<I>(e / packs_per_pixel);
    const I c0 = static_cast<I>(e - static_cast<std::int64_t>(q) * packs_per_pixel) * kPoolPack;
    const I w = q % W, h = q / W % H, n = q / (W * H);
    I oh0, oh1, ow0, ow1;
    pool_windows_of<I>(h, p.ph, p.kh, p.sh, OH, &oh0, &oh1);
    pool_windows_of<I>(w, p.pw, p.kw, p.sw, OW, &ow0, &ow1);
    float sum[kPoolPack] = {};
    for (I oh = oh0; oh <= oh1; ++oh)
      for (I ow = ow0; ow <= ow1; ++ow) {
        const I o = ((n * OH + oh) * OW + ow) * C + c0;
        const auto g = load_pack<kPoolPack>(dy + o);
        if (p.max) {
          const int here =
              static_cast<int>((h - (oh * p.sh - p.ph)) * p.kw + (w - (ow * p.sw - p.pw)));
          int k[kPoolPack];
          load_argmax8(argmax + o, k);
#pragma unroll
          for (int j = 0; j < kPoolPack; ++j)
            if (k[j] == here) sum[j] += D::load(g.v[j]);
        } else {
          const int count = window_count<I>(p, oh, ow);
#pragma unroll
          for (int j = 0; j < kPoolPack; ++j)
            sum[j] += element::pool_average(D::load(g.v[j]), count);
        }
      }
    Pack<elem_t<S>, kPoolPack> out;
#pragma unroll
    for (int j = 0; j < kPoolPack; ++j) out.v[j] = S::store(sum[j], false);
    store_pack<kPoolPack>(dx + static_cast<std::int64_t>(q) * C + c0, out);
  }
}

// Tiles of 32 x 32 through shared memory (as fp32: decoded on load, encoded once on store);
// blockIdx.z walks images, blockIdx.y row tiles (both strided past the grid's limits).
template <class Src, class Dst>
__global__ void permute_kernel(const elem_t<Src>* src, elem_t<Dst>* dst, std::int64_t images,
                               std::int64_t rows, std::int64_t cols) {
  __shared__ float tile[32][33];
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  for (std::int64_t img = blockIdx.z; img < images; img += gridDim.z) {
    const elem_t<Src>* s = src + img * rows * cols;
    elem_t<Dst>* d = dst + img * rows * cols;
    for (std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 32; r0 < rows;
         r0 += static_cast<std::int64_t>(gridDim.y) * 32) {
      for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const std::int64_t r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[k][threadIdx.x] = Src::load(s[r * cols + c]);
      }
      __syncthreads();
      for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const std::int64_t c = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && c < cols) d[c * rows + r] = Dst::store(tile[threadIdx.x][k], false);
      }
      __syncthreads();
    }
  }
}

// A matrix with a short side (an RGB image's 3 channels): the tiles above would leave most of
// their threads idle, so one thread per element of the long side moves its whole short line.
// src is [images, rows, cols]; dst [images, cols, rows]. Each element converted once, as above.
template <class Src, class Dst>
__global__ void __launch_bounds__(kThreads)
    permute_short_side_kernel(const elem_t<Src>* src, elem_t<Dst>* dst, std::int64_t images,
                              std::int64_t rows, std::int64_t cols) {
  const bool short_rows = rows <= cols;
  const std::int64_t long_side = short_rows ? cols : rows, short_side = short_rows ? rows : cols;
  const std::int64_t total = images * long_side;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t img = e / long_side, at = e % long_side;
    const elem_t<Src>* s = src + img * rows * cols;
    elem_t<Dst>* d = dst + img * rows * cols;
    // Short rows: column `at` of src (reads coalesced across the warp's columns) becomes row `at`
    // of dst. Short columns: row `at` of src becomes column `at` of dst.
    for (std::int64_t k = 0; k < short_side; ++k) {
      if (short_rows)
        d[at * rows + k] = Dst::store(Src::load(s[k * cols + at]), false);
      else
        d[k * rows + at] = Dst::store(Src::load(s[at * cols + k]), false);
    }
  }
}

}  // namespace

bool pool_index_fits(const PoolShape& p) {
  // Every index the kernels form is below the larger tensor's element count, and every partial
  // product ((n * H + h) * W + w) is below its row's start: both under 2^31 - 1 (with the window's
  // reach past the edge, at most a kernel's height and width, as margin). The stride is not in
  // the bound: the one sum it enters, a window's first output (pool_windows_of), is formed without
  // it.
  constexpr std::int64_t kLimit = 0x7FFFFFFF;
  const std::int64_t in = p.n * (p.h + p.kh) * (p.w + p.kw) * p.c;
  const std::int64_t out = p.n * (p.oh + p.kh) * (p.ow + p.kw) * p.c;
  return in < kLimit && out < kLimit;
}

namespace {

// f(A{}) with A the argmax element of p (pool_argmax_in_bytes).
template <class F>
void with_argmax_type(const PoolShape& p, F&& f) {
  if (pool_argmax_in_bytes(p.kh, p.kw))
    f(std::uint8_t{});
  else
    f(std::int32_t{});
}

}  // namespace

cudaError_t pool_forward(const PoolShape& p, const void* x, Elem t, void* y, void* argmax,
                         cudaStream_t stream) {
  const std::int64_t total = p.n * p.oh * p.ow * p.c;
  if (total == 0) return cudaSuccess;
  const bool ok = with_float_storage(t, [&](auto s) {
    using S = decltype(s);
    with_argmax_type(p, [&](auto a) {
      using A = decltype(a);
      auto* am = static_cast<A*>(argmax);
      if (pool_index_fits(p))
        pool_forward_kernel<S, std::int32_t, A><<<grid_for(total), kThreads, 0, stream>>>(
            p, static_cast<const elem_t<S>*>(x), static_cast<elem_t<S>*>(y), am);
      else
        pool_forward_kernel<S, std::int64_t, A><<<grid_for(total), kThreads, 0, stream>>>(
            p, static_cast<const elem_t<S>*>(x), static_cast<elem_t<S>*>(y), am);
    });
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t pool_backward(const PoolShape& p, const void* dy, Elem dyt, const void* x,
                          const void* argmax, void* dx, Elem t, cudaStream_t stream) {
  const std::int64_t total = p.n * p.h * p.w * p.c;
  if (total == 0) return cudaSuccess;
  if (dyt != t && dyt != Elem::f32) return cudaErrorInvalidValue;
  // The packs' argmax loads are 8 bytes (one-byte elements) or 32 (int32): 16-byte aligned covers
  // both, the workspace's base being aligned and every pack starting at a multiple of 8 elements.
  const bool packs = p.c % kPoolPack == 0 && aligned16(dy) && aligned16(dx) &&
                     (!p.max || (argmax != nullptr && aligned16(argmax)));
  const bool ok = with_float_storage(t, [&](auto s) {
    using S = decltype(s);
    const auto run = [&](auto d) {
      using D = decltype(d);
      const auto* g = static_cast<const elem_t<D>*>(dy);
      with_argmax_type(p, [&](auto a) {
        using A = decltype(a);
        const auto* am = static_cast<const A*>(argmax);
        if (packs) {
          const unsigned grid = grid_for(total / kPoolPack);
          if (pool_index_fits(p))
            pool_backward_packs_kernel<D, S, std::int32_t, A>
                <<<grid, kThreads, 0, stream>>>(p, g, am, static_cast<elem_t<S>*>(dx));
          else
            pool_backward_packs_kernel<D, S, std::int64_t, A>
                <<<grid, kThreads, 0, stream>>>(p, g, am, static_cast<elem_t<S>*>(dx));
          return;
        }
        if (pool_index_fits(p))
          pool_backward_kernel<D, S, std::int32_t, A><<<grid_for(total), kThreads, 0, stream>>>(
              p, g, static_cast<const elem_t<S>*>(x), am, static_cast<elem_t<S>*>(dx));
        else
          pool_backward_kernel<D, S, std::int64_t, A><<<grid_for(total), kThreads, 0, stream>>>(
              p, g, static_cast<const elem_t<S>*>(x), am, static_cast<elem_t<S>*>(dx));
      });
    };
    if (dyt == t)
      run(s);
    else
      run(storage::F32{});
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t permute_images(const void* src, Elem st, void* dst, Elem dt, std::int64_t images,
                           std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  if (images * rows * cols == 0) return cudaSuccess;
  if (std::min(rows, cols) <= kShortSide) {
    bool ok = false;
    with_float_storage(st, [&](auto s) {
      using Src = decltype(s);
      ok = with_float_storage(dt, [&](auto d) {
        using Dst = decltype(d);
        permute_short_side_kernel<Src, Dst>
            <<<grid_for(images * std::max(rows, cols)), kThreads, 0, stream>>>(
                static_cast<const elem_t<Src>*>(src), static_cast<elem_t<Dst>*>(dst), images, rows,
                cols);
      });
    });
    return ok ? cudaGetLastError() : cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32),
                  static_cast<unsigned>(std::min<std::int64_t>((rows + 31) / 32, 65535)),
                  static_cast<unsigned>(std::min<std::int64_t>(images, 65535)));
  if ((cols + 31) / 32 > 0x7FFFFFFF) return cudaErrorInvalidValue;
  bool ok = false;
  with_float_storage(st, [&](auto s) {
    using Src = decltype(s);
    ok = with_float_storage(dt, [&](auto d) {
      using Dst = decltype(d);
      permute_kernel<Src, Dst><<<grid, dim3(32, 8), 0, stream>>>(
          static_cast<const elem_t<Src>*>(src), static_cast<elem_t<Dst>*>(dst), images, rows, cols);
    });
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
