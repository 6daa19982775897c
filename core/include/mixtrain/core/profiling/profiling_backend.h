// ProfilingBackend: a DeviceBackend that forwards every op to another backend and adds up the
// wall time of each, by scope and op: a profiler for `mixtrain train --profile` and benchmarks.
//
// Contract
// - Wraps `inner` (shared ownership); offers exactly the facets `inner` offers (but step_graph: a
//   recorded graph would hide every op), the inner backend's own objects. Their calls are timed
//   where the host makes them, through BoundFacets (graph/bound_facets.h), which finds this
//   backend's timer when it binds: every facet is profiled, and none needs code here. A facet call
//   is named after its op ("softmax_forward") or, where the host names none, its facet
//   ("attention"); the backend's own ops after themselves ("copy", "cast").
// - Each op is timed from its call until inner->synchronize() returns, so asynchronous (GPU)
//   backends are timed per op too, at the cost of one wait per op; results are unchanged. An error
//   that wait raises (a device check, such as a bad label, that reports once) is raised by that op,
//   or, after a facet call (whose observer cannot throw), by the next op, synchronize() or
//   set_recording(): never dropped.
// - The scope of an op is the innermost ProfileScope open on the calling thread when it is
//   called (core/src/profiling/profile_scope.h: the model names each node's type, the trainer names
//   the optimizer, gradient checks and data), "other" outside any.
// - Ops run inside a model node's ProfileScope (the executor's, one per node) are also added up by
//   that node (node_entries()): which layer of a model a convolution's time belongs to.
// - Recording is on from construction; set_recording(false) pauses it, reset() clears the table,
//   recording() says which. The Trainer pauses it around the evaluations and checkpoints inside
//   its loop and closes it when the loop ends, however it ends: what is recorded is steps alone.
// - Where `inner` offers a kernel_trace facet (sdk/backend_kernel_trace.h), each recording span
//   that set_recording(true) opens is traced by the device as well, from just before it opens to
//   just after set_recording(false) closes it (the start and the stop, which waits for the
//   device, stay outside the recorded time); kernel_trace() merges the spans since the last
//   reset() by kernel name. A trace that fails to start is reported once (kernel_trace().error)
//   and not retried; the op table is unaffected either way.
// - Not thread-safe: one training thread calls the backend (as the Trainer does).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/sdk/backend_kernel_trace.h"
#include "mixtrain/sdk/backend_plan_report.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

struct ProfileEntry {
  std::string scope;  // e.g. "attention", "linear", "classifier", "optimizer"
  std::string op;     // the backend op, e.g. "gemm", "softmax_forward", "adamw_update"
  std::int64_t calls = 0;
  double seconds = 0.0;
};

// A ProfileEntry of one model node (its name: "layer1.0.conv2"); entry.scope is its type.
struct ProfileNodeEntry {
  std::string node;
  ProfileEntry entry;
};

// The device's kernels over the recording spans (sdk::KernelTrace), or why there are none.
struct KernelTraceResult {
  bool offered = false;    // the inner backend has a kernel_trace facet
  std::string error;       // why tracing did not start or stop (the library's reason and fix)
  sdk::KernelTrace trace;  // merged by name, most device time first
};

class ProfilingBackend;
std::shared_ptr<ProfilingBackend> make_profiling_backend(std::shared_ptr<sdk::DeviceBackend> inner);

class ProfilingBackend : public sdk::DeviceBackend {
 public:
  // Entries recorded so far, most time first.
  virtual std::vector<ProfileEntry> entries() const = 0;
  // The same ops' entries by model node, most time first (those run outside a node: none).
  virtual std::vector<ProfileNodeEntry> node_entries() const = 0;
  // Wall time since the last reset() (or construction) while recording, ops or not.
  virtual double recorded_seconds() const = 0;
  virtual void set_recording(bool on) = 0;
  virtual bool recording() const = 0;
  virtual void reset() = 0;
  virtual KernelTraceResult kernel_trace() const = 0;
};

// The table `mixtrain train --profile` prints: a summary by group (GEMMs, attention softmax,
// layer norm, classifier, optimizer, ...; see profile_group()) over `steps` steps, then every
// (scope, op) row. Percentages are of recorded_seconds(); "outside backend ops" is the rest.
std::string format_profile(const ProfilingBackend& p, std::int64_t steps);
// What the node table prints of a model node beside its times: its shapes ("[64, 56, 56] ->
// [256, 56, 56]", per sample) and the FLOPs of one forward call of it (a micro-batch's: core's
// summarize_model, forward_flops_per_sample x batch rows).
struct ProfileNodeInfo {
  std::string shapes;
  double forward_flops_per_call = 0.0;
};
// The node table `mixtrain train --profile` prints after its op table: the `top` (node, op) rows by
// time over `steps` steps (node, its type, op, calls/step, ms/step, share of recorded_seconds()),
// each with the node's shapes where `info` names it and, for a convolution's forward, data gradient
// and weight gradient (each one forward's FLOPs), the TFLOP/s it ran at. Nothing when no op ran
// inside a node.
std::string format_node_profile(const ProfilingBackend& p, std::int64_t steps,
                                const std::map<std::string, ProfileNodeInfo>& info,
                                std::size_t top = 30);
// What ran the ops: the backend's plan reports (sdk/backend_plan_report.h: `reports`, its
// plan_report facet's answer, or nullptr when it offers none), as `mixtrain train --profile`
// prints them after its table: "plans:", then per library its name and plan count and a line per
// plan; one line saying so when there is no facet.
std::string format_plan_reports(const std::vector<sdk::PlanReport>* reports);
// The kernel table `mixtrain train --profile` prints last, as torch.profiler's kernel view lists
// them: the `top` kernels by device time per step over `steps` steps (ms/step, share of all
// kernels' time, calls/step, name), headed by the total; nothing when the backend offers no
// kernel trace, one line saying why when it did not run.
std::string format_kernel_trace(const KernelTraceResult& k, std::int64_t steps,
                                std::size_t top = 30);
// The group a (scope, op) row counts in: "classifier" for the LM head and loss, "optimizer",
// "gradient checks", "data", "gradient all-reduce" (by scope, first), "GEMMs" for every other op of
// the GEMM facet that multiplies (gemm_gradient and gemm_block_scaled included), "casts" for casts
// and the FP8 quantizations, "attention softmax", "layer norm", ..., and "other ops" for the rest.
std::string profile_group(const ProfileEntry& e);

}  // namespace mixtrain::core
