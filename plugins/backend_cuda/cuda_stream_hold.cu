// The stream hold's kernel (contract in cuda_stream_hold.h).
#include <cstdint>

#include "cuda_stream_hold.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

// %globaltimer counts nanoseconds (sm_70 and later); __nanosleep keeps the thread off the issue
// slots between reads.
__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void hold_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < ns) __nanosleep(1000);
}

}  // namespace

cudaError_t hold_stream(cudaStream_t stream, unsigned microseconds) {
  if (microseconds > 10'000) return cudaErrorInvalidValue;
  hold_kernel<<<1, 1, 0, stream>>>(static_cast<std::uint64_t>(microseconds) * 1000);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
