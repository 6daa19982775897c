// The foreach ops' multi-tensor kernel: every tensor of the lists in one launch, one block per
// chunk of kChunkElems elements (the chunk and tensor tables are uploaded by the backend, as for
// the gradient checks), in place. The op is a launch argument, uniform across the grid, so the
// switch costs no divergence. Each element is one thread's: results do not depend on the chunking.
#include "cuda_device.cuh"
#include "cuda_foreach.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

__device__ __forceinline__ float foreach_element(ForeachKind kind, float v, const float* a,
                                                 const float* b, int i, float s0, float s1) {
  switch (kind) {
    case ForeachKind::mul:
      return v * (a != nullptr ? a[i] : s0);
    case ForeachKind::add_scalar:
      return v + s0;
    case ForeachKind::add:
      return v + s0 * a[i];
    case ForeachKind::addcmul:
      return v + s0 * a[i] * b[i];
    case ForeachKind::sqrt:
      return sqrtf(v);
    // ±0 and NaN stay as they are: both comparisons are false for them.
    case ForeachKind::sign:
      return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v);
    case ForeachKind::lerp:
      return v + s0 * (a[i] - v);
    case ForeachKind::clamp:
      return v < s0 ? s0 : (v > s1 ? s1 : v);
  }
  return v;
}

// Block c: elements [begin, begin + len) of tensor chunks[c].tensor; x, a, b are that tensor's
// fp32 [numel] lists, offset to the chunk.
__global__ void __launch_bounds__(kThreads)
    foreach_kernel(ForeachKind kind, const ForeachRef* tensors, const Chunk* chunks, float s0,
                   float s1) {
  const Chunk c = chunks[blockIdx.x];
  const ForeachRef t = tensors[c.tensor];
  float* x = t.x + c.begin;
  const float* a = t.a != nullptr ? t.a + c.begin : nullptr;
  const float* b = t.b != nullptr ? t.b + c.begin : nullptr;
  for (int i = static_cast<int>(threadIdx.x); i < c.len; i += static_cast<int>(blockDim.x))
    x[i] = foreach_element(kind, x[i], a, b, i, s0, s1);
}

}  // namespace

cudaError_t foreach_op(ForeachKind kind, const ForeachRef* tensors, const Chunk* chunks,
                       int num_chunks, float s0, float s1, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  foreach_kernel<<<num_chunks, kThreads, 0, stream>>>(kind, tensors, chunks, s0, s1);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
