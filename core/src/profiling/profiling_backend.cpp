// ProfilingBackend: a DeviceBackend that forwards to another and times every op it forwards; see
// profiling_backend.h for the contract.
#include "mixtrain/core/profiling/profiling_backend.h"

#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/sdk/backend_call_observer.h"
#include "mixtrain/sdk/backend_kernel_trace.h"
#include "mixtrain/sdk/backend_step_graph.h"
#include "mixtrain/sdk/error.h"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "profiling/profile_scope.h"
#include "profiling/recorder.h"

namespace mixtrain::core {

thread_local const char* ProfileScope::current_ = nullptr;
thread_local const char* ProfileScope::node_ = nullptr;

namespace {

using sdk::TensorView;

// The profiler's call_observer facet: times each facet call made through a FacetCall.
class CallTimer final : public sdk::CallObserverFacet {
 public:
  explicit CallTimer(profiling::Recorder& recorder) : rec_(recorder) {}
  void begin_facet_call() noexcept override { rec_.begin(); }
  void end_facet_call(std::string_view op) noexcept override { rec_.end(op); }

 private:
  profiling::Recorder& rec_;
};

class ProfilingBackendImpl final : public ProfilingBackend {
 public:
  explicit ProfilingBackendImpl(std::shared_ptr<sdk::DeviceBackend> inner)
      : in_(std::move(inner)), rec_(*in_), timer_(rec_) {}
  // A trace still running (a run that stopped before closing its span) is stopped: the device's
  // tracing library is the process's, and another backend may want it.
  ~ProfilingBackendImpl() override {
    try {
      stop_trace();
    } catch (...) {  // a destructor reports nothing; the trace is what is lost
    }
  }

  // --- the profiler ---
  std::vector<ProfileEntry> entries() const override { return rec_.entries(); }
  std::vector<ProfileNodeEntry> node_entries() const override { return rec_.node_entries(); }
  double recorded_seconds() const override { return rec_.recorded_seconds(); }
  void set_recording(bool on) override {
    rec_.raise_pending();
    const bool was = rec_.recording();
    if (on && !was) start_trace();
    rec_.set_recording(on);
    if (!on && was) stop_trace();
  }
  bool recording() const override { return rec_.recording(); }
  void reset() override {
    rec_.reset();
    kernels_.trace = {};
  }
  KernelTraceResult kernel_trace() const override { return kernels_; }

  // --- DeviceBackend ---
  sdk::BackendCapabilities capabilities() const override { return in_->capabilities(); }
  void* allocate(std::size_t bytes) override { return in_->allocate(bytes); }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(TensorView d, const void* s) override {
    rec_.timed("copy_from_host", [&] { in_->copy_from_host(d, s); });
  }
  void copy_to_host(void* d, TensorView s) override {
    rec_.timed("copy_to_host", [&] { in_->copy_to_host(d, s); });
  }
  void copy(TensorView d, TensorView s) override {
    rec_.timed("copy", [&] { in_->copy(d, s); });
  }
  void synchronize() override {
    rec_.raise_pending();
    in_->synchronize();
  }
  void cast(TensorView s, TensorView d, const sdk::CastArgs& a) override {
    rec_.timed("cast", [&] { in_->cast(s, d, a); });
  }
  void fill(TensorView x, float v) override {
    rec_.timed("fill", [&] { in_->fill(x, v); });
  }

  // The inner backend's facets themselves, and this profiler's call_observer: their calls are
  // timed where they are made, through a FacetCall (sdk/backend_call_observer.h), for every facet
  // alike.
  sdk::Facet* find_facet(std::string_view name) override {
    // A profile times each op as it is called; a recorded step graph would hide them all.
    if (name == sdk::StepGraphFacet::kName) return nullptr;
    if (name == sdk::CallObserverFacet::kName) return &timer_;
    return in_->find_facet(name);
  }

 private:
  void start_trace() {
    auto* trace = sdk::facet<sdk::KernelTraceFacet>(*in_);
    if (trace == nullptr) return;
    kernels_.offered = true;
    if (!kernels_.error.empty()) return;  // it failed once; every span would fail alike
    try {
      trace->start_kernel_trace();
      tracing_ = true;
    } catch (const sdk::BackendError& e) {
      kernels_.error = std::string(e.what()) + " (" + e.hint() + ")";
    }
  }
  void stop_trace() {
    if (!tracing_) return;
    tracing_ = false;
    try {
      merge(sdk::facet<sdk::KernelTraceFacet>(*in_)->stop_kernel_trace());
    } catch (const sdk::BackendError& e) {
      kernels_.error = std::string(e.what()) + " (" + e.hint() + ")";
    }
  }
  void merge(const sdk::KernelTrace& span) {
    auto& all = kernels_.trace.kernels;
    for (const sdk::KernelTime& k : span.kernels) {
      auto it = std::find_if(all.begin(), all.end(),
                             [&](const sdk::KernelTime& a) { return a.name == k.name; });
      if (it == all.end()) {
        all.push_back(k);
      } else {
        it->calls += k.calls;
        it->device_seconds += k.device_seconds;
      }
    }
    kernels_.trace.dropped += span.dropped;
    std::stable_sort(all.begin(), all.end(),
                     [](const sdk::KernelTime& a, const sdk::KernelTime& b) {
                       return a.device_seconds > b.device_seconds;
                     });
  }

  std::shared_ptr<sdk::DeviceBackend> in_;
  profiling::Recorder rec_;
  CallTimer timer_;
  KernelTraceResult kernels_;
  bool tracing_ = false;
};

}  // namespace

std::shared_ptr<ProfilingBackend> make_profiling_backend(
    std::shared_ptr<sdk::DeviceBackend> inner) {
  return std::make_shared<ProfilingBackendImpl>(std::move(inner));
}

}  // namespace mixtrain::core
