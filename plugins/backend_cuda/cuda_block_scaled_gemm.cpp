// gemm_block_scaled through cuBLASLt's block-scaled matmul (contract in the header).
#include "cuda_block_scaled_gemm.h"

#include <cublas_api.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "cuda_access.h"
#include "cuda_block_scaled_kernels.h"
#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::backend_cuda {

using sdk::DType;

namespace {

namespace bs = block_scales;

constexpr const char* kOp = "gemm_block_scaled";
constexpr const char* kHostBugHint =
    "a host bug: the block-scaled operands do not fit their layout";

void check_cublas(cublasStatus_t status, const std::string& what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail(kOp,
       what + " failed: " + cublasLtGetStatusName(status) + ": " + cublasLtGetStatusString(status),
       "report the shapes; run block-scaled policies on the CPU simulator (--set "
       "backend.type=cpu) meanwhile");
}

// [rows, cols] as stored: a rank-2 (or flattened) view.
void stored_shape(const sdk::TensorView& codes, std::int64_t& rows, std::int64_t& cols) {
  cols = codes.shape.cols();
  rows = cols == 0 ? 0 : codes.numel() / cols;
}

void check_operand(const sdk::BlockScaledOperand& op, std::int64_t rows, std::int64_t cols,
                   const char* which) {
  const std::string who = std::string("operand ") + which + ": ";
  if (op.codes.data == nullptr || sdk::dtype_size(op.codes.dtype) != 1)
    fail(kOp, who + "codes must be 1-byte storage", kHostBugHint);
  sdk::BlockExtent grid{};
  try {
    grid = sdk::block_grid(op.layout, rows, cols);
  } catch (const std::invalid_argument& e) {
    fail(kOp, who + e.what(), kHostBugHint);
  }
  if (op.scales.data == nullptr || op.scales.dtype != DType::fp32 ||
      op.scales.numel() != grid.rows * grid.cols)
    fail(kOp,
         who + "scales must be fp32 [" + std::to_string(grid.rows) + ", " +
             std::to_string(grid.cols) + "] for " + sdk::describe(op.layout),
         kHostBugHint);
}

// The scale family of a layout: the cuBLASLt scale modes it maps to.
enum class Family { fp32, mx, nvfp4, other };

Family family_of(const sdk::BlockScaledLayout& l) {
  if (l.scale == sdk::BlockScale::fp32 || l.scale == sdk::BlockScale::fp32_pow2)
    return l.tensor_scale || l.element == sdk::BlockElement::e2m1 ? Family::other : Family::fp32;
  if (l.scale == sdk::BlockScale::e8m0 || l.scale == sdk::BlockScale::e8m0_round_up)
    return l.tensor_scale || l.element == sdk::BlockElement::e2m1 ? Family::other : Family::mx;
  return l.element == sdk::BlockElement::e2m1 ? Family::nvfp4 : Family::other;
}

// One operand as cuBLASLt reads it: op(X) [outer, k] with k contiguous, and its scales.
struct LtOperand {
  const void* codes = nullptr;
  const void* scales = nullptr;
  const float* tensor_scale = nullptr;  // NVFP4's S_dec, folded into alpha
  cudaDataType_t type = CUDA_R_8F_E4M3;
  int mode = 0;  // cublasLtMatmulMatrixScale_t
  bool two_d = false;
};

#if CUBLAS_VERSION >= 120900
// The block extent along k each family's scale mode takes.
std::int64_t k_block_of(Family f) {
  return f == Family::fp32 ? 128 : f == Family::mx ? 32 : 16;
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// frame_transpose: op-frame (o, kk) is stored (kk, o). outer_pad / k_pad: the extents cuBLASLt
// is given.
LtOperand prepare(const sdk::BlockScaledOperand& op, bool frame_transpose, std::int64_t outer,
                  std::int64_t k, std::int64_t outer_pad, std::int64_t k_pad,
                  DeviceScratch& codes_scratch, DeviceScratch& scales_scratch, const char* which,
                  cudaStream_t stream) {
  const sdk::BlockScaledLayout& l = op.layout;
  const std::string who = std::string("operand ") + which + " (" + sdk::describe(l) + ")";
  const char* hint =
      "run this layout on the CPU backend's simulator (--set backend.type=cpu); the CUDA backend "
      "runs fp8-block (1x128 activations and gradients, 128x128 weights) on sm_90 and mxfp8 "
      "(1x32) / nvfp4 (1x16, 16x16 weights) on sm_100+";
  const Family family = family_of(l);
  if (family == Family::other) fail(kOp, who + ": not a layout of fp8-block, mxfp8 or nvfp4", hint);
  const std::int64_t kb = k_block_of(family);
  const std::int64_t along_k = frame_transpose ? l.block_rows : l.block_cols;
  const std::int64_t along_outer = frame_transpose ? l.block_cols : l.block_rows;
  LtOperand r;
  // A 16 x 16 NVFP4 block is sixteen 1 x 16 blocks with one scale: VEC16 takes it as they are.
  r.two_d = family == Family::fp32 && along_k == 128 && along_outer == 128;
  const bool one_d = along_k == kb && along_outer == 1;
  const bool square16 = family == Family::nvfp4 && along_k == 16 && along_outer == 16;
  if (!r.two_d && !one_d && !square16)
    fail(kOp,
         who + ": cuBLASLt scales blocks of " + std::to_string(kb) + " along the reduction dim" +
             (family == Family::fp32    ? " or 128x128"
              : family == Family::nvfp4 ? " or 16x16"
                                        : "") +
             "; these are " + std::to_string(along_outer) + "x" + std::to_string(along_k) +
             " (outer x reduction)",
         hint);
  r.type = family == Family::nvfp4                ? CUDA_R_4F_E2M1
           : l.element == sdk::BlockElement::e5m2 ? CUDA_R_8F_E5M2
                                                  : CUDA_R_8F_E4M3;
  const auto* codes = static_cast<const std::uint8_t*>(op.codes.data);
  std::int64_t rows = 0, cols = 0;
  stored_shape(op.codes, rows, cols);
  if (family == Family::nvfp4) {
    // The SDK stores one E2M1 code per byte; cuBLASLt reads two per byte.
    auto* packed = static_cast<std::uint8_t*>(
        codes_scratch.get(static_cast<std::size_t>(outer_pad * (k_pad / 2)), stream, kOp));
    check_cuda(kernels::pack_e2m1_k_major(codes, cols, frame_transpose, outer, k, outer_pad, k_pad,
                                          packed, stream),
               kOp, "E2M1 packing kernel");
    r.codes = packed;
  } else if (!frame_transpose && outer_pad == outer && k_pad == k && aligned16(codes)) {
    r.codes = codes;
  } else {
    auto* packed = static_cast<std::uint8_t*>(
        codes_scratch.get(static_cast<std::size_t>(outer_pad * k_pad), stream, kOp));
    check_cuda(kernels::pack_codes_k_major(codes, cols, frame_transpose, outer, k, outer_pad, k_pad,
                                           packed, stream),
               kOp, "operand packing kernel");
    r.codes = packed;
  }
  const bs::ScaleSource source{(cols + l.block_cols - 1) / l.block_cols, l.block_rows, l.block_cols,
                               frame_transpose};
  const auto* sdk_scales = static_cast<const float*>(op.scales.data);
  const std::int64_t L = (k + kb - 1) / kb;
  if (family == Family::fp32) {
    const std::int64_t count = r.two_d ? bs::blk128_count(outer, L) : bs::vec128_count(outer, L);
    auto* arranged = static_cast<float*>(
        scales_scratch.get(static_cast<std::size_t>(count) * sizeof(float), stream, kOp));
    check_cuda(
        kernels::arrange_fp32_scales(sdk_scales, source, r.two_d, outer, k, arranged, stream), kOp,
        "scale arrangement kernel");
    r.scales = arranged;
    r.mode = r.two_d ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                     : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  } else {
    // The tiled layout covers the k cuBLASLt is given: k_pad / kb blocks, not L.
    const std::int64_t count = bs::tiled_count(outer, k_pad / kb);
    auto* arranged = static_cast<std::uint8_t*>(
        scales_scratch.get(static_cast<std::size_t>(count), stream, kOp));
    check_cuda(kernels::arrange_byte_scales(sdk_scales, source, kb, family == Family::mx, outer, k,
                                            k_pad, arranged, stream),
               kOp, "scale arrangement kernel");
    r.scales = arranged;
    r.mode = family == Family::mx ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0
                                  : CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    // NVFP4's second level is optional (S_enc = 1 without it: sdk/backend_gemm.h); a layout
    // with one needs its fp32 [1].
    if (family == Family::nvfp4 && l.tensor_scale) {
      if (op.tensor_scale.data == nullptr || op.tensor_scale.dtype != DType::fp32 ||
          op.tensor_scale.numel() != 1)
        fail(kOp, who + ": an NVFP4 operand needs its fp32 tensor scale [1]", kHostBugHint);
      r.tensor_scale = static_cast<const float*>(op.tensor_scale.data);
    }
  }
  return r;
}

cudaDataType_t d_type_of(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : t == DType::fp16 ? CUDA_R_16F : CUDA_R_32F;
}
#endif

}  // namespace

BlockScaledGemmEngine::BlockScaledGemmEngine(cublasLtHandle_t handle, void* workspace,
                                             std::size_t workspace_bytes, cudaStream_t stream)
    : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes), stream_(stream) {}

