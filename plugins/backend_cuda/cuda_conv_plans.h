// ConvPlans: cuDNN execution plans for the convolution facet, cached per shape, built through
// cuDNN 9's graph API with backend descriptors (cudnn_graph.h).
//
// Contract
// - get(key) returns the plan for a PlanKey (cuda_conv_rules.h: op, geometry, the data types
//   cuDNN reads and writes, the filter layout, whether TF32 is allowed, the pointers' alignment),
//   building it on the first request: tensor descriptors (NCHW-ordered dims, NHWC strides; the
//   filter KCRS or KRSC), the convolution descriptor (cross-correlation, FP32 compute), one
//   convolution operation (alpha 1, beta 1 for a key with beta_one, else 0), its operation graph,
//   then heuristics (CUDNN_HEUR_MODE_A, then CUDNN_HEUR_MODE_FALLBACK when A offers nothing
//   usable): the first engine configuration the numerics policy accepts (conv::engine_refusal on
//   its engine's numerical notes) and that finalizes into an execution plan wins; deterministic
//   engines of both heuristics lists are tried before any non-deterministic one
//   (conv::search_passes), unless the backend option deterministic_convolutions = false asks for
//   mode A's order whatever the determinism. A key no configuration serves is cached as declined
//   (nullptr), with each configuration's reason.
// - Autotuning (the backend option conv_autotune = N >= 2, like cudnn.benchmark): the search goes
//   on past the first plan and keeps up to N finalized candidates (conv::AutotuneCandidates:
//   in its order, each engine once, never a non-deterministic one beside a deterministic one
//   unless deterministic_convolutions = false). The first run of the key times them
//   (autotune(): one untimed call each, then `rounds` rounds timing each once with CUDA events,
//   the median compared by pick_autotuned_candidate with a 0.5% tolerance for the earlier one),
//   and the plan keeps the fastest from then on; report() says what was measured. Not while the
//   stream is being captured: the first candidate stays (the caller's check, skip_autotune). A
//   candidate whose workspace the device cannot give is dropped (drop_candidates_over), and
//   without the memory for the first candidate's nothing is timed. The measurement is
//   cuda_candidate_timing.h's, shared with the GEMM engine.
// - run() executes a plan with a variant pack: uid 1 = x / dx, 2 = w / dw, 3 = y / dy; the
//   caller provides at least plan.workspace bytes of workspace.
// - report() lists every key, sorted by its text: its engine (global index, notes), workspace,
//   runs, or why it was declined, for tests, benchmarks and the plan_report facet
//   (CudaBackend::conv_plan_report(), cuda_plan_report_facet.cpp).
// - Thread safety: one host thread at a time (the backend's).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cuda_conv_rules.h"
#include "cuda_cudnn.h"
#include "cuda_scratch.h"

namespace mixtrain::backend_cuda {

class ConvPlans {
 public:
  // deterministic_first: conv::search_passes' order (the backend option
  // deterministic_convolutions).
  // autotune: the backend option conv_autotune (0 or 1: the first plan the search finds).
  explicit ConvPlans(bool deterministic_first = true, int autotune = 0)
      : deterministic_first_(deterministic_first), autotune_(autotune) {}

  struct Plan {
    // The descriptors the plan was built from (tensors, convolution, operation, operation graph,
    // engine configuration): declared first, so destroyed after the plan that references them.
    std::vector<Descriptor> keep;
    Descriptor plan;
    std::int64_t workspace = 0;
    std::string engine;  // "engine 12 (TENSOR_CORE), deterministic"
    bool fallback_heuristics = false;  // from cuDNN's fallback list, not heuristics mode A
    std::int64_t runs = 0;
    // Autotuning's other candidates, until the key's first run times them; then empty.
    std::vector<std::unique_ptr<Plan>> untimed;
    std::string tuning;  // what autotuning measured (report())
    // The workspace every candidate fits in.
    std::int64_t tuning_workspace() const;
  };

