// GEMM routes: for one GEMM's dtypes and extras (bias, activation, pre_activation), the ways to
// run it through cuBLASLt, best first, and which part of the work each leaves to kernels.
//
// Contract
// - gemm_routes() is pure host code (no CUDA call), so its rules are unit-tested without a GPU.
// - Every route computes the same result: z = alpha*op(A)op(B) + beta*C + bias in FP32, C =
//   act(z) (or z) rounded once into C's dtype, pre_activation = z rounded once. In particular a
//   16-bit C never holds z before the activation (that would round twice), the bias is added
//   exactly once, and a gelu pre_activation rides cuBLASLt's GELU_AUX only when it has C's dtype
//   and n % 8 == 0 (cuBLASLt's aux leading-dimension rule).
// - The last route uses no cuBLASLt epilogue (plain GEMM into fp32 or into an fp32 C), so a GEMM
//   whose inputs cuBLASLt runs at all always has a route that runs.
// - gemm_gradient's routes (activation_grad): z = alpha*op(A)op(B) + beta*C in FP32, times
//   gelu'(pre) in FP32, rounded once into C. DGELU rides cuBLASLt only with 16/32-bit inputs (FP8
//   aux types have their own rules), beta == 0 (cublasLt.h applies the gradient to the "matmul
//   output" without saying whether beta*C is in it), the pre_activation in D's dtype (cuBLASLt's
//   default aux type) and n % 8 == 0 (the aux leading-dimension rule); the last route is a plain
//   GEMM into fp32 and a kernel (activation_backward) that multiplies by gelu' and rounds once
//   into C. No BGRAD epilogue: the sums are the facet's (cuda_gemm_facet.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"

namespace mixtrain::backend_cuda {

// CudaGemm's answer to GemmFacet::supports: the SDK's signature and, for A and B, a dtype
// `caps` (the device's capabilities()) lists — no FP8 before sm_89, where emulating it would only
// be slower than bf16. gemm_gradient (no SDK row) answers as gemm: every triple gemm runs, it runs.
bool gemm_supported(const sdk::BackendCapabilities& caps, sdk::GemmOp op,
                    std::span<const sdk::DType> dtypes);

struct GemmRoute {
  // direct: D is C. direct_narrow_bias: D is C and the bias is passed in C's 16-bit dtype (for
  // when cuBLASLt declines an fp32 bias with a 16-bit D). fp32_epilogue: D is fp32 scratch, the
  // fp32 bias in the epilogue. fp32_kernel_bias: D is fp32, a kernel adds the bias.
  enum class Output { direct, direct_narrow_bias, fp32_epilogue, fp32_kernel_bias };
  Output output = Output::direct;
  sdk::DType d_dtype = sdk::DType::fp32;     // cuBLASLt's D
  bool bias_in_epilogue = false;
  sdk::DType bias_dtype = sdk::DType::fp32;  // of the bias cuBLASLt reads
  bool bias_by_kernel = false;
  bool activation_in_epilogue = false;       // RELU / GELU epilogue writes act(z) into C
  bool aux_in_epilogue = false;              // GELU_AUX writes z into pre_activation
  bool pre_activation_by_kernel = false;     // a cast kernel writes z (fp32 D) into pre_activation
  bool activation_by_kernel = false;         // a kernel writes act(z) from fp32 D into C
  bool encode_by_kernel = false;             // a cast kernel rounds fp32 D into a 16-bit C
  // gemm_gradient: DGELU multiplies z by gelu'(pre_activation) in cuBLASLt's epilogue; or a kernel
  // multiplies the fp32 D by gelu'(pre_activation) and rounds once into C.
  bool dgelu_in_epilogue = false;
  bool activation_grad_by_kernel = false;
};

struct GemmRouteQuery {
  sdk::DType input = sdk::DType::fp32;  // A and B as they enter cuBLASLt (same dtype)
  sdk::DType c = sdk::DType::fp32;      // C's storage dtype (fp32, bf16, fp16)
  bool bias = false;
  bool activation = false;
  sdk::Activation act = sdk::Activation::relu;
  bool pre_activation = false;
  sdk::DType pre_activation_dtype = sdk::DType::fp32;
  std::int64_t n = 0;
  // gemm_gradient with has_activation_grad: gelu's gradient from a pre_activation of
  // pre_activation_dtype (bias, activation and pre_activation unset then).
  bool activation_grad = false;
  bool beta_nonzero = false;
};

// Output types cuBLASLt offers for an input type with FP32 compute (cuBLASLt's type table).
bool gemm_direct_output(sdk::DType input, sdk::DType c);

std::vector<GemmRoute> gemm_routes(const GemmRouteQuery& q);

// --- realigned rows -----------------------------------------------------------------------------
// A row-major operand whose rows do not start 16 bytes apart (cols · size not a multiple of 16:
// 50257 bf16 logits) keeps cuBLASLt off its vectorised Tensor Core kernels. With the backend's
// `gemm_realign` option, run() copies such an operand into scratch whose rows are padded to the
// next 16 bytes (the same values, the leading dimension aligned_ld()), and computes such a C in a
// padded scratch copied back after the matmul: what llm.c's padded vocabulary buys, done inside the
// backend, so the model, checkpoints and exports keep their true shapes. Only where it pays: one
// 16-bit GEMM (not a batch) of at least kRealignMinMacs multiply-adds, A and B of one dtype, and
// only routes where cuBLASLt writes C itself (routes_write_c_directly), else the GEMM runs as it
// is.
inline constexpr std::int64_t kRealignMinMacs = std::int64_t{1} << 27;
// cols rounded up to a multiple of 16 bytes of `t`.
std::int64_t aligned_ld(std::int64_t cols, sdk::DType t);
struct RealignQuery {
  sdk::DType input = sdk::DType::bf16;  // A and B (one dtype)
  std::int64_t a_cols = 0, b_cols = 0;  // stored row-major shapes' cols
  sdk::DType c = sdk::DType::bf16;
  std::int64_t m = 0, n = 0, k = 0;
  bool batched = false;
};
struct Realign {
  bool a = false, b = false, c = false;
  bool any() const { return a || b || c; }
};
Realign realign_for(const RealignQuery& q);
// Whether a route leaves C to cuBLASLt alone (no kernel after the matmul, no aux, no DGELU): the
// only ones a padded C takes, since the kernels after it read and write C packed.
bool route_writes_c_directly(const GemmRoute& r);

}  // namespace mixtrain::backend_cuda
