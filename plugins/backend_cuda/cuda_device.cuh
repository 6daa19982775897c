// Device-only helpers shared by the backend's .cu files: launch geometry, 16-byte vector packs,
// dispatch of an Elem tag to a storage type (once per launch), run-time per-element loads/stores
// for the row kernels, warp and block reductions, the in-order totals of split partial sums. The
// per-element numbers themselves live in cuda_element_math.h, which host code (and the host
// test) includes too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "cuda_element_math.h"
#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

namespace storage = element::storage;

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n work items (at least one, capped: the loop covers the rest).
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 8192) b = 8192;
  return static_cast<unsigned>(b);
}

__host__ __device__ inline bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// --- 16-byte vector packs -------------------------------------------------------------------------

// V elements of T moved as V * sizeof(T) / 16 sixteen-byte words (a whole number of them).
template <class T, int V>
struct alignas(16) Pack {
  static_assert(V * sizeof(T) % 16 == 0, "a pack is a whole number of 16-byte words");
  T v[V];
};

// Elements per pack for a kernel touching tensors of these element types: 16 bytes of the
// narrowest (4 x fp32, 8 x bf16/fp16, 16 x fp8); wider tensors move several words per pack.
template <class... Ts>
constexpr int pack_width() {
  std::size_t narrowest = 16;
  for (std::size_t s : {sizeof(Ts)...}) narrowest = s < narrowest ? s : narrowest;
  return static_cast<int>(16 / narrowest);
}

template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <int V, class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}

__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_threads() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// Grid-stride walk over elements [0, n): with `vectorised` (every pointer 16-byte aligned), packs
// of V elements go to pack(i0) and the n % V tail to one(i); otherwise every element goes to one(i).
template <int V, class PackFn, class OneFn>
__device__ __forceinline__ void for_each_element(std::int64_t n, bool vectorised, PackFn&& pack,
                                                 OneFn&& one) {
  const std::int64_t first = global_thread(), stride = grid_threads();
  std::int64_t begin = 0;
  if (vectorised) {
    const std::int64_t packs = n / V;
    for (std::int64_t p = first; p < packs; p += stride) pack(p * V);
    begin = packs * V;
  }
  for (std::int64_t i = begin + first; i < n; i += stride) one(i);
}

// --- Elem tag -> storage type, once per launch ---------------------------------------------------

// Calls f(S{}) with the storage type of t among fp32 / bf16 / fp16 (the SDK's storage dtypes);
// false (nothing called) for any other tag.
template <class F>
bool with_float_storage(Elem t, F&& f) {
  switch (t) {
    case Elem::f32: f(storage::F32{}); return true;
    case Elem::bf16: f(storage::Bf16{}); return true;
    case Elem::f16: f(storage::F16{}); return true;
    default: return false;
  }
}

// The same plus fp8 (cast's formats).
template <class F>
bool with_cast_storage(Elem t, F&& f) {
  switch (t) {
    case Elem::e4m3: f(storage::E4M3{}); return true;
    case Elem::e5m2: f(storage::E5M2{}); return true;
    default: return with_float_storage(t, std::forward<F>(f));
  }
}

template <class S>
using elem_t = typename S::T;

// --- run-time tagged access (row kernels) ----------------------------------------------------------

