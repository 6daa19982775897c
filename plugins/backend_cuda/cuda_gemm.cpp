#include "cuda_gemm.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <utility>
#include <vector>

#include "cuda_access.h"
#include "cuda_activation.h"
#include "cuda_candidate_timing.h"
#include "cuda_cast_fill.h"
#include "cuda_gemm_autotune.h"
#include "cuda_gemm_kernels.h"

namespace mixtrain::backend_cuda {

using sdk::DType;

namespace {

constexpr const char* kSupportedInputs =
    "A/B in fp32, tf32, bf16, fp16, fp8_e4m3 or fp8_e5m2 (any mix), C in fp32, bf16 or fp16";

void check_cublas(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail("gemm",
       std::string(what) + " failed: " + cublasLtGetStatusName(status) + ": " +
           cublasLtGetStatusString(status),
       "report the shapes and dtypes of this GEMM; choose backend.type = \"cpu\" meanwhile");
}

bool is_gemm_input(DType t) { return is_storage_float(t) || sdk::is_fp8(t); }

DType storage_of(DType t) { return t == DType::tf32 ? DType::fp32 : t; }

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::fp16: return CUDA_R_16F;
    case DType::fp8_e4m3: return CUDA_R_8F_E4M3;
    case DType::fp8_e5m2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_32F;
  }
}

// The route question for one GEMM of `args` whose A and B enter cuBLASLt as `input`; grad_pre:
// gemm_gradient's pre_activation for gelu's gradient, or null.
GemmRouteQuery route_query(const sdk::GemmArgs& args, DType input, std::int64_t n,
                           const sdk::TensorView* grad_pre) {
  GemmRouteQuery q;
  q.input = input;
  q.c = storage_of(args.c.dtype);
  q.bias = !args.bias.empty();
  q.activation = args.has_activation;
  q.act = args.activation;
  q.pre_activation = !args.pre_activation.empty();
  q.pre_activation_dtype = storage_of(args.pre_activation.dtype);
  q.n = n;
  if (grad_pre != nullptr) {
    q.activation_grad = true;
    q.pre_activation_dtype = storage_of(grad_pre->dtype);
    q.beta_nonzero = args.beta != 0.0f;
  }
  return q;
}

bool epilogue_has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

bool epilogue_has_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU;
}

// The cuBLASLt epilogue for a bias, an activation and a gelu aux output, each optional.
cublasLtEpilogue_t epilogue_for(bool bias, bool activation, sdk::Activation act, bool aux) {
  if (!activation) return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (act == sdk::Activation::relu) return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  if (aux) return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
}

int activation_code(sdk::Activation act) { return act == sdk::Activation::relu ? 0 : 1; }

template <typename T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  std::size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof value, &written) !=
      CUBLAS_STATUS_SUCCESS)
    return T{};
  return value;
}

// The numbers cublasLt.h's enums give an algorithm's configuration: tells two candidates apart.
std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  return "id=" + std::to_string(algo_config<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)) +
         " tile=" + std::to_string(algo_config<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) +
         " stages=" +
         std::to_string(algo_config<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)) +
         " splitk=" +
         std::to_string(algo_config<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) +
         " swizzle=" +
         std::to_string(algo_config<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)) +
         " cluster=" +
         std::to_string(algo_config<std::uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

}  // namespace

GemmEngine::GemmEngine(int sm_version, cudaStream_t stream, bool fp8_fast_accumulation,
                       GemmTuning tuning)
    : sm_(sm_version),
      stream_(stream),
      fp8_fast_accumulation_(fp8_fast_accumulation),
      tuning_(tuning) {
  // The epilogue placeholders point into the workspace (create_plan): it is never empty.
  tuning_.workspace_bytes = std::max<std::size_t>(tuning_.workspace_bytes, 256);
  tuning_.heuristic_result = std::max(tuning_.heuristic_result, 0);
  tuning_.autotune_rounds = std::max(tuning_.autotune_rounds, 1);
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
  cudaError_t status = cudaMalloc(&workspace_, tuning_.workspace_bytes);
  if (status == cudaSuccess) status = cudaMalloc(reinterpret_cast<void**>(&scales_), 2 * kScaleStride * sizeof(float));
  if (status != cudaSuccess) {
    if (workspace_ != nullptr) cudaFree(workspace_);
    cublasLtDestroy(handle_);
    check_cuda(status, "create",
               "cudaMalloc of the " + std::to_string(tuning_.workspace_bytes >> 20) +
                   " MiB cuBLASLt workspace");
  }
}

GemmEngine::~GemmEngine() {
  for (auto& [key, plan] : plans_) {
    if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
    if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.d != nullptr) cublasLtMatrixLayoutDestroy(plan.d);
  }
  if (scales_ != nullptr) cudaFree(scales_);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void GemmEngine::set_out_of_memory_hook(const std::function<void()>& hook) {
  for (DeviceScratch* s :
       {&scratch_a_, &scratch_b_, &scratch_d_, &scratch_bias_, &scratch_tune_, &scratch_c_})
    s->set_out_of_memory_hook(hook);
}

void GemmEngine::set_graph_guard(const int* live_graphs) {
  // Not scratch_tune_: autotuning never runs while the stream is captured.
  for (DeviceScratch* s : {&scratch_a_, &scratch_b_, &scratch_d_, &scratch_bias_, &scratch_c_})
    s->set_graph_guard(live_graphs);
}

