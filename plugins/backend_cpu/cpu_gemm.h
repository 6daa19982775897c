// GemmEngine: C = alpha*op(A)*op(B) + beta*C (+ bias) through cached oneDNN matmul primitives.
//
// Contract
// - Inputs are validated by the engine (dtypes, shapes) and errors are sdk::BackendError.
// - One primitive per (m, n, k, transposes, A/B dtypes, has-bias, alpha, beta) is created on
//   first use and reused; alpha is a constant output scale keyed by its value (oneDNN 2.6's
//   brgemm kernels take no run-time one), or a run-time one, one primitive for all values, where
//   fp8 operands' scale_inv join it; beta a sum post-op, bias the matmul bias argument (oneDNN
//   scales that by alpha, so with alpha != 1 the bias is a binary-add post-op after the sum
//   instead). Transposes are memory-descriptor strides: A and B are never
//   transposed by copying.
// - Input dtypes (prepare_operands): fp32 passes through; tf32 is rounded (RNE, 10 mantissa bits)
//   into scratch; bf16 x bf16 goes to oneDNN's bf16 matmul (f32 accumulation) when the bf16 path
//   is `onednn`, else it is decoded; fp16, fp8 and any mix are decoded exactly to fp32 into
//   scratch, then the fp32 matmul runs. Decoding is exact (every narrow value is an fp32; fp8
//   codes unscaled), so the emulated products are the ones the hardware format feeds its FP32
//   accumulator; the fp8 operands' scale_inv multiply alpha (in double, rounded to fp32 once)
//   and scale the accumulated result once. All conversions are sdk/float_formats.h.
// - A bf16/fp16 C goes through fp32 scratch and is encoded once with the SDK's RNE (beta reads the
//   decoded old C), so C = the fp32 result rounded once. Exception, the native bf16 route (both
//   operands bf16, read by oneDNN's bf16 matmul): a bf16 C without an epilogue (no activation, not
//   run_into) is written by the primitive itself, with no fp32 pass over C. It is oneDNN's FP32
//   accumulation rounded once RNE, subnormal results flushed to zero (as vdpbf16ps already
//   flushes its inputs and products); for a bf16 destination at large k oneDNN sums in an order
//   of its own (an AMX Xeon, [1024, 3072]·[3072, 768]: 63 of 786,432 elements an ulp from the
//   fp32 destination's rounding, as often nearer the exact sum as further; none at k = 768), the
//   same bits on one and two threads. GPT-2 small's linear GEMMs 327 / 324 -> 315 / 311 ms a step
//   in two interleaved pairs (RESULTS.md, session 67).
// - Few rows (decoding's products): bf16 A of at most kFewGemmRows rows, bf16 B stored [n, k]
//   (transposed), alpha 1, beta 0, no activation or epilogue, C fp32 or bf16, with or without
//   bias, run in cpu_few_row_gemm.h's kernel, which reads B at the memory's rate: its FP32 sums
//   rounded once, whichever the bf16 path; last_implementation() says kFewRowsImplementation, and
//   no primitive is cached.
// - Activation epilogue (GemmArgs::has_activation): z goes to fp32 (C itself when C is fp32,
//   scratch otherwise), pre_activation receives z rounded once, the activation runs in place on
//   the fp32 z through `activate`, and a 16-bit C is encoded once from act(z); the three passes
//   run 2^18 elements of z at a time, while those are in cache (element-wise: the numbers of one
//   pass over the whole of z).
// - Strided-batched (run_batched): one 3-D oneDNN matmul (batch, m, k) x (batch, k, n) per
//   (batch, m, n, k, transposes, A/B dtypes, alpha != 1, beta, strides), cached like the 2-D
//   one. The batch stride is the descriptor's outer stride; a stride of 0 is a batch dimension of
//   1 (oneDNN's broadcast). Operands are prepared as for run(): passed through (fp32, native bf16)
//   with the caller's strides, or decoded per batch into compact scratch (one batch when the
//   stride is 0). A 16-bit C goes through compact fp32 scratch and is encoded once per batch.
//   It declines (returns false, having written nothing) what one primitive cannot express: batch
//   <= 1, k = 0, a negative stride, operand batches that overlap (0 < |stride| < rows*cols), or
//   a shape for which oneDNN offers only a reference kernel; the caller then loops over run().
// - Scratch buffers are grow-only and reused across calls; scratch_bytes() reports them.
// - bf16 path, `automatic`: oneDNN when the CPU has AMX-BF16 (checked at run time: cpuid, XCR0,
//   kernel flags) and oneDNN's chosen bf16 implementation is not a reference kernel; emulation
//   otherwise, including AVX512-BF16 without AMX, where emulation measured faster (RESULTS.md). The
//   AVX512-BF16 instruction (vdpbf16ps) flushes subnormal inputs and results to zero; the emulated
//   path is the exact reference.
// - Not thread-safe: one engine per backend, used by one host thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "cpu_context.h"
#include "cpu_scratch_buffer.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"
#include "mixtrain/sdk/support/gemm_plan_key.h"

