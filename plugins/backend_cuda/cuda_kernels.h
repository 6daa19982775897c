// Host-callable launchers of the CUDA backend's kernels (cuda_kernels.cu, cuda_optimizers.cu).
//
// Contract
// - Every launcher only enqueues work on `stream` and returns; it neither validates (the backend
//   did) nor synchronises. Launch errors are returned as cudaError_t for the caller to report.
// - Pointers are device pointers of tensors stored as `Elem`; math is fp32, without FMA
//   contraction (reductions fp32 per thread, double where the CPU reference accumulates in double:
//   layernorm statistics, the softmax log-sum-exp and loss, sums across blocks, sum of squares).
// - Storage types: fp32, bf16, fp16 for the element-wise and layer kernels, plus fp8 (e4m3, e5m2)
//   for cast and fill, plus int32 for fill. A tag outside that set launches nothing and returns
//   cudaErrorInvalidValue.
// - Decodes and encodes are cuda_element_math.h's, bit for bit those of sdk/float_formats.h (RNE;
//   saturate clamps to the largest finite value, else e4m3 overflow -> NaN, others -> inf; NaNs
//   keep sign and top payload bits); tf32 is RNE on the fp32 bits. test_cuda_element_math checks
//   them, and gelu / gelu_grad and the optimizer steps, on the host.
// - Element-wise kernels are instantiated per storage type and chosen at launch; when all their
//   pointers are 16-byte aligned they move 16-byte packs, else single elements: same results.
// - Reductions that feed training (bias_grad, layernorm dgamma/dbeta, sum of squares, the loss)
//   use a fixed partition and order: results are bit-reproducible run to run.
// - This header is plain C++ (no CUDA device code) so host .cpp files can include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mixtrain::backend_cuda::kernels {

enum class Elem : int { f32 = 0, bf16 = 1, f16 = 2, e4m3 = 3, e5m2 = 4, i32 = 5 };

// --- element-wise and casts ----------------------------------------------------------------------
// dst = encode(decode(src) * scale) (no multiply when scale is 1); tf32_out rounds an f32
// destination to tf32 (RNE). amax (nullable): amax[0] = max(amax[0], max|decode(src)|), or NaN
// (0x7FC00000) if any element or amax[0] is NaN: the CPU backend's rule, also for n == 0.
cudaError_t cast(const void* src, Elem src_t, void* dst, Elem dst_t, bool tf32_out,
                 std::int64_t n, float scale, bool saturate, float* amax, cudaStream_t stream);
// x = value, encoded once (int32: toward zero, saturating, NaN -> 0).
cudaError_t fill(void* x, Elem t, std::int64_t n, float value, cudaStream_t stream);
cudaError_t scale(void* x, Elem t, std::int64_t n, float alpha, cudaStream_t stream);
cudaError_t axpy(float alpha, const void* x, Elem xt, float* y, std::int64_t n,
                 cudaStream_t stream);
// act: 0 relu, 1 gelu (tanh approximation).
cudaError_t activation_forward(int act, const void* x, Elem xt, void* y, Elem yt, std::int64_t n,
                               cudaStream_t stream);
cudaError_t activation_backward(int act, const void* x, Elem xt, const void* dy, Elem dyt,
                                void* dx, Elem dxt, std::int64_t n, cudaStream_t stream);
// out[c, r] = in[r, c] for a [rows, cols] matrix of `elem_bytes`-byte elements.
cudaError_t transpose(const void* in, void* out, std::int64_t rows, std::int64_t cols,
                      int elem_bytes, cudaStream_t stream);

// --- layer kernels ---------------------------------------------------------------------------------
// y[rows, n] += bias[n] (the GEMM's bias epilogue where cuBLASLt cannot fuse it).
cudaError_t add_bias(void* y, Elem yt, const void* bias, Elem bt, std::int64_t rows, std::int64_t n,
                     cudaStream_t stream);
// Column sums of [rows, n] into out[n] (out = (accumulate ? out : 0) + sums). `partial` is scratch
// of column_sum_scratch(rows, n) floats.
std::size_t column_sum_scratch(std::int64_t rows, std::int64_t n);
cudaError_t bias_grad(const void* dy, Elem dyt, float* dbias, std::int64_t rows, std::int64_t n,
                      bool accumulate, float* partial, cudaStream_t stream);
