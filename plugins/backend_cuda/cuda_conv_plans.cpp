// cuDNN execution plans per convolution shape (contract in the header). Attribute names, types
// and rules as cuDNN 9's backend API documents them (cudnn_graph.h): every tensor needs its data
// type, dims, strides, a unique id and the byte alignment of its pointer; the engine
// configurations come from CUDNN_ATTR_ENGINEHEUR_RESULTS into descriptors the caller created;
// an engine's numerical notes are read from the engine of a configuration (ENGINECFG_ENGINE).
#include "cuda_conv_plans.h"

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <utility>

#include "cuda_access.h"
#include "cuda_candidate_timing.h"
#include "cuda_gemm_autotune.h"

namespace mixtrain::backend_cuda {

using conv::ConvOp;
using conv::DataType;
using conv::PlanKey;

static_assert(static_cast<int>(DataType::f32) == CUDNN_DATA_FLOAT);
static_assert(static_cast<int>(DataType::f16) == CUDNN_DATA_HALF);
static_assert(static_cast<int>(DataType::bf16) == CUDNN_DATA_BFLOAT16);
static_assert(static_cast<int>(conv::NumericalNote::tensor_core) ==
              CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
static_assert(static_cast<int>(conv::NumericalNote::down_convert_inputs) ==
              CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
static_assert(static_cast<int>(conv::NumericalNote::reduced_precision_reduction) ==
              CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION);
static_assert(static_cast<int>(conv::NumericalNote::fft) == CUDNN_NUMERICAL_NOTE_FFT);
static_assert(static_cast<int>(conv::NumericalNote::nondeterministic) ==
              CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
static_assert(static_cast<int>(conv::NumericalNote::winograd) == CUDNN_NUMERICAL_NOTE_WINOGRAD);

namespace {

constexpr std::int64_t kUidX = 1, kUidW = 2, kUidY = 3;

const char* note_text(int n) {
  switch (n) {
    case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
      return "TENSOR_CORE";
    case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
      return "DOWN_CONVERT_INPUTS";
    case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
      return "REDUCED_PRECISION_REDUCTION";
    case CUDNN_NUMERICAL_NOTE_FFT:
      return "FFT";
    case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
      return "NONDETERMINISTIC";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      return "WINOGRAD_TILE_4x4";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      return "WINOGRAD_TILE_6x6";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
      return "WINOGRAD_TILE_13x13";
    case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP:
      return "STRICT_NAN_PROP";
    default:
      return "?";
  }
}

// Collects the first failing status of a chain of descriptor calls.
struct Steps {
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  std::string what;
  void operator()(cudnnStatus_t s, std::string_view step) {
    if (status == CUDNN_STATUS_SUCCESS && s != CUDNN_STATUS_SUCCESS) {
      status = s;
      what = std::string(step);
    }
  }
  bool ok() const { return status == CUDNN_STATUS_SUCCESS; }
  std::string text() const { return what + ": " + cudnn_error_text(status); }
};

Descriptor tensor(std::int64_t uid, DataType type, const conv::TensorDims& t,
                  std::int64_t alignment, Steps& steps) {
  // The key's alignment is the least of the three pointers' (a bf16 view may start 2 bytes past
  // 4); a tensor's own pointer is always a multiple of its element size, and cuDNN refuses an
  // fp32 tensor declared below 4 (BAD_PARAM at finalize), which would decline the plan.
  alignment = std::max<std::int64_t>(alignment, type == DataType::f32 ? 4 : 2);
  Descriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  steps(d.status(), "create tensor");
  const auto dt = static_cast<cudnnDataType_t>(type);
  steps(d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt), "tensor data type");
  steps(d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data()), "tensor dims");
  steps(d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data()), "tensor strides");
  steps(d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid), "tensor uid");
  steps(d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment),
        "tensor alignment");
  steps(d.finalize(), "finalize tensor");
  return d;
}

sdk::Conv2dGeometry geometry_of(const PlanKey& k) {
  sdk::Conv2dGeometry g;
  g.batch = k.n;
  g.in_channels = k.c;
  g.height = k.h;
  g.width = k.w;
  g.out_channels = k.k;
  g.kernel_h = k.r;
  g.kernel_w = k.s;
  g.stride_h = k.stride_h;
  g.stride_w = k.stride_w;
  g.pad_h = k.pad_h;
  g.pad_w = k.pad_w;
  g.dilation_h = k.dil_h;
  g.dilation_w = k.dil_w;
  g.groups = k.groups;
  return g;
}

