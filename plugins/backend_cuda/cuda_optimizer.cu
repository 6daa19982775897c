// The optimizer facet's fused SGD / AdamW kernels, which also refresh the low-precision working
// copies. One block handles one chunk (cuda_device.cuh's for_chunk_packs); each element is read
// and written exactly once per call. Per element the math is cuda_element_math.h's, which follows
// the CPU backend's optimizer steps operation for operation.
#include "cuda_device.cuh"
#include "cuda_optimizer.h"
#include "mixtrain/sdk/support/gradient_clipping.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

// Working copies are fp32 (also tf32 views: copied unrounded, as the CPU backend), bf16 or fp16.
template <class F>
__device__ __forceinline__ void with_working_storage(Elem t, F&& f) {
  switch (t) {
    case Elem::bf16:
      f(storage::Bf16{});
      return;
    case Elem::f16:
      f(storage::F16{});
      return;
    default:
      f(storage::F32{});
      return;
  }
}

// The gate's answer for this launch: false when the step must not apply; else `grad_scale` holds
// the clipping coefficient that replaces the args' (every thread computes the same double math).
__device__ __forceinline__ bool gate_open(const UpdateGate& gate, float& grad_scale) {
  if (gate.status == nullptr) return true;
  const StatusRecord* st = gate.status;
  if (st->found_inf != 0) return false;
  grad_scale = sdk::clip_coefficient(st->sum_of_squares, gate.max_norm);
  return true;
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
        for (int k = 0; k < V; ++k)
          wv.v[k] = element::sgd_step<kMomentum>(h, wv.v[k], gv.v[k], bv.v[k]);
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
    sgd_kernel(SgdArgs h, UpdateGate gate, const ParamRef* params, const Chunk* chunks) {
  if (!gate_open(gate, h.grad_scale)) return;
  const Chunk c = chunks[blockIdx.x];
  const ParamRef p = params[c.tensor];
  with_working_storage(p.working_type,
                       [&](auto tag) { sgd_chunk<kMomentum, decltype(tag)>(h, p, c); });
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
    adamw_kernel(AdamWArgs h, UpdateGate gate, const ParamRef* params, const Chunk* chunks) {
  if (!gate_open(gate, h.grad_scale)) return;
  const Chunk c = chunks[blockIdx.x];
  const ParamRef p = params[c.tensor];
  with_working_storage(p.working_type, [&](auto tag) { adamw_chunk<decltype(tag)>(h, p, c); });
}

}  // namespace

cudaError_t sgd_update(const SgdArgs& h, const UpdateGate& gate, const ParamRef* params,
                       const Chunk* chunks, int num_chunks, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  if (h.use_momentum)
    sgd_kernel<true><<<num_chunks, kThreads, 0, stream>>>(h, gate, params, chunks);
  else
    sgd_kernel<false><<<num_chunks, kThreads, 0, stream>>>(h, gate, params, chunks);
  return cudaGetLastError();
}

cudaError_t adamw_update(const AdamWArgs& h, const UpdateGate& gate, const ParamRef* params,
                         const Chunk* chunks, int num_chunks, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  adamw_kernel<<<num_chunks, kThreads, 0, stream>>>(h, gate, params, chunks);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