void GemmEngine::free_retired_scratch() noexcept {
  for (DeviceScratch* s : {&scratch_a_, &scratch_b_, &scratch_d_, &scratch_bias_, &scratch_c_})
    s->free_retired();
}

std::size_t GemmEngine::device_bytes() const {
  return tuning_.workspace_bytes + scratch_a_.capacity() + scratch_b_.capacity() +
         scratch_d_.capacity() + scratch_bias_.capacity() + scratch_c_.capacity();
}

GemmEngine::Plan& GemmEngine::plan_for(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  return plans_.emplace(key, create_plan(key)).first->second;
}

GemmEngine::Plan GemmEngine::create_plan(const Key& key) {
  Plan plan;
  plan.status = "cuBLASLt refused a descriptor or layout";
  const auto compute = static_cast<cublasComputeType_t>(key.compute);
  if (cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
    plan.desc = nullptr;
    return plan;
  }
  // Every attribute must take: a refused epilogue or scale pointer would leave a descriptor that
  // still finds algorithms but computes without it (a wrong result, not a declined plan).
  bool described = true;
  const auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* value,
                       std::size_t bytes) {
    described = described && cublasLtMatmulDescSetAttribute(plan.desc, attribute, value, bytes) ==
                                 CUBLAS_STATUS_SUCCESS;
  };
  const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  const auto epi = static_cast<cublasLtEpilogue_t>(key.epilogue);
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    // The heuristic reads only the placeholders' alignment (cublasLt.h, BIAS_POINTER and
    // AUX_POINTER), so they carry exactly the real pointers' alignment; every call sets the real
    // ones. workspace_ is 256-byte aligned, so workspace_ + a is aligned to a (a < 256).
    const int a = key.epilogue_alignment;
    const void* placeholder = static_cast<const char*>(workspace_) + (a < 256 ? a : 0);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (epilogue_has_bias(epi)) {
      const auto bias_type = static_cast<cudaDataType_t>(key.bias_type);
      set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
      set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &placeholder, sizeof placeholder);
    }
    if (epilogue_has_aux(epi)) {
      // The aux matrix (GELU_AUX's output, DGELU's input) is laid out like D.
      const std::int64_t aux_ld = key.m;
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &placeholder, sizeof placeholder);
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    }
  }
  if (key.fp8_scales) {
    const float* scale_a = scales_;      // cuBLASLt's A is our B
    const float* scale_b = scales_ + kScaleStride;  // cuBLASLt's B is our A
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof scale_a);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof scale_b);
    if (fp8_fast_accumulation_) {
      const std::int8_t fast = 1;
      set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
    }
  }
  if (!described) {
    plan.status =
        "cuBLASLt refused an attribute of the matmul descriptor (epilogue, bias, aux or "
        "scales)";
    return plan;
  }
  // cuBLASLt computes D[m_lt, n_lt] = op(A_lt)[m_lt, k] op(B_lt)[k, n_lt], column-major, with
  // m_lt = key.m (our n) and n_lt = key.n (our m). Stored (not transposed) shapes:
  const std::int64_t a_rows = key.trans_a ? key.k : key.m, a_cols = key.trans_a ? key.m : key.k;
  const std::int64_t b_rows = key.trans_b ? key.n : key.k, b_cols = key.trans_b ? key.k : key.n;
  bool ok = cublasLtMatrixLayoutCreate(&plan.a, static_cast<cudaDataType_t>(key.a_type),
                                       static_cast<std::uint64_t>(a_rows),
                                       static_cast<std::uint64_t>(a_cols),
                                       key.ld_a != 0 ? key.ld_a : a_rows) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&plan.b, static_cast<cudaDataType_t>(key.b_type),
                                        static_cast<std::uint64_t>(b_rows),
                                        static_cast<std::uint64_t>(b_cols),
                                        key.ld_b != 0 ? key.ld_b : b_rows) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&plan.d, static_cast<cudaDataType_t>(key.d_type),
                                        static_cast<std::uint64_t>(key.m),
                                        static_cast<std::uint64_t>(key.n),
                                        key.ld_d != 0 ? key.ld_d : key.m) == CUBLAS_STATUS_SUCCESS;
  if (ok && key.batch > 1) {
    // One matmul over every batch: each layout steps by its stride (elements) from batch to batch.
    const auto count = static_cast<std::int32_t>(key.batch);
    auto batched = [&](cublasLtMatrixLayout_t layout, std::int64_t stride) {
      return cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                              sizeof count) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride, sizeof stride) == CUBLAS_STATUS_SUCCESS;
    };
    ok = batched(plan.a, key.stride_a) && batched(plan.b, key.stride_b) &&
         batched(plan.d, key.stride_d);
  }
  if (!ok) return plan;

  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return plan;
  const std::uint64_t ws = tuning_.workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  // Each operand's real alignment: C is D (the matmul runs in place).
  const std::pair<cublasLtMatmulPreferenceAttributes_t, int> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.a_alignment},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.b_alignment},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.d_alignment},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.d_alignment}};
  for (const auto& [attr, bytes] : alignments) {
    const auto align = static_cast<std::uint32_t>(bytes);
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
  }
  // A split-K algorithm may add its parts in the output type (in place, or in a buffer of that
  // type): a bf16/fp16 D would be rounded once per part, where sdk/backend_gemm.h promises FP32
  // accumulation rounded once. Only FP32 reductions are offered for those (the heuristic and the
  // autotuner choose among the rest); an FP32 D loses nothing either way.
  if (key.d_type != CUDA_R_32F) {
    const std::uint32_t schemes =
        CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                         sizeof schemes);
  }
  const bool autotune = tuning_.autotune_candidates > 1;
  const int pick = autotune ? 0 : tuning_.heuristic_result;
  std::vector<cublasLtMatmulHeuristicResult_t> results(
      static_cast<std::size_t>(autotune ? tuning_.autotune_candidates : pick + 1));
  int count = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.d, plan.d, pref,
                                     static_cast<int>(results.size()), results.data(), &count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS) count = 0;
  results.resize(static_cast<std::size_t>(count));
  std::erase_if(results, [](const auto& r) { return r.state != CUBLAS_STATUS_SUCCESS; });
  plan.candidates = static_cast<int>(results.size());
  if (pick < plan.candidates) {
    plan.algo = results[static_cast<std::size_t>(pick)].algo;
    plan.algo_workspace = results[static_cast<std::size_t>(pick)].workspaceSize;
    plan.candidate = pick;
    plan.ok = true;
    plan.status = "usable";
    if (autotune && plan.candidates > 1) plan.untimed = std::move(results);
  } else {
    plan.status = std::string("no heuristic result") +
                  (pick > 0 ? " #" + std::to_string(pick) : "") + " (" +
                  cublasLtGetStatusName(status) + ", " + std::to_string(count) + " algorithms)";
  }
  return plan;
}