  Plan* get(const conv::PlanKey& key, cudnnHandle_t handle, std::string_view op);
  // The key's convolution operation as get() builds it, up to the operation graph (which needs a
  // handle, so a device): cuDNN checks its tensors, descriptor and shapes on the host. Empty when
  // they pass, else the first failing step and cuDNN's status.
  static std::string host_check(const conv::PlanKey& key);
  void run(const Plan& plan, cudnnHandle_t handle, void* uid1, void* uid2, void* uid3,
           void* workspace, std::string_view op);
  // Runs the key's plan (get() made it); false, with the key declined for good (its reason in
  // declined(key)), when cuDNN refuses to execute a plan that never ran (a NOT_SUPPORTED status:
  // an engine that finalized but cannot run this beta or these pointers), so that the caller tries
  // its next route. Any other failure raises BackendError.
  bool run_or_decline(const conv::PlanKey& key, cudnnHandle_t handle, void* uid1, void* uid2,
                      void* uid3, void* workspace, std::string_view op);
  // Times `plan`'s candidates on these pointers (the output's may be a scratch: a beta = 1 plan
  // adds into it at every call) with `workspace` of at least plan.tuning_workspace() bytes, and
  // keeps the fastest in `plan`. Does nothing without candidates. Not during a stream capture:
  // the caller checks that (stream_capturing) before it asks for the memory to time in.
  void autotune(Plan& plan, cudnnHandle_t handle, cudaStream_t stream, void* uid1, void* uid2,
                void* uid3, void* workspace, std::string_view op);
  // Marks a plan's candidates as left untimed (`why` goes to the report): the first one runs.
  static void skip_autotune(Plan& plan, std::string why);
  // Drops the candidates whose workspace is over `bytes` (there is no memory to time them in);
  // returns how many went. The plan itself (candidate 0) stays whatever its workspace.
  static std::size_t drop_candidates_over(Plan& plan, std::int64_t bytes);
  // Why the last declined key was declined (each engine configuration's reason).
  const std::string& declined(const conv::PlanKey& key) const;
  std::vector<std::string> report() const;
  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::unique_ptr<Plan> plan;  // null: declined
    std::string why;
  };
  Entry build(const conv::PlanKey& key, cudnnHandle_t handle, std::string_view op);
  // The variant pack and cudnnBackendExecute; counts the run when it succeeds.
  static cudnnStatus_t execute(const Plan& plan, cudnnHandle_t handle, void* uid1, void* uid2,
                               void* uid3, void* workspace, std::string_view op);
  std::unordered_map<conv::PlanKey, Entry, conv::PlanKeyHash> entries_;
  bool deterministic_first_ = true;
  int autotune_ = 0;
  int rounds_ = 3;
};

// The backend's convolution state, created on the first convolution: the cuDNN handle, the plans,
// and grow-only scratch (cuDNN's workspace, decoded operands, the channels-last weights, FP32
// outputs before their finish). tune_workspace and tune_out (a beta = 1 key's timing output) are
// autotuning's, released after each key's timing: a candidate that loses must not leave its
// workspace (an FFT engine's can be large) held for the run, nor a timing its fp32 output.
struct ConvState {
  ConvState(bool deterministic_first, int autotune) : plans(deterministic_first, autotune) {}
  CudnnHandle handle;
  ConvPlans plans;
  DeviceScratch workspace, a, b, out, tune_workspace, tune_out;
  // Every buffer above, for what the context does to each (its out-of-memory hook, its graph
  // guard, freeing retired blocks) and for device_bytes: one list, so a new buffer misses none.
  std::array<DeviceScratch*, 6> scratch() {
    return {&workspace, &a, &b, &out, &tune_workspace, &tune_out};
  }
  std::array<const DeviceScratch*, 6> scratch() const {
    return {&workspace, &a, &b, &out, &tune_workspace, &tune_out};
  }
  std::size_t device_bytes() const {
    std::size_t bytes = 0;
    for (const DeviceScratch* s : scratch()) bytes += s->capacity();
    return bytes;
  }
};

}  // namespace mixtrain::backend_cuda