__device__ __forceinline__ float load(const void* p, Elem t, std::int64_t i) {
  switch (t) {
    case Elem::bf16: return storage::Bf16::load(static_cast<const std::uint16_t*>(p)[i]);
    case Elem::f16: return storage::F16::load(static_cast<const std::uint16_t*>(p)[i]);
    case Elem::e4m3: return storage::E4M3::load(static_cast<const std::uint8_t*>(p)[i]);
    case Elem::e5m2: return storage::E5M2::load(static_cast<const std::uint8_t*>(p)[i]);
    case Elem::i32: return storage::I32::load(static_cast<const std::int32_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store(void* p, Elem t, std::int64_t i, float v,
                                      bool saturate = false) {
  switch (t) {
    case Elem::bf16: static_cast<std::uint16_t*>(p)[i] = storage::Bf16::store(v, saturate); return;
    case Elem::f16: static_cast<std::uint16_t*>(p)[i] = storage::F16::store(v, saturate); return;
    case Elem::e4m3: static_cast<std::uint8_t*>(p)[i] = storage::E4M3::store(v, saturate); return;
    case Elem::e5m2: static_cast<std::uint8_t*>(p)[i] = storage::E5M2::store(v, saturate); return;
    case Elem::i32: static_cast<std::int32_t*>(p)[i] = storage::I32::store(v, saturate); return;
    default: static_cast<float*>(p)[i] = storage::F32::store(v, saturate); return;
  }
}

// 8 elements of storage S from p + i (16-byte aligned) as floats, and back, each rounded once.
template <class S>
__device__ __forceinline__ void load8_as(const void* p, std::int64_t i, float (&v)[8]) {
  const auto w = load_pack<8>(static_cast<const elem_t<S>*>(p) + i);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = S::load(w.v[j]);
}
template <class S>
__device__ __forceinline__ void store8_as(void* p, std::int64_t i, const float (&v)[8]) {
  Pack<elem_t<S>, 8> w;
#pragma unroll
  for (int j = 0; j < 8; ++j) w.v[j] = S::store(v[j], false);
  store_pack<8>(static_cast<elem_t<S>*>(p) + i, w);
}

// Elements [i, i + 8) of a tensor tagged t, as floats: one 16-byte load for a 16-bit tensor, two
// for fp32 (i a multiple of 8, the tensor 16-byte aligned); other tags element by element.
__device__ __forceinline__ void load8(const void* p, Elem t, std::int64_t i, float (&v)[8]) {
  switch (t) {
    case Elem::bf16:
      return load8_as<storage::Bf16>(p, i, v);
    case Elem::f16:
      return load8_as<storage::F16>(p, i, v);
    case Elem::f32:
      return load8_as<storage::F32>(p, i, v);
    default:
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = load(p, t, i + j);
  }
}

// load8's store: each value rounded once into t, as store() rounds it (saturate false).
__device__ __forceinline__ void store8(void* p, Elem t, std::int64_t i, const float (&v)[8]) {
  switch (t) {
    case Elem::bf16:
      return store8_as<storage::Bf16>(p, i, v);
    case Elem::f16:
      return store8_as<storage::F16>(p, i, v);
    case Elem::f32:
      return store8_as<storage::F32>(p, i, v);
    default:
#pragma unroll
      for (int j = 0; j < 8; ++j) store(p, t, i + j, v[j]);
  }
}

using element::nonfinite;

// --- reductions ------------------------------------------------------------------------------------

// Every lane ends with the same sum: each step adds the same pair of values on both partners.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// Block sum of one double per thread (blockDim.x == kThreads) in a fixed tree order; the result
// is valid in thread 0. Once per kernel: it ends without a barrier, so a second call would
// overwrite the shared sums while other threads still read them.
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  return s[0];
}

// Folds this block's max |x| bits into *amax with element::amax_combine (the CPU's rule). Every
// thread of a 1-D block of kThreads must call it, once per kernel (its shared slots are reused
// without a closing barrier).
__device__ __forceinline__ void fold_amax(float* amax, std::uint32_t m) {
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  __shared__ std::uint32_t warp_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = max(m, warp_max[w]);
  auto* slot = reinterpret_cast<unsigned*>(amax);
  // The combine is monotone, so a stale first read can only cause a retry, never a lost update.
  unsigned old = *static_cast<volatile unsigned*>(slot);
  for (;;) {
    const unsigned want = element::amax_combine(old, m);
    if (want == old) return;
    const unsigned seen = atomicCAS(slot, old, want);
    if (seen == old) return;
    old = seen;
  }
}

// Blocks of kThreads / 32 warps for one warp per row.
inline unsigned warp_row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32));
}

// --- in-order totals of per-split partial sums ------------------------------------------------
// The finish of the split column reductions (column sums, batch norm): each column's total is
// 0.0 + p[0, j] + p[1, j] + ... + p[splits - 1, j], added from the left in double, whose bits
// depend on that order. A thread per column running that loop over global memory, a few loads
// in flight at a time on a handful of blocks, waits an L2 round trip every few splits; here a
// block of kThreads takes a tile of kSplitSumColumns columns, all its threads stage chunks of the
// splits into shared memory with many loads in flight, and warp 0 (a lane per column) runs the
// same additions from there while the next chunk's loads are on their way.

constexpr int kSplitSumColumns = 32;  // a tile: one warp's lanes, and one coalesced row of loads

