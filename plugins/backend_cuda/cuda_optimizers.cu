// Multi-tensor kernels: fused unscale + finite check, sum of squares, first non-finite tensor, and
// the fused SGD / AdamW updates that also refresh the low-precision working copies. The host cuts
// every tensor into chunks of at most kChunkElems elements (kernels::Chunk) and uploads the chunk
// and tensor tables once per call; one block handles one chunk, so many small parameters and a
// few huge ones share one launch. Each element is read and written exactly once per call (the
// unscale at scale 1 only reads). Per element the math is cuda_element_math.h's, which follows
// cpu_optimizers.cpp operation for operation.
//
// Within a chunk, thread t owns packs t, t + blockDim.x, ... of V elements (16 bytes of the
// narrowest tensor). A full pack of a chunk whose pointers are all 16-byte aligned moves as
// 16-byte words; otherwise its elements move one by one. The ownership, hence every per-thread sum,
// is the same either way.
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

template <int V, class PackFn, class OneFn>
__device__ __forceinline__ void for_chunk_packs(int len, bool vectorised, PackFn&& pack,
                                                OneFn&& one) {
  for (int i0 = static_cast<int>(threadIdx.x) * V; i0 < len; i0 += static_cast<int>(blockDim.x) * V) {
    if (vectorised && i0 + V <= len) {
      pack(i0);
    } else {
      const int end = min(i0 + V, len);
      for (int i = i0; i < end; ++i) one(i);
    }
  }
}

// Calls f(S{}) with the storage type of t (fp32 for anything else, e.g. a tf32 view).
template <class F>
__device__ __forceinline__ void with_storage(Elem t, F&& f) {
  switch (t) {
    case Elem::bf16: f(storage::Bf16{}); return;
    case Elem::f16: f(storage::F16{}); return;
    case Elem::e4m3: f(storage::E4M3{}); return;
    case Elem::e5m2: f(storage::E5M2{}); return;
    default: f(storage::F32{}); return;
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

// Working copies are fp32 (also tf32 views: copied unrounded, as the CPU backend), bf16 or fp16.
template <class F>
__device__ __forceinline__ void with_working_storage(Elem t, F&& f) {
  switch (t) {
    case Elem::bf16: f(storage::Bf16{}); return;
    case Elem::f16: f(storage::F16{}); return;
    default: f(storage::F32{}); return;
  }
}

template <bool kMomentum, class W>
__device__ __forceinline__ void sgd_chunk(const SgdArgs& h, const ParamRef& p, const Chunk& c) {
  constexpr int V = pack_width<float, elem_t<W>>();
  float* w = p.master + c.begin;
  const float* grad = p.grad + c.begin;
  float* buf = kMomentum ? p.state1 + c.begin : nullptr;
  elem_t<W>* work = p.working != nullptr ? static_cast<elem_t<W>*>(p.working) + c.begin : nullptr;
  const bool vectorised = aligned16(w) && aligned16(grad) && (!kMomentum || aligned16(buf)) &&
                          (work == nullptr || aligned16(work));
  for_chunk_packs<V>(
      c.len, vectorised,
      [&](int i0) {
        Pack<float, V> wv = load_pack<V>(w + i0);
        const Pack<float, V> gv = load_pack<V>(grad + i0);
        Pack<float, V> bv{};
        if constexpr (kMomentum) bv = load_pack<V>(buf + i0);
#pragma unroll
        for (int k = 0; k < V; ++k) wv.v[k] = element::sgd_step<kMomentum>(h, wv.v[k], gv.v[k], bv.v[k]);
        store_pack<V>(w + i0, wv);
        if constexpr (kMomentum) store_pack<V>(buf + i0, bv);
        if (work != nullptr) {
          Pack<elem_t<W>, V> out;
#pragma unroll
          for (int k = 0; k < V; ++k) out.v[k] = W::store(wv.v[k], false);
          store_pack<V>(work + i0, out);
        }
      },
      [&](int i) {
        float unused = 0.0f;
        float& b = kMomentum ? buf[i] : unused;
        const float updated = element::sgd_step<kMomentum>(h, w[i], grad[i], b);
        w[i] = updated;
        if (work != nullptr) work[i] = W::store(updated, false);
      });
}

template <bool kMomentum>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(SgdArgs h, const ParamRef* params, const Chunk* chunks) {
  const Chunk c = chunks[blockIdx.x];
  const ParamRef p = params[c.tensor];
  with_working_storage(p.working_type, [&](auto tag) { sgd_chunk<kMomentum, decltype(tag)>(h, p, c); });
}

template <class W>
__device__ __forceinline__ void adamw_chunk(const AdamWArgs& h, const ParamRef& p, const Chunk& c) {
  constexpr int V = pack_width<float, elem_t<W>>();
  float* w = p.master + c.begin;
  const float* grad = p.grad + c.begin;
  float* m = p.state1 + c.begin;
  float* v = p.state2 + c.begin;
  elem_t<W>* work = p.working != nullptr ? static_cast<elem_t<W>*>(p.working) + c.begin : nullptr;
  const bool vectorised = aligned16(w) && aligned16(grad) && aligned16(m) && aligned16(v) &&
                          (work == nullptr || aligned16(work));
  for_chunk_packs<V>(
      c.len, vectorised,
      [&](int i0) {
        Pack<float, V> wv = load_pack<V>(w + i0);
        const Pack<float, V> gv = load_pack<V>(grad + i0);
        Pack<float, V> mv = load_pack<V>(m + i0);
        Pack<float, V> vv = load_pack<V>(v + i0);
#pragma unroll
        for (int k = 0; k < V; ++k)
          wv.v[k] = element::adamw_step(h, wv.v[k], gv.v[k], mv.v[k], vv.v[k]);
        store_pack<V>(w + i0, wv);
        store_pack<V>(m + i0, mv);
        store_pack<V>(v + i0, vv);
        if (work != nullptr) {
          Pack<elem_t<W>, V> out;
#pragma unroll
          for (int k = 0; k < V; ++k) out.v[k] = W::store(wv.v[k], false);
          store_pack<V>(work + i0, out);
        }
      },
      [&](int i) {
        const float updated = element::adamw_step(h, w[i], grad[i], m[i], v[i]);
        w[i] = updated;
        if (work != nullptr) work[i] = W::store(updated, false);
      });
}

__global__ void __launch_bounds__(kThreads)
    adamw_kernel(AdamWArgs h, const ParamRef* params, const Chunk* chunks) {
  const Chunk c = chunks[blockIdx.x];
  const ParamRef p = params[c.tensor];
  with_working_storage(p.working_type, [&](auto tag) { adamw_chunk<decltype(tag)>(h, p, c); });
}

}  // namespace

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

cudaError_t sgd_update(const SgdArgs& h, const ParamRef* params, const Chunk* chunks,
                       int num_chunks, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  if (h.use_momentum)
    sgd_kernel<true><<<num_chunks, kThreads, 0, stream>>>(h, params, chunks);
  else
    sgd_kernel<false><<<num_chunks, kThreads, 0, stream>>>(h, params, chunks);
  return cudaGetLastError();
}

cudaError_t adamw_update(const AdamWArgs& h, const ParamRef* params, const Chunk* chunks,
                         int num_chunks, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  adamw_kernel<<<num_chunks, kThreads, 0, stream>>>(h, params, chunks);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