std::vector<GemmEngine::PlanInfo> GemmEngine::plan_infos() const {
  auto type = [](int t) -> std::string {
    switch (static_cast<cudaDataType_t>(t)) {
      case CUDA_R_32F: return "f32";
      case CUDA_R_16BF: return "bf16";
      case CUDA_R_16F: return "f16";
      case CUDA_R_8F_E4M3: return "e4m3";
      case CUDA_R_8F_E5M2: return "e5m2";
      default: return "type" + std::to_string(t);
    }
  };
  std::vector<PlanInfo> infos;
  for (const auto& [key, plan] : plans_) {
    std::string line = "m=" + std::to_string(key.m) + " n=" + std::to_string(key.n) +
                       " k=" + std::to_string(key.k) + " A=" + type(key.a_type) +
                       (key.trans_a ? "^T" : "") + " B=" + type(key.b_type) +
                       (key.trans_b ? "^T" : "") + " D=" + type(key.d_type) +
                       (key.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? " compute=tf32" : "") +
                       " epilogue=" + std::to_string(key.epilogue);
    if (key.bias_type != 0) line += " bias=" + type(key.bias_type);
    if (key.fp8_scales) line += " fp8-scales";
    if (key.beta_nonzero) line += " beta";
    line += " align=" + std::to_string(key.a_alignment) + "/" + std::to_string(key.b_alignment) +
            "/" + std::to_string(key.d_alignment);
    if (key.batch > 1)
      line += " batch=" + std::to_string(key.batch) + " strides=" + std::to_string(key.stride_a) +
              "," + std::to_string(key.stride_b) + "," + std::to_string(key.stride_d);
    if (key.ld_a != 0 || key.ld_b != 0 || key.ld_d != 0)  // realigned rows (0: packed)
      line += " realigned-ld=" + std::to_string(key.ld_a) + "/" + std::to_string(key.ld_b) + "/" +
              std::to_string(key.ld_d);
    PlanInfo info;
    info.problem = std::move(line);
    info.usable = plan.ok;
    info.status = plan.status;
    info.runs = plan.runs;
    info.candidate = plan.ok ? plan.candidate : -1;
    info.candidates = plan.candidates;
    if (plan.ok) info.algo = describe_algo(plan.algo);
    info.workspace = plan.algo_workspace;
    info.tuning = plan.tuning;
    infos.push_back(std::move(info));
  }
  std::sort(infos.begin(), infos.end(),
            [](const PlanInfo& x, const PlanInfo& y) { return x.problem < y.problem; });
  return infos;
}

std::vector<std::string> GemmEngine::plan_report() const {
  std::vector<std::string> lines;
  for (const PlanInfo& info : plan_infos()) {
    std::string line =
        info.problem + ": " + info.status + ", " + std::to_string(info.runs) + " runs";
    if (info.usable)
      line += "; heuristic result " + std::to_string(info.candidate) + " of " +
              std::to_string(info.candidates) + ", " + info.algo +
              " workspace=" + std::to_string(info.workspace);
    if (!info.tuning.empty()) line += "; " + info.tuning;
    lines.push_back(std::move(line));
  }
  return lines;
}

void GemmEngine::autotune(Plan& plan, void* out, const TimedMatmul& matmul) {
  std::vector<cublasLtMatmulHeuristicResult_t> candidates = std::move(plan.untimed);
  plan.untimed.clear();
  if (stream_capturing(stream_)) {
    plan.tuning = "not autotuned (the stream was being captured)";
    return;  // timing would break the capture: the heuristic's first choice stays
  }
  // A candidate cuBLASLt declines, or whose workspace is too large, is dropped at its untimed call.
  const auto measured =
      time_candidates(stream_, candidates.size(), tuning_.autotune_rounds, [&](std::size_t i) {
        return candidates[i].workspaceSize <= tuning_.workspace_bytes &&
               matmul(candidates[i].algo, out) == CUBLAS_STATUS_SUCCESS;
      });
  if (!measured) return;
  const std::vector<std::vector<float>>& times = *measured;
  const int pick = pick_autotuned_candidate(times, tuning_.autotune_tolerance);
  if (pick < 0) {
    plan.tuning = "autotuning timed no candidate: heuristic result 0 kept";
    return;
  }
  const auto chosen = static_cast<std::size_t>(pick);
  plan.algo = candidates[chosen].algo;
  plan.algo_workspace = candidates[chosen].workspaceSize;
  plan.candidate = pick;
  plan.tuning = autotune_summary(times, pick, tuning_.autotune_rounds);
}

