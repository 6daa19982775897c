// ProfilingBackend: a DeviceBackend that forwards every op to another backend and adds up the
// wall time of each, by scope and op: a profiler for `mixtrain train --profile` and benchmarks.
//
// Contract
// - Wraps `inner` (shared ownership); offers exactly the facets `inner` offers: each facet the
//   profiler knows and `inner` has at the SDK's version is wrapped (its ops timed); any other
//   name is answered by `inner` itself (nullptr when it lacks the facet, so plan-time errors are
//   the inner backend's; a facet the profiler does not know passes through untimed).
// - Each op is timed from its call until inner->synchronize() returns, so asynchronous (GPU)
//   backends are timed per op too, at the cost of one wait per op; results are unchanged.
// - The scope of an op is the innermost ProfileScope open on the calling thread when it is
//   called (core/src/profiling/profile_scope.h: the model names each node's type, the trainer names the
//   optimizer, gradient checks, data and evaluation), "other" outside any.
// - Recording is on from construction; set_recording(false) pauses it, reset() clears the table.
// - Not thread-safe: one training thread calls the backend (as the Trainer does).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

struct ProfileEntry {
  std::string scope;  // e.g. "attention", "linear", "classifier", "optimizer"
  std::string op;     // the backend op, e.g. "gemm", "softmax_forward", "adamw_update"
  std::int64_t calls = 0;
  double seconds = 0.0;
};

class ProfilingBackend;
std::shared_ptr<ProfilingBackend> make_profiling_backend(std::shared_ptr<sdk::DeviceBackend> inner);

class ProfilingBackend : public sdk::DeviceBackend {
 public:
  // Entries recorded so far, most time first.
  virtual std::vector<ProfileEntry> entries() const = 0;
  // Wall time since the last reset() (or construction) while recording, ops or not.
  virtual double recorded_seconds() const = 0;
  virtual void set_recording(bool on) = 0;
  virtual void reset() = 0;
};

// The table `mixtrain train --profile` prints: a summary by group (GEMMs, attention softmax,
// layer norm, classifier, optimizer, ...; see profile_group()) over `steps` steps, then every
// (scope, op) row. Percentages are of recorded_seconds(); "outside backend ops" is the rest.
std::string format_profile(const ProfilingBackend& p, std::int64_t steps);
// The group a (scope, op) row counts in: "classifier" for the LM head and loss, "optimizer",
// "gradient checks", "GEMMs" for the other GEMMs, "attention softmax", "layer norm", ...
std::string profile_group(const ProfileEntry& e);

}  // namespace mixtrain::core