// Blocks of kThreads for split_sums over `columns` columns: a tile each (no grid-stride loop).
inline unsigned split_sum_blocks(std::int64_t columns) {
  const std::int64_t tiles = (columns + kSplitSumColumns - 1) / kSplitSumColumns;
  return static_cast<unsigned>(tiles < 1 ? 1 : tiles);
}

// partial[k] is [splits, row_stride] (column j < columns of split s at partial[k][s * row_stride
// + j]), for kStreams sets of partials summed side by side (independent chains, so their add
// latencies overlap). Block b's tile is the kSplitSumColumns columns from b * kSplitSumColumns.
// Returns the column whose totals this thread holds in total[k] (lane l of warp 0 holds the
// tile's column l), or -1 (another warp, or a lane past `columns`). The additions, their order and
// type are the serial loop's `double t = 0.0; for (s = 0; s < splits; ++s) t += p[s, j];`, so its
// bits (the 0.0 start included: 0.0 + -0.0 is +0.0). Every thread of a 1-D block of kThreads must
// call it; it ends on a barrier, so a kernel may call it again.
template <int kStreams, class T>
__device__ __forceinline__ std::int64_t split_sums(const T* const (&partial)[kStreams],
                                                   std::int64_t splits, std::int64_t row_stride,
                                                   std::int64_t columns,
                                                   double (&total)[kStreams]) {
  constexpr int kWarps = kThreads / 32;
  // Splits staged at a time: 32 KiB of shared memory (256 fp32 splits of one stream, 64 double
  // splits of two), 16 to 32 loads in flight per thread.
  constexpr int kChunk = 32 * 1024 / (kStreams * kSplitSumColumns * static_cast<int>(sizeof(T)));
  constexpr int kLoadsPerStream = kChunk / kWarps;
  static_assert(kChunk % kWarps == 0, "each warp loads the same number of rows per chunk");
  __shared__ T staged[kStreams][kChunk][kSplitSumColumns];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * kSplitSumColumns + lane;
  const bool in_tile = column < columns;
  // Warp w loads splits w, w + kWarps, ... of the chunk: a row of the tile per warp load.
  T loaded[kStreams][kLoadsPerStream];
  const auto load_chunk = [&](std::int64_t first) {
#pragma unroll
    for (int u = 0; u < kLoadsPerStream; ++u) {
      const std::int64_t s = first + warp + u * kWarps;
#pragma unroll
      for (int k = 0; k < kStreams; ++k)
        loaded[k][u] = in_tile && s < splits ? partial[k][s * row_stride + column] : T(0);
    }
  };
#pragma unroll
  for (int k = 0; k < kStreams; ++k) total[k] = 0.0;
  load_chunk(0);
  for (std::int64_t first = 0; first < splits; first += kChunk) {
#pragma unroll
    for (int u = 0; u < kLoadsPerStream; ++u)
#pragma unroll
      for (int k = 0; k < kStreams; ++k) staged[k][warp + u * kWarps][lane] = loaded[k][u];
    __syncthreads();
    if (first + kChunk < splits) load_chunk(first + kChunk);  // in flight during the adds
    if (warp == 0) {
      const int count = static_cast<int>(splits - first < kChunk ? splits - first : kChunk);
#pragma unroll 16
      for (int s = 0; s < count; ++s)
#pragma unroll
        for (int k = 0; k < kStreams; ++k) total[k] += static_cast<double>(staged[k][s][lane]);
    }
    __syncthreads();  // the next chunk's stores overwrite what warp 0 just read
  }
  return warp == 0 && in_tile ? column : -1;
}

// --- multi-tensor chunks ------------------------------------------------------------------------
// Within a chunk, thread t owns packs t, t + blockDim.x, ... of V elements (16 bytes of the
// narrowest tensor). A full pack of a chunk whose pointers are all 16-byte aligned moves as
// 16-byte words; otherwise its elements move one by one. The ownership, hence every per-thread sum,
// is the same either way.
template <int V, class PackFn, class OneFn>
__device__ __forceinline__ void for_chunk_packs(int len, bool vectorised, PackFn&& pack,
                                                OneFn&& one) {
  for (int i0 = static_cast<int>(threadIdx.x) * V; i0 < len;
       i0 += static_cast<int>(blockDim.x) * V) {
    if (vectorised && i0 + V <= len) {
      pack(i0);
    } else {
      const int end = min(i0 + V, len);
      for (int i = i0; i < end; ++i) one(i);
    }
  }
}

}  // namespace mixtrain::backend_cuda::kernels