BlockScaledGemmEngine::~BlockScaledGemmEngine() {
  for (auto& entry : plans_) {
    Plan& p = entry.second;
    if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
    if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d != nullptr) cublasLtMatrixLayoutDestroy(p.d);
  }
}

void BlockScaledGemmEngine::set_out_of_memory_hook(const std::function<void()>& hook) {
  for (DeviceScratch* s : {&codes_a_, &codes_b_, &scales_a_, &scales_b_, &d_, &scalars_})
    s->set_out_of_memory_hook(hook);
}

void BlockScaledGemmEngine::set_graph_guard(const int* live_graphs) {
  for (DeviceScratch* s : {&codes_a_, &codes_b_, &scales_a_, &scales_b_, &d_, &scalars_})
    s->set_graph_guard(live_graphs);
}

void BlockScaledGemmEngine::free_retired_scratch() noexcept {
  for (DeviceScratch* s : {&codes_a_, &codes_b_, &scales_a_, &scales_b_, &d_, &scalars_})
    s->free_retired();
}

std::size_t BlockScaledGemmEngine::device_bytes() const {
  return codes_a_.capacity() + codes_b_.capacity() + scales_a_.capacity() + scales_b_.capacity() +
         d_.capacity() + scalars_.capacity();
}

BlockScaledGemmEngine::Plan& BlockScaledGemmEngine::plan_for(const Key& key,
                                                             const void* scale_placeholder) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan& plan = plans_[key];