// The convolution operation of one key, finalized (the descriptors it references are kept alive
// in `keep`). Needs no handle: cuDNN checks the tensors and the operation's shapes on the host.
Descriptor convolution_operation(const PlanKey& key, std::vector<Descriptor>& keep, Steps& steps) {
  const sdk::Conv2dGeometry g = geometry_of(key);
  const auto xd = conv::image_dims(g.batch, g.in_channels, g.height, g.width);
  const auto yd = conv::image_dims(g.batch, g.out_channels, g.out_height(), g.out_width());
  const auto wd = conv::filter_dims(g, key.layout);
  // The operands as cuDNN reads them are `io`; the output it writes is `out`.
  const bool fwd = key.op == ConvOp::forward, dgrad = key.op == ConvOp::backward_data;
  Descriptor x = tensor(kUidX, dgrad ? key.out : key.io, xd, key.alignment, steps);
  Descriptor w = tensor(kUidW, key.op == ConvOp::backward_weights ? key.out : key.io, wd,
                        key.alignment, steps);
  Descriptor y = tensor(kUidY, fwd ? key.out : key.io, yd, key.alignment, steps);

  Descriptor cd(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  steps(cd.status(), "create convolution");
  const conv::ConvParams p = conv::conv_params(g);
  const std::int64_t spatial = 2;
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // PyTorch's Conv2d
  steps(cd.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial), "spatial dims");
  steps(cd.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute), "comp type");
  steps(cd.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode), "mode");
  steps(cd.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, p.pre_padding.data()),
        "pre paddings");
  steps(cd.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, p.post_padding.data()),
        "post paddings");
  steps(cd.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, p.stride.data()),
        "strides");
  steps(cd.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, p.dilation.data()),
        "dilations");
  steps(cd.finalize(), "finalize convolution");

  // The output is overwritten, or added to by the accumulating dgrad's direct route (beta = 1);
  // every other accumulation is the finish kernel's.
  const float alpha = 1.0f, beta = key.beta_one ? 1.0f : 0.0f;
  // The three operations take the same six attributes under their own names. x, w, y are the
  // activation, the filter and the output side: dx, w, dy for dgrad; x, dw, dy for wgrad.
  struct Attributes {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
    const char* label;
  };
  static constexpr Attributes kForward{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                                       "fprop"};
  static constexpr Attributes kBackwardData{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
      "dgrad"};
  static constexpr Attributes kBackwardWeights{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
      "wgrad"};
  const Attributes& a = key.op == ConvOp::forward         ? kForward
                        : key.op == ConvOp::backward_data ? kBackwardData
                                                          : kBackwardWeights;
  const std::string label = a.label;
  Descriptor opd(a.type);
  steps(opd.set(a.x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, x.ptr()), label + " x");
  steps(opd.set(a.w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, w.ptr()), label + " w");
  steps(opd.set(a.y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, y.ptr()), label + " y");
  steps(opd.set(a.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, cd.ptr()), label + " conv");
  steps(opd.set(a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha), label + " alpha");
  steps(opd.set(a.beta, CUDNN_TYPE_FLOAT, 1, &beta), label + " beta");
  steps(opd.status(), "create operation");
  steps(opd.finalize(), "finalize operation");
  for (Descriptor* d : {&x, &w, &y, &cd}) keep.push_back(std::move(*d));
  return opd;
}

// The operation graph of one convolution (descriptors it references are kept alive in `keep`).
Descriptor operation_graph(const PlanKey& key, cudnnHandle_t handle, std::vector<Descriptor>& keep,
                           Steps& steps) {
  Descriptor opd = convolution_operation(key, keep, steps);
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  steps(graph.status(), "create operation graph");
  steps(graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, opd.ptr()),
        "graph ops");
  steps(graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle), "graph handle");
  steps(graph.finalize(), "finalize operation graph");
  keep.push_back(std::move(opd));
  return graph;
}

