// The activation facet's kernels: axpy and relu / gelu forward and backward as templates over the
// storage types of each operand, 16-byte packs when every pointer is aligned (both paths compute
// the same function per element), and the bias gradient through cuda_column_sums.cu.
#include <type_traits>

#include "cuda_activation.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

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

// Calls f(std::integral_constant<int, act>{}) for act 0 (relu) or 1 (gelu).
template <class F>
bool with_activation(int act, F&& f) {
  switch (act) {
    case 0:
      f(std::integral_constant<int, 0>{});
      return true;
    case 1:
      f(std::integral_constant<int, 1>{});
      return true;
    default:
      return false;
  }
}

}  // namespace

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

cudaError_t activation_backward(int act, const void* x, Elem xt, const void* dy, Elem dyt, void* dx,
                                Elem dxt, std::int64_t n, cudaStream_t stream) {
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

cudaError_t bias_grad(const void* dy, Elem dyt, float* dbias, std::int64_t rows, std::int64_t n,
                      bool accumulate, float* partial, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  launch_column_sums(dy, dyt, nullptr, Elem::f32, nullptr, nullptr, rows, n, dbias, nullptr,
                     accumulate, partial, stream);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
