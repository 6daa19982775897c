// The types every launcher header of the CUDA backend shares: the storage tag of a tensor (Elem),
// the multi-tensor chunk table (Chunk), and the record a kernel leaves for a deferred error
// (ErrorRecord). Each facet's launchers are declared in cuda_<facet>.h, its kernels in
// cuda_<facet>.cu.
//
// Contract of every launcher (cuda_<facet>.h)
// - It only enqueues work on `stream` and returns; it neither validates (the facet did) nor
//   synchronises. Launch errors are returned as cudaError_t for the caller to report.
// - Pointers are device pointers of tensors stored as `Elem`; math is fp32, without FMA
//   contraction (reductions fp32 per thread, double where the CPU reference accumulates in double:
//   layernorm statistics, the softmax log-sum-exp and loss, sums across blocks, sum of squares).
// - Storage types: fp32, bf16, fp16 unless a launcher says more (fp8 for cast and fill, int32 for
//   fill). A tag outside a launcher's set launches nothing and returns cudaErrorInvalidValue.
// - Decodes and encodes are cuda_element_math.h's, bit for bit those of sdk/float_formats.h;
//   test_cuda_element_math checks them, and gelu / gelu_grad and the optimizer steps, on the host.
// - Element-wise kernels are instantiated per storage type and chosen at launch; when all their
//   pointers are 16-byte aligned they move 16-byte packs, else single elements: same results.
// - Reductions that feed training use a fixed partition and order: bit-reproducible run to run.
// - These headers are plain C++ (no CUDA device code) so host .cpp files can include them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mixtrain::backend_cuda::kernels {

enum class Elem : int { f32 = 0, bf16 = 1, f16 = 2, e4m3 = 3, e5m2 = 4, i32 = 5 };

// Error record a kernel leaves for the host. `first` packs (row << 32 | uint32 value) of the
// first offending row (atomicMin), ~0 when none; flag != 0 once any row was bad. The host resets
// it to {~0, 0, 0} after reading.
struct ErrorRecord {
  unsigned long long first;
  int flag;
  int classes;
};

// --- multi-tensor machinery (gradient checks, optimizer updates, foreach ops) ------------------
// One unit of work: elements [begin, begin + len) of tensor `tensor`.
struct Chunk {
  std::int32_t tensor;
  std::int32_t len;
  std::int64_t begin;
};
inline constexpr std::int64_t kChunkElems = 16384;

}  // namespace mixtrain::backend_cuda::kernels
