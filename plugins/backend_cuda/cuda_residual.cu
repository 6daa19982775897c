// The residual join's kernels: one grid-stride pass over the elements, 8 at a time in 16-byte
// vectors where every tensor is 16-byte aligned, every input decoded once,
// summed in FP32 in input order, rectified and rounded once into y; and its backward, dy (and y)
// decoded once, masked and rounded once into every gradient (cuda_residual.h).
#include "cuda_device.cuh"
#include "cuda_residual.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

// A thread takes 8 consecutive elements a round (for_each_element's packs): every input's 16
// bytes (32 for fp32) are loaded before any arithmetic, and written back as one vector each. A
// tensor not 16-byte aligned sends the launch down the element-by-element path; an element's own
// operations, and their order, are the same on both paths.
constexpr int kPack = 8;

// The tensor lists are __grid_constant__: a loop over k indexes them at run time, and a plain
// by-value parameter indexed so is copied into each thread's local memory first (104 bytes a
// thread, stored at the start and read back every round: the PTX showed it), where a grid
// constant is read in place from the parameter bank, one broadcast for the whole warp.

// xs: count tensors of [n] (any storage dtype each); y [n] in yt.
__global__ void __launch_bounds__(kThreads)
    residual_kernel(const __grid_constant__ ResidualInputs xs, bool relu, void* y, Elem yt,
                    std::int64_t n, bool vectorised) {
  for_each_element<kPack>(
      n, vectorised,
      [&](std::int64_t i) {
        float sum[kPack];
        load8(xs.data[0], xs.type[0], i, sum);
        for (int k = 1; k < xs.count; ++k) {
          float v[kPack];
          load8(xs.data[k], xs.type[k], i, v);
#pragma unroll
          for (int j = 0; j < kPack; ++j) sum[j] = sum[j] + v[j];
        }
    // Every input's elements were read above by this thread: y may be one of the inputs.
#pragma unroll
        for (int j = 0; j < kPack; ++j) sum[j] = element::residual_output(sum[j], relu);
        store8(y, yt, i, sum);
      },
      [&](std::int64_t i) {
        float sum = load(xs.data[0], xs.type[0], i);
        for (int k = 1; k < xs.count; ++k) sum = sum + load(xs.data[k], xs.type[k], i);
        store(y, yt, i, element::residual_output(sum, relu));
      });
}

// dy, y [n] (y read only when relu); every dxs.data[k] [n] in its own dtype. The value is decoded
// once and written to each gradient: a gradient that is dy gets it after dy's elements were read.
// At least 4 blocks an SM: left to itself ptxas gave this kernel 161 registers, one block of 256
// an SM, too few loads in flight for a memory-bound pass (it ran at about a third of the H200's
// bandwidth, session 57); capped, it takes 47 and spills nothing.
__global__ void __launch_bounds__(kThreads, 4)
    residual_backward_kernel(const void* dy, Elem dyt, const void* y, Elem yt, bool relu,
                             const __grid_constant__ ResidualGrads dxs, std::int64_t n,
                             bool vectorised) {
  for_each_element<kPack>(
      n, vectorised,
      [&](std::int64_t i) {
        float g[kPack], out[kPack];
        load8(dy, dyt, i, g);
        if (relu) load8(y, yt, i, out);
#pragma unroll
        for (int j = 0; j < kPack; ++j)
          g[j] = element::residual_grad(g[j], relu ? out[j] : 0.0f, relu);
        for (int k = 0; k < dxs.count; ++k) store8(dxs.data[k], dxs.type[k], i, g);
      },
      [&](std::int64_t i) {
        const float g =
            element::residual_grad(load(dy, dyt, i), relu ? load(y, yt, i) : 0.0f, relu);
        for (int k = 0; k < dxs.count; ++k) store(dxs.data[k], dxs.type[k], i, g);
      });
}

}  // namespace

cudaError_t residual_add(const ResidualInputs& xs, bool relu, void* y, Elem yt, std::int64_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (xs.count < 1 || xs.count > kResidualInputs) return cudaErrorInvalidValue;
  if (!with_float_storage(yt, [](auto) {})) return cudaErrorInvalidValue;
  bool vectorised = aligned16(y);
  for (int k = 0; k < xs.count; ++k) vectorised = vectorised && aligned16(xs.data[k]);
  residual_kernel<<<grid_for(vectorised ? n / kPack : n), kThreads, 0, stream>>>(xs, relu, y, yt, n,
                                                                                 vectorised);
  return cudaGetLastError();
}

cudaError_t residual_add_backward(const void* dy, Elem dyt, const void* y, Elem yt, bool relu,
                                  const ResidualGrads& dxs, std::int64_t n, cudaStream_t stream) {
  if (n == 0 || dxs.count == 0) return cudaSuccess;
  if (dxs.count < 0 || dxs.count > kResidualInputs) return cudaErrorInvalidValue;
  bool vectorised = aligned16(dy) && (!relu || aligned16(y));
  for (int k = 0; k < dxs.count; ++k) vectorised = vectorised && aligned16(dxs.data[k]);
  residual_backward_kernel<<<grid_for(vectorised ? n / kPack : n), kThreads, 0, stream>>>(
      dy, dyt, y, yt, relu, dxs, n, vectorised);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