#if CUBLAS_VERSION >= 120900
  const auto [m_lt, n_lt, k, a_type, b_type, a_mode, b_mode, d_type, ldd, beta_nonzero,
              device_scalars, a_align, b_align, d_align] = key;
  (void)beta_nonzero;
  if (cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) !=
      CUBLAS_STATUS_SUCCESS) {
    plan.desc = nullptr;
    return plan;
  }
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // "TN": k contiguous in both
  const std::int32_t modes[2] = {a_mode, b_mode};
  bool ok = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                           sizeof ta) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                           sizeof tb) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &modes[0],
                                           sizeof modes[0]) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &modes[1],
                                           sizeof modes[1]) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                           &scale_placeholder,
                                           sizeof scale_placeholder) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                           &scale_placeholder,
                                           sizeof scale_placeholder) == CUBLAS_STATUS_SUCCESS;
  const cublasLtPointerMode_t pointer_mode =
      device_scalars ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
  ok = ok &&
       cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pointer_mode,
                                      sizeof pointer_mode) == CUBLAS_STATUS_SUCCESS;
  // cuBLASLt's A is [k, m_lt] and its B [k, n_lt], column-major, k contiguous; D [m_lt, n_lt].
  ok = ok && cublasLtMatrixLayoutCreate(
                 &plan.a, static_cast<cudaDataType_t>(a_type), static_cast<std::uint64_t>(k),
                 static_cast<std::uint64_t>(m_lt), k) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(
                 &plan.b, static_cast<cudaDataType_t>(b_type), static_cast<std::uint64_t>(k),
                 static_cast<std::uint64_t>(n_lt), k) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(
                 &plan.d, static_cast<cudaDataType_t>(d_type), static_cast<std::uint64_t>(m_lt),
                 static_cast<std::uint64_t>(n_lt), ldd) == CUBLAS_STATUS_SUCCESS;
  if (!ok) return plan;
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return plan;
  const std::uint64_t ws = workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, int> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, a_align},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, b_align},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, d_align},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, d_align}};
  for (const auto& [attr, bytes] : alignments) {
    const auto align = static_cast<std::uint32_t>(bytes);
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
  }
  // FP32 split-K reductions only for a 16-bit D, as the plain engine (cuda_gemm.cpp) says why.
  if (d_type != CUDA_R_32F) {
    const std::uint32_t schemes =
        CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                         sizeof schemes);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, 1, &result, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan.algo = result.algo;
    plan.ok = true;
  }
