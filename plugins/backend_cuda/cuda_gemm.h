// GemmEngine: C = alpha*op(A)*op(B) + beta*C (+ bias) through cuBLASLt on Tensor Cores.
//
// Contract
// - Row-major operands map onto cuBLASLt's column-major API by computing C^T = op(B)^T op(A)^T:
//   cuBLASLt's "A" is our B and its "B" is our A, with m and n swapped; transposes are layout
//   flags, never copies (except FP8, below).
// - Inputs: fp32 (CUBLAS_COMPUTE_32F), tf32 (fp32 storage, CUBLAS_COMPUTE_32F_FAST_TF32; asked by
//   `compute = tf32` or a tf32 view), bf16 and fp16 (FP32 accumulation); C/D in the caller's dtype
//   where cuBLASLt has the combination, else D is fp32 scratch encoded once (RNE) into C.
// - FP8 (sm_89+): e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3 natively with A/B scale pointers (device
//   floats holding each operand's scale_inv) and FP32 accumulation. cuBLASLt on Ada/Hopper wants
//   FP8 in the "TN" layout (its A transposed, its B not), i.e. our B transposed and our A not;
//   other layouts are transposed into scratch first. e5m2 x e5m2, or an FP8 GEMM cuBLASLt declines,
//   decode both operands exactly to bf16 (every fp8 value is a bf16 value) and fold the scales into
//   alpha. Before sm_89 any FP8 operand is refused (BackendError naming sm_89): capabilities() does
//   not declare FP8 there. Other mixes (fp32 with bf16, bf16 with fp16, fp8 with fp32, ...) decode
//   both operands to fp32 (x scale_inv) and run the fp32 (or tf32) GEMM.
// - Bias (fp32 [n]) rides the CUBLASLT_EPILOGUE_BIAS epilogue after alpha/beta, so alpha never
//   scales it. cuBLASLt documents the bias type as D's type (fp32 bias with a 16-bit D is not
//   guaranteed), so for a 16-bit D the next strategy passes the bias rounded to D's dtype (n
//   elements, as PyTorch's autocast does); after that D is fp32 with the fp32 bias, and last a
//   kernel adds it, always before the single rounding to C's dtype.
// - Activation epilogue: relu and gelu ride CUBLASLT_EPILOGUE_{RELU,GELU}[_BIAS] when D is C;
//   a gelu pre_activation rides GELU_AUX[_BIAS] when it has C's dtype and n % 8 == 0 (cuBLASLt's
//   aux leading dimension rule). Otherwise z is fp32 (C itself when C is fp32, else scratch), then
//   kernels write pre_activation and act(z) into C, still rounding once; a 16-bit C is never
//   written as z first, so a fused GEMM never rounds twice. The routes, in order, and what each
//   leaves to kernels are cuda_gemm_routes.h's (host-tested).
// - Backward epilogues (run_gradient, gemm facet 1.5): with gelu's gradient, z (FP32, after
//   alpha and beta) times gelu'(pre_activation) rides CUBLASLT_EPILOGUE_DGELU (aux pointer = the
//   pre_activation, aux ld = our n) where cuBLASLt can take it: 16/32-bit inputs, beta == 0, the
//   pre_activation in D's dtype, n % 8 == 0 (D is C, or fp32 scratch with an fp32 pre_activation,
//   encoded once into C). Otherwise (FP8 operands, beta != 0, another pre_activation dtype, odd n,
//   or a DGELU plan cuBLASLt declines) D is fp32 (C itself when fp32, else scratch) and one kernel
//   (kernels::activation_backward) multiplies it by gelu' in FP32 and rounds once into C. The
//   column / row sums are the facet's (cuda_gemm_facet.h), never cuBLASLt's BGRAD epilogues.
// - Strided-batched GEMMs (run_batched) are one cuBLASLt matmul over every batch:
//   CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT and STRIDED_BATCH_OFFSET on the A, B and D layouts, when A
//   and B share a non-FP8 dtype (fp32/tf32, bf16, fp16: attention's QKᵀ and PV) and the strides
//   are >= 0. A D in fp32 scratch (C's dtype not in cuBLASLt's table) is packed [batch, m, n]
//   and encoded into C by one cast when C is packed too. Mixed or FP8 inputs (their decoded or
//   transposed operands live in per-call scratch), negative strides and k = 0 run one GEMM per
//   batch through run().
// - One plan per (m, n, k, transposes, A/B/D types, compute, epilogue, bias type, beta != 0,
//   A/B/C/D alignment, bias/aux alignment, fp8 scales, batch count and strides): descriptors
//   plus the heuristic's best algorithm, cached; a combination cuBLASLt declines is remembered and
//   the next strategy is used. Per-call pointers (bias, aux) are set on the cached descriptor
//   before each matmul.
// - FP8 accumulation: cuBLASLt's default (periodic promotion to FP32); fp8_fast_accumulation
//   sets CUBLASLT_MATMUL_DESC_FAST_ACCUM on every native FP8 plan, forward and backward
//   (Transformer Engine sets it for forward GEMMs only; faster on Hopper, less exact).
// - Workspace: 32 MiB by default (GemmTuning), allocated once. Not thread-safe: one engine per
//   backend.
// - Alignment: the heuristic's MIN_ALIGNMENT_{A,B,C,D}_BYTES preferences are each operand's own
//   pointer alignment (up to 256; a D in fp32 scratch is 256-byte aligned), part of the plan key.
//   With GemmTuning::realign, a large 16-bit GEMM whose rows are not 16 bytes apart (the LM head's
//   odd vocabulary) runs on copies with padded rows (cuda_gemm_routes.h's realign_for; the leading
//   dimensions are part of the plan key), C copied back after the matmul; routes that would run a
//   kernel on C after it are not taken then, and if none is left the GEMM runs as it is.
// - Algorithm: cuBLASLt's first heuristic result by default, so a shape always runs the same
//   kernel (bitwise-reproducible results). GemmTuning can take the i-th result instead (for
//   benchmarks: each candidate's speed) or, with autotune_candidates = N > 1, time the first N
//   candidates at a plan's first run and keep the fastest, as cudnn.benchmark does: one untimed
//   call each, then autotune_rounds rounds that time every candidate once (interleaved, CUDA
//   events), the lowest median winning (cuda_gemm_autotune.h: ties and differences within
//   autotune_tolerance keep the earlier heuristic index, declined candidates are skipped). The
//   timing calls run on the call's own operands and have no effect: with beta == 0 each rewrites
//   the same D, with beta != 0 they write a scratch D (released afterwards) so C accumulates once.
//   No timing while the stream is being captured, or when the scratch D cannot be allocated: the
//   heuristic's first choice stays. Cost: N x (1 + rounds) GEMMs once per plan.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cuda_gemm_routes.h"
#include "cuda_scratch.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"
#include "mixtrain/sdk/support/gemm_plan_key.h"

