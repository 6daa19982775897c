// Cast and fill: templates per (source, destination) storage type pair, chosen once per launch;
// 16-byte packs (4 x fp32, 8 x bf16/fp16, 16 x fp8) when every pointer is 16-byte aligned, with
// the n % V tail element by element, otherwise element by element throughout: both paths compute
// the same function per element (cuda_element_math.h, which follows sdk/float_formats.h bit for
// bit and is tested on the host).
#include "cuda_cast_fill.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

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

}  // namespace

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
          static_cast<const elem_t<Src>*>(src), static_cast<elem_t<Dst>*>(dst), n, scale, saturate,
          vectorised, amax);
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

}  // namespace mixtrain::backend_cuda::kernels