namespace mixtrain::backend_cpu {

class GemmEngine {
 public:
  static constexpr const char* kFewRowsImplementation = "few_rows:bf16 (mixtrain)";

  explicit GemmEngine(Bf16GemmPath bf16_path = Bf16GemmPath::automatic);
  ~GemmEngine();

  // In-place activation over an fp32 [m, n] view, the backend's activation_forward: a fused
  // epilogue then computes exactly what GEMM-to-fp32 followed by that activation computes.
  using ActivateInPlace = std::function<void(sdk::Activation, const sdk::TensorView&)>;
  void run(const sdk::GemmArgs& args, const ActivateInPlace& activate = {});
  // The same GEMM (args.has_activation must be false), its FP32 product z [m, n] then handed to
  // `into_c`, which writes C from it (z is C itself when C is fp32, else scratch it may
  // overwrite): an epilogue that rounds into C once, in the same pass (gemm_gradient's).
  using EpilogueIntoC = std::function<void(const sdk::TensorView& z, const sdk::TensorView& c)>;
  void run_into(const sdk::GemmArgs& args, const EpilogueIntoC& into_c);
  // The strided-batched GEMM as one primitive; false (nothing written) when it declines.
  bool run_batched(const sdk::GemmBatchedArgs& args);

  // Implementation oneDNN picks for an fp32 / bf16 GEMM on this CPU (for capabilities()); the
  // bf16 one is empty when oneDNN has no bf16 matmul here.
  std::string fp32_implementation();
  std::string bf16_implementation();
  // True when bf16 x bf16 GEMMs run in oneDNN's bf16 matmul, false when emulated.
  bool bf16_native();
  // Whether run() writes a C of dtype `c` from operands of dtypes `a` and `b` (compute `compute`)
  // itself, with no fp32 scratch for C and no epilogue: fp32 always; bf16 on the native bf16
  // route (the C exception above).
  bool writes_c_directly(sdk::DType a, sdk::DType b, sdk::DType c, sdk::DType compute);
  // Why the bf16 path is what it is, for capabilities().
  std::string bf16_note();
  // oneDNN's implementation of the primitive the last GEMM ran (empty before any, or after a
  // k = 0 call); for tests and tuning.
  const std::string& last_implementation() const { return last_implementation_; }
  // Primitives created and in use (a batched key oneDNN could not run well is not counted).
  std::size_t cached_primitives() const;
  // Every cached primitive, sorted: the problem as oneDNN runs it (m, n, k, transposes, dtypes,
  // batch, beta, bias) and its implementation, or why a batched key runs as a loop instead (the
  // plan_report facet's "oneDNN GEMM").
  std::vector<std::string> report() const;
  std::size_t scratch_bytes() const {
    return scratch_a_.capacity() + scratch_b_.capacity() + scratch_c_.capacity() +
           scratch_epilogue_.capacity();
  }
  // `count` floats for a run_into epilogue's own use (gemm_gradient decodes its pre-activation
  // there a block at a time), grow-only and counted as this engine's scratch.
  float* epilogue_scratch(std::size_t count) { return scratch_epilogue_.as<float>(count); }