cudaError_t layernorm_forward(const void* x, Elem xt, const void* gamma, Elem gt, const void* beta,
                              Elem bt, float eps, void* y, Elem yt, float* mean, float* rstd,
                              std::int64_t rows, std::int64_t n, cudaStream_t stream);
// dgamma/dbeta nullable; partial: 2 * column_sum_scratch(rows, n) floats.
cudaError_t layernorm_backward(const void* dy, Elem dyt, const void* x, Elem xt, const void* gamma,
                               Elem gt, const float* mean, const float* rstd, void* dx, Elem dxt,
                               float* dgamma, float* dbeta, bool accumulate, std::int64_t rows,
                               std::int64_t n, float* partial, cudaStream_t stream);

// Error record a kernel leaves for the host. `first` packs (row << 32 | uint32 label) of the
// first offending row (atomicMin), ~0 when none; flag != 0 once any row was bad. The host resets
// it to {~0, 0, 0} after reading.
struct ErrorRecord {
  unsigned long long first;
  int flag;
  int classes;
};
// Validates labels into `error` (first bad row), then, unless one was bad, writes loss[0] (mean
// cross-entropy against targets smoothed by label_smoothing), correct[0] (nullable) and dlogits
// (nullable). row_loss: rows doubles, row_ok: rows ints of scratch.
cudaError_t softmax_cross_entropy(const void* logits, Elem lt, const std::int32_t* labels,
                                  float grad_scale, float label_smoothing, float* loss,
                                  std::int32_t* correct,
                                  void* dlogits, Elem dt, std::int64_t rows, std::int64_t classes,
                                  double* row_loss, int* row_ok, ErrorRecord* error,
                                  cudaStream_t stream);

// --- multi-tensor machinery (cuda_optimizers.cu) -------------------------------------------------
// One unit of work: elements [begin, begin + len) of tensor `tensor`.
struct Chunk {
  std::int32_t tensor;
  std::int32_t len;
  std::int64_t begin;
};
inline constexpr std::int64_t kChunkElems = 16384;

struct TensorRef {
  void* data;
  std::int64_t numel;
  Elem type;
  int pad;
};

struct ParamRef {
  float* master;
  const float* grad;
  void* working;  // nullable
  float* state1;  // nullable
  float* state2;  // nullable
  Elem working_type;
  int pad;
};

// found[0] = 1 when any element of any tensor is inf/NaN after g *= inv_scale (f32 tensors; at
// inv_scale == 1 the tensors are only read).
cudaError_t unscale_and_check(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                              float inv_scale, int* found, cudaStream_t stream);
// result[0] = sum of squares in double (partial: num_chunks doubles of scratch).
cudaError_t sum_of_squares(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                           double* partial, double* result, cudaStream_t stream);
// flags[t] = 1 when tensor t holds an inf/NaN (flags zeroed by the caller).
cudaError_t find_nonfinite(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                           int* flags, cudaStream_t stream);

struct SgdArgs {
  float lr, momentum, dampening, weight_decay, grad_scale;
  bool nesterov, first_step, use_momentum;
};
cudaError_t sgd_update(const SgdArgs& h, const ParamRef* params, const Chunk* chunks,
                       int num_chunks, cudaStream_t stream);

struct AdamWArgs {
  float beta1, beta2, eps, grad_scale, decay, step_size, bc2_sqrt;
};
cudaError_t adamw_update(const AdamWArgs& h, const ParamRef* params, const Chunk* chunks,
                         int num_chunks, cudaStream_t stream);

// Foreach ops (ForeachFacet), in place on fp32 tensors, as one multi-tensor launch
// (cuda_foreach.cu): one block per chunk of the table, every tensor of the lists in the same
// launch. ForeachRef i holds self[i] and, where the op reads them, the other lists' i-th tensors
// (a, b: nullptr otherwise); s0, s1: the op's scalars (mul_scalar/add_scalar: s0; add: alpha;
// addcmul: value; lerp: weight; clamp: lo, hi). NaN propagates through every op.
enum class ForeachKind { mul, add_scalar, add, addcmul, sqrt, sign, lerp, clamp };
struct ForeachRef {
  float* x;
  const float* a;  // nullable
  const float* b;  // nullable
  std::int64_t numel;
};
cudaError_t foreach_op(ForeachKind kind, const ForeachRef* tensors, const Chunk* chunks,
                       int num_chunks, float s0, float s1, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
