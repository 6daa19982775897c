// CallObserverFacet: what times facet calls (the profiler), and FacetCall, the one-call handle
// through which callers that keep a facet make each call — the host and plugins alike.
//
// Contract
// - A backend that observes facet calls offers it as find_facet("call_observer"): the
//   ProfilingBackend does (`--profile`); a device backend has none (nullptr).
// - begin_facet_call() before a call, end_facet_call(op) after it returns: the observer waits for
//   the call on the device and records it under `op` (the facet method's name); neither throws (a
//   device error surfaces at the next backend call). One caller thread at a time.
// - FacetCall<F>{facet, observer, op}: use it as a pointer to the facet for one call,
//   `call->adamw_update(...)`; with an observer (non-null) the call is timed from the FacetCall's
//   construction to the end of the full expression, a call that throws is not recorded. Without
//   one it is a plain pointer. Every facet is profiled this way with no code per facet: a caller
//   binds the observer once, when it binds its facets.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <exception>
#include <string_view>

#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

class MIXTRAIN_SDK_API CallObserverFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "call_observer";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual void begin_facet_call() noexcept = 0;
  virtual void end_facet_call(std::string_view op) noexcept = 0;

 protected:
  ~CallObserverFacet() override;  // not owned through the facet: the backend is
};

// One call of facet F, timed under `op` when `observer` is set.
template <class F>
class [[nodiscard]] FacetCall {
 public:
  FacetCall(F* facet, CallObserverFacet* observer, std::string_view op) noexcept
      : facet_(facet), observer_(observer), op_(op) {
    if (observer_ != nullptr) observer_->begin_facet_call();
  }
  FacetCall(const FacetCall&) = delete;
  FacetCall& operator=(const FacetCall&) = delete;
  ~FacetCall() {
    if (observer_ != nullptr && std::uncaught_exceptions() == 0) observer_->end_facet_call(op_);
  }
  F* operator->() const noexcept { return facet_; }
  F& operator*() const noexcept { return *facet_; }

 private:
  F* facet_;
  CallObserverFacet* observer_;
  std::string_view op_;
};

}  // namespace mixtrain::sdk
