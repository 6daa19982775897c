// The gradient-check facet's multi-tensor kernels: fused unscale + finite check, sum of squares,
// first non-finite tensor. One block handles one chunk (cuda_device.cuh's for_chunk_packs), so
// many small tensors and a few huge ones share one launch; the unscale at scale 1 only reads.
#include <algorithm>

#include "cuda_device.cuh"
#include "cuda_gradient_check.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

// Calls f(S{}) with the storage type of t (fp32 for anything else, e.g. a tf32 view).
template <class F>
__device__ __forceinline__ void with_storage(Elem t, F&& f) {
  switch (t) {
    case Elem::bf16:
      f(storage::Bf16{});
      return;
    case Elem::f16:
      f(storage::F16{});
      return;
    case Elem::e4m3:
      f(storage::E4M3{});
      return;
    case Elem::e5m2:
      f(storage::E5M2{});
      return;
    default:
      f(storage::F32{});
      return;
  }
}

__global__ void __launch_bounds__(kThreads)
    unscale_kernel(const TensorRef* tensors, const Chunk* chunks, float inv_scale, int* found) {
  const Chunk c = chunks[blockIdx.x];
  float* g = static_cast<float*>(tensors[c.tensor].data) + c.begin;
  const bool vectorised = aligned16(g);
  int local = 0;
  if (inv_scale == 1.0f) {
    // No loss scale to remove: a read-only check, half the memory traffic (as the CPU backend).
    for_chunk_packs<4>(
        c.len, vectorised,
        [&](int i0) {
          const Pack<float, 4> v = load_pack<4>(g + i0);
#pragma unroll
          for (int k = 0; k < 4; ++k) local |= nonfinite(v.v[k]) ? 1 : 0;
        },
        [&](int i) { local |= nonfinite(g[i]) ? 1 : 0; });
  } else {
    // inf or NaN before scaling stays inf/NaN after (inf*0 is NaN), so one check suffices.
    for_chunk_packs<4>(
        c.len, vectorised,
        [&](int i0) {
          Pack<float, 4> v = load_pack<4>(g + i0);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            v.v[k] *= inv_scale;
            local |= nonfinite(v.v[k]) ? 1 : 0;
          }
          store_pack<4>(g + i0, v);
        },
        [&](int i) {
          const float v = g[i] * inv_scale;
          g[i] = v;
          local |= nonfinite(v) ? 1 : 0;
        });
  }
  if (__syncthreads_or(local) && threadIdx.x == 0) *found = 1;
}

__global__ void __launch_bounds__(kThreads)
    sum_squares_kernel(const TensorRef* tensors, const Chunk* chunks, double* partial) {
  const Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  double local = 0.0;
  with_storage(t.type, [&](auto tag) {
    using S = decltype(tag);
    constexpr int V = pack_width<elem_t<S>>();
    const elem_t<S>* x = static_cast<const elem_t<S>*>(t.data) + c.begin;
    auto add = [&](elem_t<S> e) {
      const float f = S::load(e);
      local += static_cast<double>(f) * f;
    };
    for_chunk_packs<V>(
        c.len, aligned16(x),
        [&](int i0) {
          const Pack<elem_t<S>, V> v = load_pack<V>(x + i0);
#pragma unroll
          for (int k = 0; k < V; ++k) add(v.v[k]);
        },
        [&](int i) { add(x[i]); });
  });
  const double total = block_sum(local);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const double* partial, int count, double* result) {
  double local = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) local += partial[i];
  const double total = block_sum(local);
  if (threadIdx.x == 0) *result = total;
}

__global__ void __launch_bounds__(kThreads)
    nonfinite_kernel(const TensorRef* tensors, const Chunk* chunks, int* flags) {
  const Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  int local = 0;
  with_storage(t.type, [&](auto tag) {
    using S = decltype(tag);
    constexpr int V = pack_width<elem_t<S>>();
    const elem_t<S>* x = static_cast<const elem_t<S>*>(t.data) + c.begin;
    for_chunk_packs<V>(
        c.len, aligned16(x),
        [&](int i0) {
          const Pack<elem_t<S>, V> v = load_pack<V>(x + i0);
#pragma unroll
          for (int k = 0; k < V; ++k) local |= nonfinite(S::load(v.v[k])) ? 1 : 0;
        },
        [&](int i) { local |= nonfinite(S::load(x[i])) ? 1 : 0; });
  });
  if (__syncthreads_or(local) && threadIdx.x == 0) flags[c.tensor] = 1;
}

// x is [n]: a grid-stride walk, four values a 16-byte load where x allows it; each block adds
// its two counts to the tally once.
__global__ void __launch_bounds__(kThreads)
    count_underflow_kernel(const float* x, std::int64_t n, float threshold,
                           unsigned long long* tally) {
  unsigned long long kept = 0, flushed = 0;
  const auto count = [&](float v) {
    const int f = element::underflow_flags(v, threshold);
    kept += static_cast<unsigned long long>(f & 1);
    flushed += static_cast<unsigned long long>(f >> 1);
  };
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  std::int64_t tail = 0;
  if (aligned16(x)) {
    const std::int64_t packs = n / 4;
    for (std::int64_t p = first; p < packs; p += stride) {
      const Pack<float, 4> v = load_pack<4>(x + 4 * p);
#pragma unroll
      for (int k = 0; k < 4; ++k) count(v.v[k]);
    }
    tail = packs * 4;
  }
  for (std::int64_t i = tail + first; i < n; i += stride) count(x[i]);
  for (int o = 16; o > 0; o >>= 1) {
    kept += __shfl_xor_sync(0xFFFFFFFFu, kept, o);
    flushed += __shfl_xor_sync(0xFFFFFFFFu, flushed, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(tally, kept);
    atomicAdd(tally + 1, flushed);
  }
}

__global__ void status_kernel(const int* found, const double* sum, const int* label_flag,
                              const int* id_flag, StatusRecord* status) {
  const int deferred =
      ((label_flag != nullptr && *label_flag != 0) || (id_flag != nullptr && *id_flag != 0)) ? 1
                                                                                             : 0;
  status->sum_of_squares = sum != nullptr ? *sum : 0.0;
  status->found_inf = (*found != 0 || deferred != 0) ? 1 : 0;
  status->deferred = deferred;
}

}  // namespace

cudaError_t write_status(const int* found, const double* sum, const int* label_flag,
                         const int* id_flag, StatusRecord* status, cudaStream_t stream) {
  status_kernel<<<1, 1, 0, stream>>>(found, sum, label_flag, id_flag, status);
  return cudaGetLastError();
}

cudaError_t unscale_and_check(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                              float inv_scale, int* found, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  unscale_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors, chunks, inv_scale, found);
  return cudaGetLastError();
}

cudaError_t sum_of_squares(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                           double* partial, double* result, cudaStream_t stream) {
  if (num_chunks > 0)
    sum_squares_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors, chunks, partial);
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partial, num_chunks, result);
  return cudaGetLastError();
}

cudaError_t find_nonfinite(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                           int* flags, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  nonfinite_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors, chunks, flags);
  return cudaGetLastError();
}

cudaError_t count_underflow(const float* x, std::int64_t n, float threshold,
                            unsigned long long* tally, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Enough blocks to fill any GPU several times over; the walk strides over the rest.
  const std::int64_t wanted = (n / 4 + kThreads - 1) / kThreads;
  const int blocks =
      static_cast<int>(std::min<std::int64_t>(std::max<std::int64_t>(wanted, 1), 4096));
  count_underflow_kernel<<<blocks, kThreads, 0, stream>>>(x, n, threshold, tally);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
