// The convolution's kernels around cuDNN (launchers in cuda_convolution.h): the channels-last
// copy of the weights cuDNN's NHWC engines read, the weight gradient moved back into PyTorch's
// layout (and accumulated), and the output's finish (bias, one rounding).
#include "cuda_convolution.h"
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

// One thread per destination element [k, r, s, c] <- source [k, c, r, s].
template <class Src, class Dst>
__global__ void __launch_bounds__(kThreads)
    filter_to_krsc_kernel(const elem_t<Src>* src, elem_t<Dst>* dst, std::int64_t k, std::int64_t c,
                          std::int64_t rs) {
  const std::int64_t total = k * c * rs;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t ci = i % c, pos = i / c % rs, ki = i / (c * rs);
    dst[i] = element::convert<Src, Dst>(src[(ki * c + ci) * rs + pos]);
  }
}

// One thread per dw element [k, c, r, s]; src decoded exactly.
template <class Src>
__global__ void __launch_bounds__(kThreads)
    filter_gradient_kernel(const elem_t<Src>* src, bool krsc, float* dw, std::int64_t k,
                           std::int64_t c, std::int64_t rs, bool accumulate) {
  const std::int64_t total = k * c * rs;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t pos = i % rs, ci = i / rs % c, ki = i / (c * rs);
    const float v = Src::load(krsc ? src[(ki * rs + pos) * c + ci] : src[i]);
    dw[i] = accumulate ? dw[i] + v : v;
  }
}

template <class Y>
__global__ void __launch_bounds__(kThreads)
    finish_output_kernel(const float* acc, const float* bias, elem_t<Y>* y, std::int64_t total,
                         std::int64_t n) {
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const float v = bias != nullptr ? acc[i] + bias[i % n] : acc[i];
    y[i] = Y::store(v, false);
  }
}

}  // namespace

cudaError_t filter_to_krsc(const void* src, Elem st, void* dst, Elem dt, std::int64_t k,
                           std::int64_t c, std::int64_t r, std::int64_t s, cudaStream_t stream) {
  const std::int64_t total = k * c * r * s;
  if (total == 0) return cudaSuccess;
  bool ok = false;
  with_float_storage(st, [&](auto a) {
    using Src = decltype(a);
    ok = with_float_storage(dt, [&](auto b) {
      using Dst = decltype(b);
      filter_to_krsc_kernel<Src, Dst><<<grid_for(total), kThreads, 0, stream>>>(
          static_cast<const elem_t<Src>*>(src), static_cast<elem_t<Dst>*>(dst), k, c, r * s);
    });
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t filter_gradient_from(const void* src, Elem st, bool krsc, float* dw, std::int64_t k,
                                 std::int64_t c, std::int64_t r, std::int64_t s, bool accumulate,
                                 cudaStream_t stream) {
  const std::int64_t total = k * c * r * s;
  if (total == 0) return cudaSuccess;
  const bool ok = with_float_storage(st, [&](auto t) {
    using Src = decltype(t);
    filter_gradient_kernel<Src><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<const elem_t<Src>*>(src), krsc, dw, k, c, r * s, accumulate);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t finish_output(const float* acc, const float* bias, void* y, Elem yt, std::int64_t rows,
                          std::int64_t n, cudaStream_t stream) {
  const std::int64_t total = rows * n;
  if (total == 0) return cudaSuccess;
  const bool ok = with_float_storage(yt, [&](auto t) {
    using Y = decltype(t);
    finish_output_kernel<Y>
        <<<grid_for(total), kThreads, 0, stream>>>(acc, bias, static_cast<elem_t<Y>*>(y), total, n);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