namespace mixtrain::backend_cuda {

struct GemmTuning {
  std::size_t workspace_bytes = std::size_t{32} << 20;
  // >= 0: every plan takes this heuristic result (0: cuBLASLt's first choice); a plan whose
  // heuristic offers fewer is unusable, so the next route runs (plan_infos() tells).
  int heuristic_result = 0;
  // > 1: ask for this many results and keep the fastest on the first run's own operands
  // (heuristic_result is then ignored).
  int autotune_candidates = 0;
  // Timed rounds per candidate (each round times every candidate once); at least 1.
  int autotune_rounds = 5;
  // A later candidate must be faster than the current choice by more than this fraction.
  float autotune_tolerance = 0.005f;
  // Copy operands (and C) whose rows are not 16-byte aligned into padded scratch first
  // (cuda_gemm_routes.h, realign_for): the backend option gemm_realign.
  bool realign = false;
};

class GemmEngine {
 public:
  GemmEngine(int sm_version, cudaStream_t stream, bool fp8_fast_accumulation = false,
             GemmTuning tuning = {});
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  void run(const sdk::GemmArgs& args);
  // gemm_strided_batched; the caller has checked the arguments (gemm_batched_shape).
  void run_batched(const sdk::GemmBatchedArgs& args);
  // gemm_gradient's GEMM and activation gradient (not its sums); the caller has checked the
  // arguments (gemm_gradient_shape).
  void run_gradient(const sdk::GemmGradientArgs& args);

