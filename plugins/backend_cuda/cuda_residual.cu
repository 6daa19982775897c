// The residual join's kernels: one grid-stride pass over the elements, every input decoded once,
// summed in FP32 in input order, rectified and rounded once into y; and its backward, dy (and y)
// decoded once, masked and rounded once into every gradient (cuda_residual.h).
#include "cuda_device.cuh"
#include "cuda_residual.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

// Each thread takes kUnroll of its grid-stride elements a round and issues their loads (input by
// input) before any of their arithmetic, so kUnroll loads per input are in flight instead of one:
// an element's own operations, and their order, are those of one element at a time.
constexpr int kUnroll = 4;

// xs: count tensors of [n] (any storage dtype each); y [n] in the storage type S.
template <class S>
__global__ void __launch_bounds__(kThreads)
    residual_kernel(ResidualInputs xs, bool relu, elem_t<S>* y, std::int64_t n) {
  const std::int64_t stride = grid_threads();
  for (std::int64_t i0 = global_thread(); i0 < n; i0 += kUnroll * stride) {
    float sum[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t i = i0 + u * stride;
      sum[u] = i < n ? load(xs.data[0], xs.type[0], i) : 0.0f;
    }
    for (int k = 1; k < xs.count; ++k) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::int64_t i = i0 + u * stride;
        v[u] = i < n ? load(xs.data[k], xs.type[k], i) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum[u] = sum[u] + v[u];
    }
    // Every input's element was read above by this thread: y may be one of the inputs.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t i = i0 + u * stride;
      if (i < n) y[i] = S::store(element::residual_output(sum[u], relu), false);
    }
  }
}

// dy, y [n] (y read only when relu); every dxs.data[k] [n] in its own dtype. The value is decoded
// once and written to each gradient: a gradient that is dy gets it after dy[i] was read.
__global__ void __launch_bounds__(kThreads)
    residual_backward_kernel(const void* dy, Elem dyt, const void* y, Elem yt, bool relu,
                             ResidualGrads dxs, std::int64_t n) {
  const std::int64_t stride = grid_threads();
  for (std::int64_t i0 = global_thread(); i0 < n; i0 += kUnroll * stride) {
    float d[kUnroll], out[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t i = i0 + u * stride;
      d[u] = i < n ? load(dy, dyt, i) : 0.0f;
      out[u] = relu && i < n ? load(y, yt, i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t i = i0 + u * stride;
      if (i >= n) continue;
      const float g = element::residual_grad(d[u], out[u], relu);
      for (int k = 0; k < dxs.count; ++k) store(dxs.data[k], dxs.type[k], i, g);
    }
  }
}

}  // namespace

cudaError_t residual_add(const ResidualInputs& xs, bool relu, void* y, Elem yt, std::int64_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (xs.count < 1 || xs.count > kResidualInputs) return cudaErrorInvalidValue;
  const bool known = with_float_storage(yt, [&](auto s) {
    using S = decltype(s);
    residual_kernel<S>
        <<<grid_for(n), kThreads, 0, stream>>>(xs, relu, static_cast<elem_t<S>*>(y), n);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t residual_add_backward(const void* dy, Elem dyt, const void* y, Elem yt, bool relu,
                                  const ResidualGrads& dxs, std::int64_t n, cudaStream_t stream) {
  if (n == 0 || dxs.count == 0) return cudaSuccess;
  if (dxs.count < 0 || dxs.count > kResidualInputs) return cudaErrorInvalidValue;
  residual_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dy, dyt, y, yt, relu, dxs, n);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