GemmEngine::Operand GemmEngine::decoded(const Operand& in, DType to,
                                        bool apply_scale, DeviceScratch& scratch) {
  const std::int64_t numel = in.rows * in.cols;
  void* out = scratch.get(static_cast<std::size_t>(numel) * sdk::dtype_size(to), stream_, "gemm");
  const float scale = apply_scale && sdk::is_fp8(in.dtype) ? in.scale_inv : 1.0f;
  check_cuda(kernels::cast(in.data, elem_of(in.dtype), out, elem_of(to), false, numel, scale, false,
                           nullptr, stream_),
             "gemm", "operand decode kernel");
  Operand r = in;
  r.data = out;
  r.dtype = to;
  r.scale_inv = 1.0f;
  r.ld = 0;
  return r;
}

GemmEngine::Operand GemmEngine::transposed(const Operand& in, DeviceScratch& scratch) {
  const std::size_t bytes = static_cast<std::size_t>(in.rows * in.cols) * sdk::dtype_size(in.dtype);
  void* out = scratch.get(bytes, stream_, "gemm");
  check_cuda(kernels::transpose(in.data, out, in.rows, in.cols,
                                static_cast<int>(sdk::dtype_size(in.dtype)), stream_),
             "gemm", "FP8 operand transpose kernel");
  Operand r = in;
  r.data = out;
  r.rows = in.cols;
  r.cols = in.rows;
  r.transpose = !in.transpose;
  r.ld = 0;
  return r;
}

GemmEngine::Operand GemmEngine::padded(const Operand& in, DeviceScratch& scratch) {
  const auto size = static_cast<std::int64_t>(sdk::dtype_size(in.dtype));
  const std::int64_t ld = aligned_ld(in.cols, in.dtype);
  void* out = scratch.get(static_cast<std::size_t>(in.rows * ld * size), stream_, "gemm");
  // The padding columns stay as they are: cuBLASLt reads cols of every ld.
  check_cuda(cudaMemcpy2DAsync(
                 out, static_cast<std::size_t>(ld * size), in.data,
                 static_cast<std::size_t>(in.cols * size), static_cast<std::size_t>(in.cols * size),
                 static_cast<std::size_t>(in.rows), cudaMemcpyDeviceToDevice, stream_),
             "gemm", "operand realignment copy");
  Operand r = in;
  r.data = out;
  r.ld = ld;
  return r;
}

bool GemmEngine::run_realigned(const sdk::GemmArgs& args, const Operand& a, const Operand& b,
                               const Realign& realign, bool tf32, std::int64_t m, std::int64_t n,
                               std::int64_t k, const sdk::TensorView* grad_pre) {
  // A realigned C is written to padded rows and copied back, which only a route writing C itself
  // allows (no gelu-gradient route does): without one, decline before any copy is made.
  const std::vector<GemmRoute> routes = gemm_routes(route_query(args, a.dtype, n, grad_pre));
  if (realign.c && std::none_of(routes.begin(), routes.end(), route_writes_c_directly))
    return false;
  const Operand x = realign.a ? padded(a, scratch_a_) : a;
  const Operand y = realign.b ? padded(b, scratch_b_) : b;
  const DType c_dtype = storage_of(args.c.dtype);
  const auto c_size = static_cast<std::int64_t>(sdk::dtype_size(c_dtype));
  sdk::GemmArgs g = args;
  std::int64_t ldc = 0;
  if (realign.c) {
    ldc = aligned_ld(n, c_dtype);
    g.c.data = scratch_c_.get(static_cast<std::size_t>(m * ldc * c_size), stream_, "gemm");
    if (args.beta != 0.0f)
      check_cuda(cudaMemcpy2DAsync(g.c.data, static_cast<std::size_t>(ldc * c_size), args.c.data,
                                   static_cast<std::size_t>(n * c_size),
                                   static_cast<std::size_t>(n * c_size),
                                   static_cast<std::size_t>(m), cudaMemcpyDeviceToDevice, stream_),
                 "gemm", "C realignment copy");
  }
  for (const GemmRoute& route : routes) {
    if (realign.c && !route_writes_c_directly(route)) continue;
    if (!try_run(g, x, y, args.alpha, tf32, false, route, m, n, k, Batch{}, ldc, grad_pre))
      continue;
    if (realign.c)
      check_cuda(cudaMemcpy2DAsync(args.c.data, static_cast<std::size_t>(n * c_size), g.c.data,
                                   static_cast<std::size_t>(ldc * c_size),
                                   static_cast<std::size_t>(n * c_size),
                                   static_cast<std::size_t>(m), cudaMemcpyDeviceToDevice, stream_),
                 "gemm", "C copy back from its realigned rows");
    return true;
  }
  return false;
}