  bool fp8_native() const { return sm_ >= 89; }
  bool realigns() const { return tuning_.realign; }
  // Runs when a scratch buffer cannot grow (the backend frees its allocator's cached blocks).
  void set_out_of_memory_hook(const std::function<void()>& hook);
  // The backend's count of live step graphs: scratch they point into outlives its growth
  // (DeviceScratch::set_graph_guard).
  void set_graph_guard(const int* live_graphs);
  // The scratch those graphs kept alive: freed once the stream is idle and none is left.
  void free_retired_scratch() noexcept;
  std::size_t cached_plans() const { return plans_.size(); }
  // One line per cached plan: the cuBLASLt problem (m, n, k as cuBLASLt sees them, transposes,
  // types, epilogue), what became of it (usable, no heuristic result, declined at the matmul with
  // cuBLASLt's status) and how many GEMMs it ran. Tells which route a GEMM really took.
  std::vector<std::string> plan_report() const;
  struct PlanInfo {
    std::string problem;  // m, n, k as cuBLASLt sees them, transposes, types, epilogue
    bool usable = false;
    std::string status;  // "usable", or why not
    std::uint64_t runs = 0;
    int candidate = -1;         // which heuristic result runs (-1: none)
    int candidates = 0;         // how many the heuristic offered
    std::string algo;           // cuBLASLt's algorithm id, tile, stages, split-k, swizzle, cluster
    std::size_t workspace = 0;  // bytes the algorithm uses
    std::string tuning;         // autotuning's measurement, empty when none ran
  };
  std::vector<PlanInfo> plan_infos() const;
  // Workspace plus scratch, for the memory statistics.
  std::size_t device_bytes() const;
  std::size_t workspace_bytes() const { return tuning_.workspace_bytes; }
  // The handle and workspace, which the block-scaled engine (cuda_block_scaled_gemm.h) shares on
  // the same stream.
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }

 private:
  // m, n, k and the transposes are cuBLASLt's (m and n swapped, its A is our B).
  struct Key : sdk::GemmPlanKey {
    int a_type, b_type, d_type;
    int compute;
    int epilogue;   // cublasLtEpilogue_t
    int bias_type;  // cudaDataType_t of the bias when the epilogue has one, else 0
    bool beta_nonzero, fp8_scales;
    // Of cuBLASLt's A, B and C/D pointers: the heuristic's minimum-alignment preferences.
    int a_alignment, b_alignment, d_alignment;
    int epilogue_alignment;  // of the bias and aux pointers: their placeholders' alignment
    // Strided batch (cuBLASLt's A, B, D; elements): batch 1 is a plain GEMM (strides 0).
    std::int64_t batch, stride_a, stride_b, stride_d;
    // Leading dimensions of cuBLASLt's A, B and D in elements; 0: packed (a realigned copy's
    // padded rows otherwise).
    std::int64_t ld_a = 0, ld_b = 0, ld_d = 0;
    bool operator==(const Key&) const = default;
    auto fields() const {
      return std::tie(a_type, b_type, d_type, compute, epilogue, bias_type, beta_nonzero,
                      fp8_scales, a_alignment, b_alignment, d_alignment, epilogue_alignment, batch,
                      stride_a, stride_b, stride_d, ld_a, ld_b, ld_d);
    }
  };
  // Our strided batch (elements between consecutive A, B, C matrices); count 1: one GEMM.
  struct Batch {
    std::int64_t count = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  };
  struct Plan {
    bool ok = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::string status;       // "usable", or why not
    std::uint64_t runs = 0;   // matmuls it ran
    int candidate = -1, candidates = 0;
    std::size_t algo_workspace = 0;
    // Autotuning: the heuristic's results, timed at the first run and then cleared.
    std::vector<cublasLtMatmulHeuristicResult_t> untimed;
    std::string tuning;  // what the timing found, for plan_report(); empty when none ran
  };
  // An operand as it enters cuBLASLt.
  struct Operand {
    const void* data;
    sdk::DType dtype;  // fp32, bf16, fp16, fp8_e4m3, fp8_e5m2 (tf32 views are fp32)
    bool transpose;
    std::int64_t rows, cols;  // stored shape (row-major)
    float scale_inv;          // fp8 only
    std::int64_t ld = 0;      // elements from row to row; 0: cols (packed)
  };

