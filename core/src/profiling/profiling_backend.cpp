// ProfilingBackend: a DeviceBackend that forwards to another and times every op it forwards; see
// profiling_backend.h for the contract.
#include "mixtrain/core/profiling/profiling_backend.h"

#include <memory>
#include <string_view>
#include <tuple>
#include <utility>

#include "profiling/profile_scope.h"
#include "profiling/profiled_facets.h"
#include "profiling/recorder.h"

namespace mixtrain::core {

thread_local const char* ProfileScope::current_ = nullptr;

namespace {

using sdk::TensorView;

class ProfilingBackendImpl final : public ProfilingBackend {
 public:
  explicit ProfilingBackendImpl(std::shared_ptr<sdk::DeviceBackend> inner)
      : in_(std::move(inner)), rec_(*in_) {
    std::apply([&](auto&... w) { (wrap(w), ...); }, facets_);
  }

  // --- the profiler ---
  std::vector<ProfileEntry> entries() const override { return rec_.entries(); }
  double recorded_seconds() const override { return rec_.recorded_seconds(); }
  void set_recording(bool on) override { rec_.set_recording(on); }
  void reset() override { rec_.reset(); }

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
  void synchronize() override { in_->synchronize(); }
  void cast(TensorView s, TensorView d, const sdk::CastArgs& a) override {
    rec_.timed("cast", [&] { in_->cast(s, d, a); });
  }
  void fill(TensorView x, float v) override {
    rec_.timed("fill", [&] { in_->fill(x, v); });
  }

  // A facet the profiler wraps, when the inner backend has it at the version the profiler
  // speaks; anything else is the inner backend's own answer (nullptr, an older version the host
  // will refuse by name, or a facet this profiler does not know, unprofiled).
  sdk::Facet* find_facet(std::string_view name) override {
    // A profile times each op as it is called; a recorded step graph would hide them all.
    if (name == sdk::StepGraphFacet::kName) return nullptr;
    sdk::Facet* found = nullptr;
    std::apply(
        [&](auto&... w) {
          ((found == nullptr && w != nullptr && name == w->name() ? void(found = w.get()) : void()),
           ...);
        },
        facets_);
    return found != nullptr ? found : in_->find_facet(name);
  }

 private:
  template <class W>
  void wrap(std::unique_ptr<W>& w) {
    if (auto* f = sdk::facet<typename W::Inner>(*in_)) w = std::make_unique<W>(rec_, *f);
  }

  std::shared_ptr<sdk::DeviceBackend> in_;
  profiling::Recorder rec_;
  std::tuple<
      std::unique_ptr<profiling::ProfiledGemm>, std::unique_ptr<profiling::ProfiledActivation>,
      std::unique_ptr<profiling::ProfiledResidual>,
      std::unique_ptr<profiling::ProfiledGradientCheck>,
      std::unique_ptr<profiling::ProfiledForeach>, std::unique_ptr<profiling::ProfiledLayerNorm>,
      std::unique_ptr<profiling::ProfiledBatchNorm>, std::unique_ptr<profiling::ProfiledLoss>,
      std::unique_ptr<profiling::ProfiledOptimizer>, std::unique_ptr<profiling::ProfiledAttention>,
      std::unique_ptr<profiling::ProfiledEmbedding>,
      std::unique_ptr<profiling::ProfiledConvolution>, std::unique_ptr<profiling::ProfiledDropout>>
      facets_;
};

}  // namespace

std::shared_ptr<ProfilingBackend> make_profiling_backend(
    std::shared_ptr<sdk::DeviceBackend> inner) {
  return std::make_shared<ProfilingBackendImpl>(std::move(inner));
}

}  // namespace mixtrain::core