bool GemmEngine::try_run(const sdk::GemmArgs& args, const Operand& a, const Operand& b, float alpha,
                         bool tf32, bool fp8_scales, const GemmRoute& route, std::int64_t m,
                         std::int64_t n, std::int64_t k, const Batch& batch, std::int64_t ldc,
                         const sdk::TensorView* grad_pre) {
  const DType c_dtype = storage_of(args.c.dtype);
  const cublasLtEpilogue_t epilogue =
      route.dgelu_in_epilogue ? CUBLASLT_EPILOGUE_DGELU
                              : epilogue_for(route.bias_in_epilogue, route.activation_in_epilogue,
                                             args.activation, route.aux_in_epilogue);
  // The aux matrix: the forward's pre_activation (written) or gemm_gradient's (read).
  const void* aux_ptr = route.aux_in_epilogue     ? args.pre_activation.data
                        : route.dgelu_in_epilogue ? grad_pre->data
                                                  : nullptr;
  const bool compute_tf32 = tf32 && a.dtype == DType::fp32 && b.dtype == DType::fp32;
  // A narrowed bias lives in scratch_bias_ (256-byte aligned); it is written below, once the plan
  // is known to be usable.
  const void* bias_ptr = route.bias_in_epilogue ? args.bias.data : nullptr;
  const bool batched = batch.count > 1;
  // D is C, or fp32 scratch (cudaMalloc'd: 256-byte aligned) when the route changes its dtype.
  const bool d_is_c = route.d_dtype == c_dtype;
  // A D in scratch is packed [count, m, n]; C keeps the caller's stride.
  const std::int64_t stride_d = !batched ? 0 : d_is_c ? batch.stride_c : m * n;
  // Every batch's matrix must have the alignment the plan promises: the base pointer's and, when
  // batched, the stride's in bytes (a zero stride repeats the base).
  auto operand_alignment = [&](const void* base, std::int64_t stride, DType t) {
    int align = alignment_of(base);
    if (batched)
      align = std::min(align, alignment_of(reinterpret_cast<const void*>(
                                  static_cast<std::uintptr_t>(stride) * sdk::dtype_size(t))));
    return align;
  };
  int epi_align = 256;
  if (route.bias_in_epilogue && route.bias_dtype == DType::fp32)
    epi_align = std::min(epi_align, alignment_of(bias_ptr));
  if (aux_ptr != nullptr) epi_align = std::min(epi_align, alignment_of(aux_ptr));
  const Key key{{n, m, k, b.transpose, a.transpose},
                static_cast<int>(cuda_type(b.dtype)),
                static_cast<int>(cuda_type(a.dtype)),
                static_cast<int>(cuda_type(route.d_dtype)),
                static_cast<int>(compute_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F),
                static_cast<int>(epilogue),
                route.bias_in_epilogue ? static_cast<int>(cuda_type(route.bias_dtype)) : 0,
                args.beta != 0.0f,
                fp8_scales,
                operand_alignment(b.data, batch.stride_b, b.dtype),  // cuBLASLt's A is our B
                operand_alignment(a.data, batch.stride_a, a.dtype),
                // A D in scratch: 256-byte aligned at batch 0, then m*n fp32 elements apart.
                d_is_c ? operand_alignment(args.c.data, batch.stride_c, c_dtype)
                       : operand_alignment(nullptr, stride_d, route.d_dtype),
                epi_align,
                batched ? batch.count : 1,
                batched ? batch.stride_b : 0,  // cuBLASLt's A is our B
                batched ? batch.stride_a : 0,
                stride_d,
                b.ld,  // cuBLASLt's A is our B
                a.ld,
                ldc};
  Plan& plan = plan_for(key);
  if (!plan.ok) return false;
  if (route.bias_in_epilogue && route.bias_dtype != DType::fp32) {
    void* narrow = scratch_bias_.get(static_cast<std::size_t>(n) * sdk::dtype_size(route.bias_dtype),
                                     stream_, "gemm");
    check_cuda(kernels::cast(args.bias.data, kernels::Elem::f32, narrow, elem_of(route.bias_dtype),
                             false, n, 1.0f, false, nullptr, stream_),
               "gemm", "bias narrowing kernel");
    bias_ptr = narrow;
  }

  // Casts between C (the caller's stride) and a D in packed fp32 scratch: one launch when C is
  // packed too (always for a single GEMM), else one per batch.
  auto per_batch = [&](void* d_base, const std::function<void(void*, void*, std::int64_t)>& cast) {
    const std::size_t c_size = sdk::dtype_size(c_dtype);
    if (!batched || batch.stride_c == m * n) {
      cast(args.c.data, d_base, m * n * batch.count);
      return;
    }
    for (std::int64_t i = 0; i < batch.count; ++i)
      cast(static_cast<char*>(args.c.data) + i * batch.stride_c * static_cast<std::int64_t>(c_size),
           static_cast<float*>(d_base) + i * m * n, m * n);
  };
  void* d = args.c.data;
  if (!d_is_c) {
    d = scratch_d_.get(static_cast<std::size_t>(m * n * batch.count) * sizeof(float), stream_,
                       "gemm");
    if (args.beta != 0.0f)
      per_batch(d, [&](void* c, void* dd, std::int64_t count) {
        check_cuda(kernels::cast(c, elem_of(c_dtype), dd, kernels::Elem::f32, false, count, 1.0f,
                                 false, nullptr, stream_),
                   "gemm", "C decode kernel");
      });
  }
  // A failed set would leave the previous call's pointer on the cached descriptor: checked.
  if (route.bias_in_epilogue)
    check_cublas(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &bias_ptr, sizeof bias_ptr),
                 "setting the bias pointer");
  if (aux_ptr != nullptr)
    check_cublas(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                       &aux_ptr, sizeof aux_ptr),
        "setting the pre_activation (aux) pointer");
  if (fp8_scales) {
    // From a stack array: cudaMemcpyAsync stages a pageable source before it returns (the CUDA
    // runtime's documented behaviour for host-to-device copies), so this is safe on a stream, but
    // a step graph would record the dead address. FP8 policies run no step graphs (the trainer's
    // step graph refuses a policy that scales operands); a capture that reaches here anyway is
    // refused rather than recorded.
    if (stream_capturing(stream_))
      fail("gemm", "an FP8 GEMM's operand scales cannot be recorded in a step graph",
           "run FP8 GEMMs outside step capture (run.step_graphs = false)");
    float host_scales[kScaleStride + 1] = {};
    host_scales[0] = b.scale_inv;  // cuBLASLt's A is our B
    host_scales[kScaleStride] = a.scale_inv;
    check_cuda(cudaMemcpyAsync(scales_, host_scales, sizeof host_scales, cudaMemcpyHostToDevice,
                               stream_),
               "gemm", "upload of the FP8 scales");
  }
  const float beta = args.beta;
  // D = alpha*op(A)op(B) + beta*C with C = d; `out` is D (d itself, in place, except while
  // autotuning a beta != 0 plan).
  auto matmul = [&](const cublasLtMatmulAlgo_t& algo, void* out) {
    return cublasLtMatmul(handle_, plan.desc, &alpha, b.data, plan.a, a.data, plan.b, &beta, d,
                          plan.d, out, plan.d, &algo, workspace_, tuning_.workspace_bytes, stream_);
  };
  if (!plan.untimed.empty()) {
    if (beta == 0.0f || stream_capturing(stream_)) {
      // Each timing call rewrites the same D; while capturing, autotune() times nothing and the
      // scratch below is not asked for (its cudaMalloc would void the recording).
      autotune(plan, d, matmul);
    } else {
      // Every timing call would accumulate into C again: they write a scratch D instead.
      void* out = nullptr;
      try {
        // D's whole extent: count matrices stride_d apart (one when not batched), each m rows of
        // its leading dimension (a realigned C's padded rows).
        const std::int64_t d_elems =
            batched ? stride_d * (batch.count - 1) + m * n : m * (ldc != 0 ? ldc : n);
        out = scratch_tune_.get(static_cast<std::size_t>(d_elems) * sdk::dtype_size(route.d_dtype),
                                stream_, "gemm");
      } catch (const sdk::BackendError&) {
        out = nullptr;  // no memory to spare for the timing: the heuristic's first choice stays
      }
      if (out != nullptr) {
        autotune(plan, out, matmul);
        scratch_tune_.release(stream_);
      } else {
        plan.untimed.clear();
        plan.tuning = "not autotuned (no device memory for the scratch output)";
      }
    }
  }
  const cublasStatus_t status = matmul(plan.algo, d);
  // cuBLASLt declines a type/epilogue combination its heuristic offered with NOT_SUPPORTED (or
  // INVALID_VALUE for an attribute such as an fp32 bias the kernel family does not take). Nothing
  // was written; the plan is remembered as declined and the next route runs. The last route
  // (no epilogue) always exists, so a real error still surfaces there.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED ||
      (status == CUBLAS_STATUS_INVALID_VALUE &&
       (epilogue != CUBLASLT_EPILOGUE_DEFAULT || fp8_scales || route.d_dtype != DType::fp32))) {
    plan.ok = false;
    plan.status = std::string("declined by cublasLtMatmul (") + cublasLtGetStatusName(status) + ")";
    return false;
  }
  check_cublas(status, "cublasLtMatmul");
  ++plan.runs;
  if (route.bias_by_kernel)
    check_cuda(kernels::add_bias(d, kernels::Elem::f32, args.bias.data, kernels::Elem::f32, m, n,
                                 stream_),
               "gemm", "bias kernel");
  // d holds z in fp32 (or act(z) in C's dtype when the activation rode cuBLASLt).
  if (route.pre_activation_by_kernel)
    check_cuda(kernels::cast(d, kernels::Elem::f32, args.pre_activation.data,
                             elem_of(args.pre_activation.dtype), false, m * n, 1.0f, false, nullptr,
                             stream_),
               "gemm", "pre_activation encode kernel");
  if (route.activation_by_kernel)
    check_cuda(kernels::activation_forward(activation_code(args.activation), d, kernels::Elem::f32,
                                           args.c.data, elem_of(c_dtype), m * n, stream_),
               "gemm", "activation epilogue kernel");
  // z (fp32 D; C itself when C is fp32, read and written in place) times gelu'(pre), one rounding.
  if (route.activation_grad_by_kernel)
    check_cuda(kernels::activation_backward(activation_code(sdk::Activation::gelu), grad_pre->data,
                                            elem_of(grad_pre->dtype), d, kernels::Elem::f32,
                                            args.c.data, elem_of(c_dtype), m * n, stream_),
               "gemm_gradient", "activation gradient kernel");
  if (route.encode_by_kernel)
    per_batch(d, [&](void* c, void* dd, std::int64_t count) {
      check_cuda(kernels::cast(dd, kernels::Elem::f32, c, elem_of(c_dtype), false, count, 1.0f,
                               false, nullptr, stream_),
                 "gemm", "C encode kernel");
    });
  return true;
}

