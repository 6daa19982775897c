// The foreach ops' kernel: one grid-stride pass over one fp32 tensor, in place. The op is a
// launch argument, uniform across the grid, so the switch costs no divergence.
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

// x[n] (fp32, in place); a[n], b[n] the other lists' tensors where the op reads them.
__global__ void __launch_bounds__(kThreads)
    foreach_kernel(ForeachKind kind, float* x, const float* a, const float* b, std::int64_t n,
                   float s0, float s1) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = x[i];
    float r = v;
    switch (kind) {
      case ForeachKind::mul:
        r = v * (a != nullptr ? a[i] : s0);
        break;
      case ForeachKind::add_scalar:
        r = v + s0;
        break;
      case ForeachKind::add:
        r = v + s0 * a[i];
        break;
      case ForeachKind::addcmul:
        r = v + s0 * a[i] * b[i];
        break;
      case ForeachKind::sqrt:
        r = sqrtf(v);
        break;
      // ±0 and NaN stay as they are: both comparisons are false for them.
      case ForeachKind::sign:
        r = v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v);
        break;
      case ForeachKind::lerp:
        r = v + s0 * (a[i] - v);
        break;
      case ForeachKind::clamp:
        r = v < s0 ? s0 : (v > s1 ? s1 : v);
        break;
    }
    x[i] = r;
  }
}

}  // namespace

cudaError_t foreach_op(ForeachKind kind, float* x, const float* a, const float* b, std::int64_t n,
                       float s0, float s1, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  foreach_kernel<<<grid_for(n), kThreads, 0, stream>>>(kind, x, a, b, n, s0, s1);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