// The engine configurations heuristics `mode` proposes for `graph`, best first.
std::vector<Descriptor> heuristic_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode,
                                          std::string& why) {
  std::vector<Descriptor> configs;
  Steps steps;
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  steps(heur.status(), "create heuristics");
  steps(heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 graph.ptr()),
        "heuristics graph");
  steps(heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode), "heuristics mode");
  steps(heur.finalize(), "finalize heuristics");
  std::int64_t count = 0;
  steps(heur.get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
        "heuristics result count");
  if (!steps.ok() || count <= 0) {
    why += std::string(mode == CUDNN_HEUR_MODE_A ? "mode A" : "fallback mode") + ": " +
           (steps.ok() ? std::string("no engine configuration") : steps.text()) + "; ";
    return configs;
  }
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  std::int64_t got = 0;
  steps(heur.get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                 raw.data()),
        "heuristics results");
  if (!steps.ok()) {
    why += steps.text() + "; ";
    configs.clear();
    return configs;
  }
  configs.resize(static_cast<std::size_t>(std::min(got, count)));
  return configs;
}

// The numerical notes and global index of a configuration's engine, and whether cuDNN compiles
// it at run time (its behavior notes).
bool engine_of(const Descriptor& config, std::vector<int>& notes, std::int64_t& index,
               bool& runtime_compiled) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  std::int64_t n = 0;
  if (config.get(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw) !=
      CUDNN_STATUS_SUCCESS)
    return false;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> buf{};
  n = 0;
  if (engine.get(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, buf.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  notes.clear();
  for (std::int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; ++i)
    notes.push_back(static_cast<int>(buf[static_cast<std::size_t>(i)]));
  index = -1;
  (void)engine.get(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
  n = 0;
  runtime_compiled = false;
  if (engine.get(CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                 CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, behavior.data()) == CUDNN_STATUS_SUCCESS)
    for (std::int64_t i = 0; i < n && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; ++i)
      runtime_compiled = runtime_compiled || behavior[static_cast<std::size_t>(i)] ==
                                                 CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
  return true;
}

std::string notes_text(const std::vector<int>& notes) {
  std::string s;
  for (int n : notes) s += (s.empty() ? "" : ", ") + std::string(note_text(n));
  return s.empty() ? "no notes" : s;
}

}  // namespace

ConvPlans::Entry ConvPlans::build(const PlanKey& key, cudnnHandle_t handle, std::string_view op) {
  (void)op;
  Entry entry;
  Steps steps;
  std::vector<Descriptor> keep;
  Descriptor graph = operation_graph(key, handle, keep, steps);
  if (!steps.ok()) {
    entry.why = "the operation graph did not finalize (" + steps.text() + ")";
    return entry;
  }
  conv::NumericsPolicy policy;
  policy.tensor_cores = key.tensor_cores;
  policy.fp32_data = key.io == DataType::f32;
  conv::NumericsPolicy strict = policy;
  strict.deterministic = true;
  std::string why;
  // Heuristics per mode, queried when a pass first needs them (the fallback list only when mode A
  // has no deterministic engine that finalizes, or while autotuning wants more candidates).
  std::array<std::vector<Descriptor>, 2> configs;
  std::array<bool, 2> queried{false, false};
  const bool tuning = autotune_ >= 2;
  conv::AutotuneCandidates candidates(autotune_, deterministic_first_);
  for (const conv::SearchPass pass : conv::search_passes(deterministic_first_, key.beta_one)) {
    if (tuning && candidates.full()) break;
    const std::size_t m = pass.fallback_heuristics ? 1 : 0;
    const cudnnBackendHeurMode_t mode = m == 1 ? CUDNN_HEUR_MODE_FALLBACK : CUDNN_HEUR_MODE_A;
    if (!queried[m]) {
      configs[m] = heuristic_configs(graph, mode, why);
      queried[m] = true;
    }
    policy.deterministic = pass.deterministic;
    for (Descriptor& config : configs[m]) {
      if (config.get() == nullptr) continue;  // an autotuning candidate of an earlier pass
      std::vector<int> notes;
      std::int64_t index = -1;
      bool compiled = false;
      if (!engine_of(config, notes, index, compiled)) {
        if (!pass.retry_only) why += "an engine configuration without a readable engine; ";
        continue;
      }
      // A retrying pass takes only what a deterministic one refused for its determinism.
      if (pass.retry_only && conv::engine_allowed(notes, strict)) continue;
      const std::string engine = "engine " + std::to_string(index) + " (" + notes_text(notes) + ")";
      const std::string refusal = conv::engine_refusal(notes, policy);
      if (!refusal.empty()) {
        if (!pass.retry_only) why += engine + ": " + refusal + "; ";
        continue;
      }
      if (tuning && !candidates.wants(pass, engine, compiled)) continue;
      auto plan = std::make_unique<Plan>();
      plan->plan = Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      Steps ps;
      ps(plan->plan.status(), "create plan");
      ps(plan->plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle),
         "plan handle");
      ps(plan->plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                        config.ptr()),
         "plan engine config");
      ps(plan->plan.finalize(), "finalize plan");
      std::int64_t n = 0;
      ps(plan->plan.get(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                        &plan->workspace),
         "plan workspace size");
      if (!ps.ok()) {
        why += engine + ": " + ps.text() + "; ";
        continue;
      }
      plan->engine = engine + (pass.retry_only ? ", non-deterministic fallback" : "") + ", " +
                     (mode == CUDNN_HEUR_MODE_A ? "heuristics mode A" : "fallback heuristics");
      plan->fallback_heuristics = mode != CUDNN_HEUR_MODE_A;
      if (!tuning) {
        // What the plan was built from stays alive with it (the frontend keeps the same chain).
        plan->keep = std::move(keep);
        plan->keep.push_back(std::move(graph));
        plan->keep.push_back(std::move(config));
        entry.plan = std::move(plan);
        return entry;
      }
      candidates.take(pass, engine);
      if (!entry.plan) {
        // The first candidate keeps the chain; the others keep their configuration, and live
        // inside it (destroyed before the graph they were finalized from).
        plan->keep = std::move(keep);
        plan->keep.push_back(std::move(config));
        entry.plan = std::move(plan);
      } else {
        plan->keep.push_back(std::move(config));
        entry.plan->untimed.push_back(std::move(plan));
      }
      if (candidates.full()) break;
    }
  }
  if (entry.plan) {
    entry.plan->keep.push_back(std::move(graph));
    if (entry.plan->untimed.empty()) entry.plan->tuning = "one candidate: nothing to time";
    return entry;
  }
  entry.why = why.empty() ? "no engine configuration" : why;
  return entry;
}

