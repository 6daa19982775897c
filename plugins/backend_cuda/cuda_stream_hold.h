// A one-thread kernel that keeps a stream busy for a while, so that what the host enqueues behind
// it is queued before the GPU reaches it (autotuning's timing, cuda_candidate_timing.h).
//
// Contract
// - hold_stream(stream, microseconds): enqueues a kernel that returns once the GPU's global timer
//   has advanced `microseconds` (at most 10,000) since it started; it reads and writes no memory.
//   Returns the launch's status (cudaErrorInvalidValue for a longer hold, launching nothing).
#pragma once

#include <cuda_runtime_api.h>

namespace mixtrain::backend_cuda::kernels {

cudaError_t hold_stream(cudaStream_t stream, unsigned microseconds);

}  // namespace mixtrain::backend_cuda::kernels