#else
  (void)key;
  (void)scale_placeholder;
#endif
  return plan;
}

void BlockScaledGemmEngine::run(const sdk::BlockScaledGemmArgs& args) {
  std::int64_t ar = 0, ac = 0, br = 0, bc = 0;
  stored_shape(args.a.codes, ar, ac);
  stored_shape(args.b.codes, br, bc);
  check_operand(args.a, ar, ac, "A");
  check_operand(args.b, br, bc, "B");
  const std::int64_t m = args.a.transpose ? ac : ar, k = args.a.transpose ? ar : ac;
  const std::int64_t kb = args.b.transpose ? bc : br, n = args.b.transpose ? br : bc;
  if (k != kb)
    fail(kOp,
         "op(A) is [" + std::to_string(m) + ", " + std::to_string(k) + "] but op(B) is [" +
             std::to_string(kb) + ", " + std::to_string(n) + "]",
         kHostBugHint);
  if (!is_storage_float(args.c.dtype) || args.c.numel() != m * n)
    fail(kOp,
         "C must be fp32, bf16 or fp16 [m, n] = [" + std::to_string(m) + ", " + std::to_string(n) +
             "], not " + describe(args.c),
         kHostBugHint);
  const bool has_bias = !args.bias.empty();
  if (has_bias && (args.bias.dtype != DType::fp32 || args.bias.numel() != n))
    fail(kOp, "bias must be fp32 [n], not " + describe(args.bias), kHostBugHint);
  const bool has_pre = args.has_activation && !args.pre_activation.empty();
  if (has_pre &&
      (!is_storage_float(args.pre_activation.dtype) || args.pre_activation.numel() != m * n))
    fail(kOp,
         "pre_activation must be fp32, bf16 or fp16 [m, n], not " + describe(args.pre_activation),
         kHostBugHint);
  const Family family = family_of(args.a.layout);
  if (family_of(args.b.layout) != family)
    fail(kOp,
         "operand A is " + sdk::describe(args.a.layout) + " but B is " +
             sdk::describe(args.b.layout) + ": cuBLASLt pairs only operands of one recipe",
         kHostBugHint);
  if (m == 0 || n == 0) return;
#if CUBLAS_VERSION >= 120900
  const kernels::Elem c_elem = elem_of(args.c.dtype);
  const int act = args.activation == sdk::Activation::relu ? 0 : 1;
  void* pre = has_pre ? args.pre_activation.data : nullptr;
  const kernels::Elem pre_elem = has_pre ? elem_of(args.pre_activation.dtype) : kernels::Elem::f32;
  const auto* bias = has_bias ? static_cast<const float*>(args.bias.data) : nullptr;
  // cuBLASLt: D[m_lt = n, n_lt = m] (column-major) is our C [m, n] (row-major).
  // The outer dims cuBLASLt takes: multiples of 4 for the fp32 scale modes, of 16 for the MX /
  // NVFP4 ones (their 16-byte rows of packed FP4 codes and tiled scales).
  const std::int64_t outer_multiple = family == Family::fp32 ? 4 : 16;
  const bool direct = !has_bias && !args.has_activation && m % outer_multiple == 0 &&
                      n % outer_multiple == 0 &&
                      (n * static_cast<std::int64_t>(sdk::dtype_size(args.c.dtype))) % 16 == 0 &&
                      aligned16(args.c.data);
  const std::int64_t m_lt = direct ? n : bs::round_up(n, outer_multiple);
  const std::int64_t n_lt = direct ? m : bs::round_up(m, outer_multiple);
  if (k == 0) {  // no products: z = beta * C + bias
    auto* d =
        static_cast<float*>(d_.get(static_cast<std::size_t>(m * n) * sizeof(float), stream_, kOp));
    check_cuda(cudaMemsetAsync(d, 0, static_cast<std::size_t>(m * n) * sizeof(float), stream_), kOp,
               "cudaMemsetAsync");
    check_cuda(kernels::block_gemm_epilogue(d, n, m, n, args.c.data, c_elem, args.beta, bias,
                                            args.has_activation, act, pre, pre_elem, stream_),
               kOp, "epilogue kernel");
    return;
  }
  const std::int64_t k_pad = bs::round_up(k, 128);
  // cuBLASLt's A is our B (op-frame op(B)^T, [n, k]: stored (kk, j) unless B is transposed).
  const LtOperand lt_a =
      prepare(args.b, !args.b.transpose, n, k, m_lt, k_pad, codes_b_, scales_b_, "B", stream_);
  const LtOperand lt_b =
      prepare(args.a, args.a.transpose, m, k, n_lt, k_pad, codes_a_, scales_a_, "A", stream_);
  if (lt_a.two_d && lt_b.two_d)
    fail(kOp, "both operands have 128x128 blocks, a product cuBLASLt does not offer",
         "block one of them 1x128 along the reduction dim (the fp8-block recipe blocks only the "
         "weight 128x128)");
  if (lt_a.type == CUDA_R_8F_E5M2 && lt_b.type == CUDA_R_8F_E5M2)
    fail(kOp, "both operands are e5m2, a product cuBLASLt's FP8 kernels do not offer",
         "quantize one of them to e4m3");
  const cudaDataType_t d_type = direct ? d_type_of(args.c.dtype) : CUDA_R_32F;
  const std::int64_t ldd = m_lt;
  const float beta = direct ? args.beta : 0.0f;
  // NVFP4's tensor scales live on the device: alpha and beta go to cuBLASLt by device pointer.
  const bool device_scalars = lt_a.tensor_scale != nullptr || lt_b.tensor_scale != nullptr;
  const Key key{m_lt,
                n_lt,
                k_pad,
                static_cast<int>(lt_a.type),
                static_cast<int>(lt_b.type),
                lt_a.mode,
                lt_b.mode,
                static_cast<int>(d_type),
                ldd,
                beta != 0.0f,
                device_scalars,
                alignment_of(lt_a.codes),
                alignment_of(lt_b.codes),
                direct ? alignment_of(args.c.data) : 256};  // scratch D is 256-byte aligned
  Plan& plan = plan_for(key, lt_a.scales);
  if (!plan.ok)
    fail(kOp,
         "cuBLASLt offers no block-scaled kernel for m=" + std::to_string(m) +
             " n=" + std::to_string(n) + " k=" + std::to_string(k) + " (A " +
             sdk::describe(args.a.layout) + ", B " + sdk::describe(args.b.layout) + ")",
         "report this shape; run it on the CPU backend's simulator (--set backend.type=cpu) "
         "meanwhile");
  // Set every call: the arranged scales live in scratch that may have moved.
  check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                              &lt_a.scales, sizeof lt_a.scales),
               "setting the A scale pointer");
  check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                              &lt_b.scales, sizeof lt_b.scales),
               "setting the B scale pointer");
  void* d = args.c.data;
  if (!direct) d = d_.get(static_cast<std::size_t>(m_lt * n_lt) * sizeof(float), stream_, kOp);
  const float alpha = args.alpha;
  const float* alpha_ptr = &alpha;
  const float* beta_ptr = &beta;
  if (device_scalars) {
    auto* scalars = static_cast<float*>(scalars_.get(2 * sizeof(float), stream_, kOp));
    check_cuda(kernels::block_gemm_scalars(alpha, beta, lt_b.tensor_scale, lt_a.tensor_scale,
                                           scalars, stream_),
               kOp, "alpha kernel");
    alpha_ptr = scalars;
    beta_ptr = scalars + 1;
  }
  check_cublas(cublasLtMatmul(handle_, plan.desc, alpha_ptr, lt_a.codes, plan.a, lt_b.codes, plan.b,
                              beta_ptr, d, plan.d, d, plan.d, &plan.algo, workspace_,
                              workspace_bytes_, stream_),
               "cublasLtMatmul (block-scaled)");
  if (!direct)
    check_cuda(kernels::block_gemm_epilogue(static_cast<const float*>(d), ldd, m, n, args.c.data,
                                            c_elem, args.beta, bias, args.has_activation, act, pre,
                                            pre_elem, stream_),
               kOp, "epilogue kernel");
#else
  fail(kOp,
       "this backend was built against cuBLAS headers older than 12.9, which lack the block-scaled "
       "scale modes",
       "rebuild it with CUDA 12.9 or later, or run on the CPU backend (--set backend.type=cpu)");
#endif
}

}  // namespace mixtrain::backend_cuda