std::int64_t ConvPlans::Plan::tuning_workspace() const {
  std::int64_t bytes = workspace;
  for (const auto& c : untimed) bytes = std::max(bytes, c->workspace);
  return bytes;
}

std::size_t ConvPlans::drop_candidates_over(Plan& plan, std::int64_t bytes) {
  const std::size_t before = plan.untimed.size();
  std::erase_if(plan.untimed,
                [bytes](const std::unique_ptr<Plan>& c) { return c->workspace > bytes; });
  return before - plan.untimed.size();
}

void ConvPlans::skip_autotune(Plan& plan, std::string why) {
  plan.untimed.clear();
  plan.tuning = std::move(why);
}

void ConvPlans::autotune(Plan& plan, cudnnHandle_t handle, cudaStream_t stream, void* uid1,
                         void* uid2, void* uid3, void* workspace, std::string_view op) {
  if (plan.untimed.empty()) return;
  // Candidate 0 is the plan itself; the others follow in the search's order.
  std::vector<Plan*> all{&plan};
  for (auto& c : plan.untimed) all.push_back(c.get());
  const auto measured = time_candidates(stream, all.size(), rounds_, [&](std::size_t i) {
    try {
      run(*all[i], handle, uid1, uid2, uid3, workspace, op);
      return true;
    } catch (const sdk::BackendError&) {
      return false;  // an engine that fails at execution is dropped
    }
  });
  if (!measured) {
    skip_autotune(plan, "not autotuned (no CUDA events)");
    return;
  }
  const std::vector<std::vector<float>>& times = *measured;
  const int pick = pick_autotuned_candidate(times, 0.005f);
  if (pick < 0) {
    skip_autotune(plan, "autotuning timed no candidate: the first kept");
    return;
  }
  const std::string tuned = autotune_summary(times, pick, rounds_);
  if (pick > 0) {
    // The winner's execution plan takes the key's place; its configuration joins the chain the
    // plan keeps alive, and the old first plan goes with the other candidates.
    Plan& won = *all[static_cast<std::size_t>(pick)];
    std::swap(plan.plan, won.plan);
    plan.workspace = won.workspace;
    plan.engine = won.engine;
    plan.fallback_heuristics = won.fallback_heuristics;
    for (Descriptor& d : won.keep) plan.keep.push_back(std::move(d));
    won.keep.clear();
  }
  plan.untimed.clear();
  plan.tuning = tuned;
  plan.runs = 0;  // the timing calls are not the model's
}