void GemmEngine::run(const sdk::GemmArgs& args) {
  run_impl(args, Batch{});
}

void GemmEngine::run_batched(const sdk::GemmBatchedArgs& args) {
  const auto& av = args.gemm.a.view;
  const auto& bv = args.gemm.b.view;
  const auto [m, n, k] = checks().gemm_shape(args.gemm);
  const bool native = args.batch > 1 && m > 0 && n > 0 && k > 0 &&
                      storage_of(av.dtype) == storage_of(bv.dtype) && is_storage_float(av.dtype) &&
                      is_storage_float(args.gemm.c.dtype) && args.stride_a >= 0 &&
                      args.stride_b >= 0 && args.stride_c >= 0;
  if (native) {
    // cuBLASLt takes the batch count as int32: a (theoretical) larger batch runs in pieces.
    constexpr std::int64_t kMaxBatch = INT32_MAX;
    for (std::int64_t first = 0; first < args.batch; first += kMaxBatch) {
      sdk::GemmArgs g = args.gemm;
      auto piece = [&](void* p, DType t, std::int64_t stride) {
        return static_cast<void*>(static_cast<char*>(p) +
                                  first * stride * static_cast<std::int64_t>(sdk::dtype_size(t)));
      };
      g.a.view.data = piece(av.data, av.dtype, args.stride_a);
      g.b.view.data = piece(bv.data, bv.dtype, args.stride_b);
      g.c.data = piece(args.gemm.c.data, args.gemm.c.dtype, args.stride_c);
      run_impl(g, {std::min(kMaxBatch, args.batch - first), args.stride_a, args.stride_b,
                   args.stride_c});
    }
    return;
  }
  // One GEMM per batch (same cached plan): mixed or FP8 inputs, negative strides, k = 0, batch 1.
  auto moved = [](sdk::TensorView v, std::int64_t elements) {
    v.data =
        static_cast<char*>(v.data) + elements * static_cast<std::int64_t>(sdk::dtype_size(v.dtype));
    return v;
  };
  sdk::GemmArgs g = args.gemm;
  for (std::int64_t i = 0; i < args.batch; ++i) {
    g.a.view = moved(av, i * args.stride_a);
    g.b.view = moved(bv, i * args.stride_b);
    g.c = moved(args.gemm.c, i * args.stride_c);
    run_impl(g, Batch{});
  }
}