 private:
  struct Key : sdk::GemmPlanKey {
    bool has_bias, has_alpha;
    dnnl::memory::data_type a_dt, b_dt;
    std::uint32_t beta_bits;
    // Batched keys only (0 for run()'s 2-D primitive): batch count and the strides in elements
    // of the operands as they enter oneDNN (0: broadcast).
    std::int64_t batch = 0, stride_a = 0, stride_b = 0, stride_c = 0;
    // C as the primitive writes it: fp32, or bf16 on the native route (run_product).
    dnnl::memory::data_type c_dt = dnnl::memory::data_type::f32;
    // A constant output scale (set_alpha): 1.0f's bits when there is none, or when has_alpha
    // passes it at run time.
    std::uint32_t alpha_bits = 0x3f800000u;
    bool operator==(const Key&) const = default;
    auto fields() const {
      return std::tie(has_bias, has_alpha, a_dt, b_dt, beta_bits, batch, stride_a, stride_b,
                      stride_c, c_dt, alpha_bits);
    }
  };
  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory::desc a_md, b_md, c_md, bias_md;
    int bias_arg = DNNL_ARG_BIAS;  // or a binary post-op's SRC_1 when alpha must not scale it
    std::string implementation;    // oneDNN's impl_info_str(), e.g. "brg:avx512_core"
    bool usable = true;            // batched only: false when oneDNN has no non-reference kernel
    std::int64_t runs = 0;         // executions, for the plan report
  };
  // Operands as they enter oneDNN: possibly rounded copies of A and B.
  struct Operands {
    const void* a;
    const void* b;
    dnnl::memory::data_type a_dt, b_dt;
  };

  // run() and run_into(): the product into fp32, then the activation and one rounding into C, or
  // into_c's epilogue; on the native bf16 route a bf16 C without either, straight from the matmul.
  void run_product(const sdk::GemmArgs& args, const ActivateInPlace& activate,
                   const EpilogueIntoC& into_c);
  // Whether operands of dtypes `a` and `b` enter oneDNN's bf16 matmul as stored (the native bf16
  // route): both bf16, compute not tf32, and the bf16 path native here.
  bool reads_bf16_natively(sdk::DType a, sdk::DType b, sdk::DType compute);
  Operands prepare_operands(const sdk::GemmArgs& args, std::int64_t a_numel, std::int64_t b_numel);
  const float* operand_fp32(const sdk::GemmOperand& op, std::int64_t numel, bool tf32,
                            ScratchBuffer& scratch);
  // One operand of a batched call as it enters oneDNN, with its batch stride in elements.
  struct BatchedOperand {
    const void* data;
    dnnl::memory::data_type dt;
    std::int64_t stride;
  };
  BatchedOperand batched_operand(const sdk::GemmOperand& op, std::int64_t batch,
                                 std::int64_t stride, bool tf32, bool native,
                                 ScratchBuffer& scratch);
  void check_dtypes(const sdk::GemmArgs& args) const;
  // Whether run_product takes the few-row kernel (the contract's "Few rows").
  static bool few_rows_route(const sdk::GemmArgs& args, std::int64_t m, std::int64_t k,
                             bool epilogue);
  Entry& entry_for(const Key& key);
  // The batched primitive for `key`, or nullptr when oneDNN cannot run it well (remembered).
  Entry* batched_entry_for(const Key& key);
  Entry create_entry(const Key& key) const;
  void execute(Entry& e, const Key& key, const void* a, const void* b, void* c, float alpha,
               const void* bias);

  Bf16GemmPath bf16_request_;
  int bf16_state_ = -1;  // -1 undecided, 0 emulated, 1 oneDNN
  std::string bf16_impl_;
  std::string bf16_note_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::unordered_map<Key, Entry, sdk::GemmPlanKeyHash> cache_;
  ScratchBuffer scratch_a_, scratch_b_, scratch_c_;
  ScratchBuffer scratch_epilogue_;  // epilogue_scratch()
  std::string last_implementation_;
};

}  // namespace mixtrain::backend_cpu