std::string ConvPlans::host_check(const PlanKey& key) {
  Steps steps;
  std::vector<Descriptor> keep;
  const Descriptor operation = convolution_operation(key, keep, steps);
  return steps.ok() ? std::string() : steps.text();
}

ConvPlans::Plan* ConvPlans::get(const PlanKey& key, cudnnHandle_t handle, std::string_view op) {
  auto it = entries_.find(key);
  if (it == entries_.end()) it = entries_.emplace(key, build(key, handle, op)).first;
  return it->second.plan.get();
}

const std::string& ConvPlans::declined(const PlanKey& key) const {
  static const std::string none;
  const auto it = entries_.find(key);
  return it == entries_.end() ? none : it->second.why;
}

cudnnStatus_t ConvPlans::execute(const Plan& plan, cudnnHandle_t handle, void* uid1, void* uid2,
                                 void* uid3, void* workspace, std::string_view op) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  check_cudnn(pack.status(), op, "cudnnBackendCreateDescriptor(VARIANT_PACK)");
  const std::array<std::int64_t, 3> uids{kUidX, kUidW, kUidY};
  std::array<void*, 3> data{uid1, uid2, uid3};
  check_cudnn(pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data()), op,
              "variant pack uids");
  check_cudnn(pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, data.data()),
              op, "variant pack pointers");
  check_cudnn(pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace), op,
              "variant pack workspace");
  check_cudnn(pack.finalize(), op, "finalize variant pack");
  const cudnnStatus_t status = cudnnBackendExecute(handle, plan.plan.get(), pack.get());
  if (status == CUDNN_STATUS_SUCCESS) ++const_cast<Plan&>(plan).runs;
  return status;
}

void ConvPlans::run(const Plan& plan, cudnnHandle_t handle, void* uid1, void* uid2, void* uid3,
                    void* workspace, std::string_view op) {
  check_cudnn(execute(plan, handle, uid1, uid2, uid3, workspace, op), op,
              "cudnnBackendExecute (" + plan.engine + ")");
}

bool ConvPlans::run_or_decline(const PlanKey& key, cudnnHandle_t handle, void* uid1, void* uid2,
                               void* uid3, void* workspace, std::string_view op) {
  const auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.plan) return false;
  const Plan& plan = *it->second.plan;
  const cudnnStatus_t status = execute(plan, handle, uid1, uid2, uid3, workspace, op);
  // cuDNN 9's NOT_SUPPORTED family (3000-3999): the engine cannot run this call (a beta, the
  // pointers), so the caller's next route may; any other failure is the device's and raises.
  if (status / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000 && plan.runs == 0) {
    it->second.why = plan.engine + " finalized but refused to execute: " + cudnn_error_text(status);
    it->second.plan.reset();
    return false;
  }
  check_cudnn(status, op, "cudnnBackendExecute (" + plan.engine + ")");
  return true;
}

std::vector<std::string> ConvPlans::report() const {
  std::vector<std::string> lines;
  for (const auto& [key, entry] : entries_) {
    std::string line = conv::key_text(key) + ": ";
    if (entry.plan) {
      line += entry.plan->engine + ", workspace " + std::to_string(entry.plan->workspace) +
              " bytes, runs " + std::to_string(entry.plan->runs);
      if (!entry.plan->tuning.empty()) line += "; " + entry.plan->tuning;
    } else
      line += "declined: " + entry.why;
    lines.push_back(std::move(line));
  }
  std::sort(lines.begin(), lines.end());  // the map's order is not stable across runs
  return lines;
}

}  // namespace mixtrain::backend_cuda