void GemmEngine::run_gradient(const sdk::GemmGradientArgs& args) {
  run_impl(args.gemm, Batch{}, args.has_activation_grad ? &args.pre_activation : nullptr);
}

void GemmEngine::run_impl(const sdk::GemmArgs& args, const Batch& batch,
                          const sdk::TensorView* grad_pre) {
  const auto& av = args.a.view;
  const auto& bv = args.b.view;
  if (!is_gemm_input(av.dtype) || !is_gemm_input(bv.dtype))
    fail("gemm",
         "input dtypes A=" + std::string(sdk::dtype_name(av.dtype)) +
             ", B=" + std::string(sdk::dtype_name(bv.dtype)) +
             " are not supported; this backend takes " + kSupportedInputs,
         "cast A and B to a floating-point storage dtype (backend.cast)");
  const auto [m, n, k] = checks().gemm_shape(args);
  if (!is_storage_float(args.c.dtype))
    fail("gemm", "C dtype " + std::string(sdk::dtype_name(args.c.dtype)) + " is not supported",
         "use an fp32, bf16 or fp16 output");
  const bool has_bias = !args.bias.empty();  // checked (fp32 [n]) by gemm_shape
  if (m == 0 || n == 0) return;
  const kernels::Elem c_elem = elem_of(args.c.dtype);
  if (k == 0) {  // empty inner product: z = beta*C + bias
    // z is built in fp32 scratch unless C is fp32 and there is no activation, so C is rounded
    // once, as the CPU reference does.
    void* z = args.c.data;
    kernels::Elem z_elem = c_elem;
    const bool via_fp32 =
        args.has_activation || grad_pre != nullptr || c_elem != kernels::Elem::f32;
    if (via_fp32) {
      z = scratch_d_.get(static_cast<std::size_t>(m * n) * sizeof(float), stream_, "gemm");
      z_elem = kernels::Elem::f32;
      if (args.beta != 0.0f)
        check_cuda(kernels::cast(args.c.data, c_elem, z, z_elem, false, m * n, args.beta, false,
                                 nullptr, stream_),
                   "gemm", "C decode kernel");
      else
        check_cuda(kernels::fill(z, z_elem, m * n, 0.0f, stream_), "gemm", "fill kernel");
    } else if (args.beta == 0.0f) {
      check_cuda(kernels::fill(z, z_elem, m * n, 0.0f, stream_), "gemm", "fill kernel");
    } else if (args.beta != 1.0f) {
      check_cuda(kernels::scale(z, z_elem, m * n, args.beta, stream_), "gemm", "scale kernel");
    }
    if (has_bias)
      check_cuda(kernels::add_bias(z, z_elem, args.bias.data, kernels::Elem::f32, m, n, stream_),
                 "gemm", "bias kernel");
    if (grad_pre != nullptr) {
      check_cuda(kernels::activation_backward(activation_code(sdk::Activation::gelu),
                                              grad_pre->data, elem_of(grad_pre->dtype), z, z_elem,
                                              args.c.data, c_elem, m * n, stream_),
                 "gemm_gradient", "activation gradient kernel");
    } else if (args.has_activation) {
      if (!args.pre_activation.empty())
        check_cuda(kernels::cast(z, z_elem, args.pre_activation.data,
                                 elem_of(args.pre_activation.dtype), false, m * n, 1.0f, false,
                                 nullptr, stream_),
                   "gemm", "pre_activation encode kernel");
      check_cuda(kernels::activation_forward(activation_code(args.activation), z, z_elem,
                                             args.c.data, c_elem, m * n, stream_),
                 "gemm", "activation epilogue kernel");
    } else if (via_fp32) {
      check_cuda(kernels::cast(z, z_elem, args.c.data, c_elem, false, m * n, 1.0f, false, nullptr,
                               stream_),
                 "gemm", "C encode kernel");
    }
    return;
  }

  const bool tf32 = args.compute == DType::tf32 || av.dtype == DType::tf32 || bv.dtype == DType::tf32;
  const Operand a{av.data, storage_of(av.dtype), args.a.transpose, av.shape.rows(),
                  av.shape.cols(), args.a.scale_inv};
  const Operand b{bv.data, storage_of(bv.dtype), args.b.transpose, bv.shape.rows(),
                  bv.shape.cols(), args.b.scale_inv};
  const DType c_dtype = storage_of(args.c.dtype);

  // Output strategies in order of preference for given input types.
  auto attempt = [&](const Operand& x, const Operand& y, float alpha, bool fp8_scales) {
    for (const GemmRoute& route : gemm_routes(route_query(args, x.dtype, n, grad_pre)))
      if (try_run(args, x, y, alpha, tf32, fp8_scales, route, m, n, k, batch, 0, grad_pre))
        return true;
    return false;
  };

  if ((sdk::is_fp8(a.dtype) || sdk::is_fp8(b.dtype)) && !fp8_native())
    fail("gemm",
         "FP8 operands (A " + describe(av) + ", B " + describe(bv) + ") need FP8 Tensor Cores, "
             "which start at sm_89 (Ada, Hopper); this device is sm_" + std::to_string(sm_),
         "use a bf16-mixed policy on this GPU, or run FP8 on an sm_89+ GPU (or the CPU backend, "
         "which emulates FP8 exactly)");
  if (a.dtype == b.dtype && !sdk::is_fp8(a.dtype)) {
    if (tuning_.realign && batch.count <= 1) {
      const Realign r = realign_for({a.dtype, a.cols, b.cols, c_dtype, m, n, k, false});
      if (r.any() && run_realigned(args, a, b, r, tf32, m, n, k, grad_pre)) return;
    }
    if (attempt(a, b, args.alpha, false)) return;
  }
  if (batch.count > 1) {
    // cuBLASLt declined the strided batch: the fallbacks below decode one matrix per operand into
    // scratch, so they run batch by batch.
    sdk::GemmArgs g = args;
    for (std::int64_t i = 0; i < batch.count; ++i) {
      auto at = [i](const void* p, DType t, std::int64_t stride) {
        return static_cast<void*>(const_cast<char*>(static_cast<const char*>(p)) +
                                  i * stride * static_cast<std::int64_t>(sdk::dtype_size(t)));
      };
      g.a.view.data = at(av.data, av.dtype, batch.stride_a);
      g.b.view.data = at(bv.data, bv.dtype, batch.stride_b);
      g.c.data = at(args.c.data, args.c.dtype, batch.stride_c);
      run_impl(g, Batch{}, grad_pre);
    }
    return;
  } else if (sdk::is_fp8(a.dtype) && sdk::is_fp8(b.dtype)) {
    const bool both_e5m2 = a.dtype == DType::fp8_e5m2 && b.dtype == DType::fp8_e5m2;
    if (fp8_native() && !both_e5m2 && k % 16 == 0) {
      // cuBLASLt's "TN": its A (our B) transposed, its B (our A) not.
      const Operand x = a.transpose ? transposed(a, scratch_a_) : a;
      const Operand y = b.transpose ? b : transposed(b, scratch_b_);
      if (attempt(x, y, args.alpha, true)) return;
    }
    // e5m2 x e5m2 (no cuBLASLt kernel), k % 16 != 0, or a declined combination. Exact: every
    // e4m3 / e5m2 value is a bf16 value; the scales move into alpha.
    const Operand x = decoded(a, DType::bf16, false, scratch_a_);
    const Operand y = decoded(b, DType::bf16, false, scratch_b_);
    if (attempt(x, y, args.alpha * a.scale_inv * b.scale_inv, false)) return;
  }
  // Any other mix, or a declined combination: both operands decoded to fp32 (x scale_inv).
  const Operand x = a.dtype == DType::fp32 ? a : decoded(a, DType::fp32, true, scratch_a_);
  const Operand y = b.dtype == DType::fp32 ? b : decoded(b, DType::fp32, true, scratch_b_);
  if (attempt(x, y, args.alpha, false)) return;
  fail("gemm",
       "cuBLASLt has no kernel for A " + describe(av) + ", B " + describe(bv) + ", C " +
           describe(args.c) + " (m=" + std::to_string(m) + " n=" + std::to_string(n) +
           " k=" + std::to_string(k) + ")",
       "report this shape; choose backend.type = \"cpu\" meanwhile");
}

}  // namespace mixtrain::backend_cuda