  Plan& plan_for(const Key& key);
  Plan create_plan(const Key& key);
  // Tries one strategy; false when cuBLASLt declines it (nothing was written then).
  // ldc: C's leading dimension when it is a realigned scratch (0: packed).
  // grad_pre: gemm_gradient's pre_activation when it asks for gelu's gradient, else null.
  bool try_run(const sdk::GemmArgs& args, const Operand& a, const Operand& b, float alpha,
               bool tf32, bool fp8_scales, const GemmRoute& route, std::int64_t m, std::int64_t n,
               std::int64_t k, const Batch& batch, std::int64_t ldc = 0,
               const sdk::TensorView* grad_pre = nullptr);
  // One 16-bit GEMM on realigned copies (GemmTuning::realign); false when no route ran.
  bool run_realigned(const sdk::GemmArgs& args, const Operand& a, const Operand& b,
                     const Realign& realign, bool tf32, std::int64_t m, std::int64_t n,
                     std::int64_t k, const sdk::TensorView* grad_pre);
  // `in` copied into `scratch` with its rows padded to 16 bytes (aligned_ld).
  Operand padded(const Operand& in, DeviceScratch& scratch);
  // run() for one GEMM (batch.count 1) or, when run_batched chose it, a native strided batch;
  // run_gradient() with grad_pre.
  void run_impl(const sdk::GemmArgs& args, const Batch& batch,
                const sdk::TensorView* grad_pre = nullptr);
  Operand decoded(const Operand& in, sdk::DType to, bool apply_scale,
                  DeviceScratch& scratch);
  Operand transposed(const Operand& in, DeviceScratch& scratch);
  // Times plan.untimed with `matmul` (one algorithm per call, writing D to `out`) and keeps the
  // fastest in plan.algo (cuda_gemm_autotune.h's rule).
  using TimedMatmul = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&, void* out)>;
  void autotune(Plan& plan, void* out, const TimedMatmul& matmul);

  int sm_;
  cudaStream_t stream_;
  bool fp8_fast_accumulation_;
  GemmTuning tuning_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  // Device: cuBLASLt's A scale_inv at [0], its B scale_inv at [kScaleStride]. cuBLASLt 13 on
  // sm_90 declines every FP8 algorithm (NOT_SUPPORTED at the matmul, after a heuristic that
  // offered them) when a scale pointer is only 4-byte aligned; each sits on its own 256 bytes.
  static constexpr std::size_t kScaleStride = 64;
  float* scales_ = nullptr;
  std::unordered_map<Key, Plan, sdk::GemmPlanKeyHash> plans_;
  DeviceScratch scratch_a_, scratch_b_, scratch_d_, scratch_bias_;
  DeviceScratch scratch_c_;     // a realigned C
  DeviceScratch scratch_tune_;  // autotuning's D for beta != 0 plans, released after each tuning
};

}  // namespace mixtrain::backend_cuda
