// The activation kernels: what the activation facet runs, and the GEMM facet's fused epilogue.
//
// Contract
// - apply_activation: y = act(x) element-wise; x and y are fp32 / bf16 / fp16 storage of equal
//   element counts (y may be x); math in fp32, one RNE rounding into y's dtype. ReLU keeps NaN
//   (max(x, 0) with NaN x giving NaN, as PyTorch) at every size. GELU is the tanh approximation,
//   the same path at every size, so its numbers never depend on the tensor size.
// - apply_activation_grad: dx = dy · act'(x) with the same storage rules (ReLU: dy where x > 0,
//   else +0, NaN x included).
// - apply_activation_grad_into: C = round(z · act'(x)) into C's storage dtype, z fp32 [numel]
//   (overwritten: a GEMM's product in scratch, or C itself when C is fp32), x any float storage.
//   It runs in blocks of kEpilogueBlock elements, each decoded (x), differentiated (the fp32
//   path of apply_activation_grad, oneDNN's for GELU where it has one) and rounded while in cache,
//   with the numbers of apply_activation_grad on the decoded x with an fp32 dy. 2^20 elements (4
//   MiB of z): GPT-2's MLP dgrad measured 0.89x the unfused ops with 2^16 (a parallel launch per
//   pass per block costs more than the cache saves), 0.94x with 2^18, 1.06x with 2^20
//   (bench/gpt/bench_gradient_epilogues, 4096 rows, bf16; AMD EPYC, session 27). On an AMX
//   Xeon (session 64) the order turned: 2^20 0.87-0.89x (4096 rows) and 0.92-0.96x (1024), 2^18
//   0.93-1.01x and 1.01-1.03x; kept at 2^20 until one run compares both CPUs.
// - sum_columns: sums[n] (fp32) = (accumulate ? sums : 0) + Σ_rows x[rows, n], x fp32 / bf16 /
//   fp16 storage, each column's rows added in order in double, then the old value, rounded once
//   (the bias gradient; the GEMM facet's gradient epilogue sums with it too, so fused and unfused
//   bias gradients are the same bits). OpenMP over blocks of 64 columns, each walked down the rows
//   by one thread (compiled per ISA, cpu_isa.h), so the bits do not depend on the thread count.
// - All set the calling thread's OpenMP team (context.use_threads()) and throw
//   sdk::BackendError naming the op and the offending tensor.
#pragma once

#include "cpu_context.h"
#include "mixtrain/sdk/backend_activation.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

void apply_activation(const CpuContext& context, sdk::Activation act, sdk::TensorView x,
                      sdk::TensorView y);
void apply_activation_grad(const CpuContext& context, sdk::Activation act, sdk::TensorView x,
                           sdk::TensorView dy, sdk::TensorView dx);
inline constexpr std::int64_t kEpilogueBlock = std::int64_t{1} << 20;
// `decoded`: min(kEpilogueBlock, numel) floats of the caller's scratch (read only when x is not
// fp32). The arguments are gemm_gradient's, already checked (gemm_gradient_shape): x and c of z's
// size, z the engine's fp32 product.
void apply_activation_grad_into(const CpuContext& context, sdk::Activation act, sdk::TensorView x,
                                sdk::TensorView z, sdk::TensorView c, float* decoded);
void sum_columns(const CpuContext& context, sdk::TensorView x, std::int64_t rows, std::int64_t n,
                 float* sums, bool accumulate);

}  // namespace mixtrain::backend_cpu
