// FacetRegistry<Context>: the facet objects one backend plugin implements, each registering itself
// from its own source file (as a GoogleTest TEST registers itself), so that adding a facet to a
// backend is that one file: no member, no table entry, no base class in the backend.
//
// Contract
// - Context is the backend's shared device context (the CUDA device, stream and handles; the CPU
//   thread count and engines). Every facet object is constructed from a Context& and must not
//   outlive it: the backend owns the context and, declared after it, the FacetSet made over it.
// - A source file registers an implementation with one namespace-scope object:
//     const sdk::FacetRegistration<CudaContext, sdk::DropoutFacet, CudaDropout> kRegistration;
//   Interface is a facet of sdk/facet_list.h; Impl derives from it and is constructible from
//   Context&. Registration runs during static initialisation, so a backend's objects must be
//   linked whole: its implementation is an OBJECT library, never a static archive whose
//   unreferenced members a linker drops.
// - make_facets(context) constructs one object per registration, in registration order (link
//   order: nothing may depend on it). Two registrations of one facet name raise BackendError
//   naming it: a backend has one implementation of each facet.
// - FacetSet::find(name) returns the object as the sdk::Facet base of its Interface (what
//   sdk::facet<Interface> casts back), or nullptr. get<Impl>() is the implementation itself, for
//   a backend's own calls and its tests; it throws BackendError when no Impl was registered.
// - Part of the support library: compiled into each plugin, in no ABI digest.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

// Owns one facet object of any implementation type (a facet's destructor is protected: the
// interface never owns).
class FacetHolder {
 public:
  virtual ~FacetHolder() = default;
  // The object as the Facet base of the interface it was registered for.
  virtual Facet* facet() noexcept = 0;
};

template <class Context>
class FacetRegistry {
 public:
  struct Entry {
    std::string_view name;  // the interface's kName
    std::unique_ptr<FacetHolder> (*make)(Context&);
  };
  // Every registration linked into this module, in the order static initialisation ran them.
  static std::vector<Entry>& entries() {
    static std::vector<Entry> registered;
    return registered;
  }
};

template <class Context, class Interface, class Impl>
class FacetRegistration {
  static_assert(std::is_base_of_v<Interface, Impl>, "Impl must implement the facet Interface");
  static_assert(std::is_constructible_v<Impl, Context&>, "Impl must be constructible from Context&");

  struct Held final : FacetHolder {
    explicit Held(Context& context) : impl(context) {}
    Facet* facet() noexcept override { return static_cast<Interface*>(&impl); }
    Impl impl;
  };

 public:
  FacetRegistration() {
    FacetRegistry<Context>::entries().push_back(
        {Interface::kName, [](Context& context) -> std::unique_ptr<FacetHolder> {
           return std::make_unique<Held>(context);
         }});
  }
};

// The facet objects of one backend object, made over its context.
class FacetSet {
 public:
  FacetSet() = default;
  FacetSet(FacetSet&&) noexcept = default;
  FacetSet& operator=(FacetSet&&) noexcept = default;

  Facet* find(std::string_view name) const noexcept {
    for (const auto& h : held_)
      if (h->facet()->name() == name) return h->facet();
    return nullptr;
  }
  // The registered implementation of type Impl (a backend's own calls, its tests).
  template <class Impl>
  Impl& get() const {
    for (const auto& h : held_)
      if (auto* impl = dynamic_cast<Impl*>(h->facet())) return *impl;
    throw BackendError("FacetSet::get: no facet object of the requested implementation type was "
                       "registered in this backend (is its source file linked into the module?)");
  }
  std::size_t size() const noexcept { return held_.size(); }

 private:
  template <class Context>
  friend FacetSet make_facets(Context& context);
  std::vector<std::unique_ptr<FacetHolder>> held_;
};

template <class Context>
FacetSet make_facets(Context& context) {
  FacetSet set;
  for (const auto& entry : FacetRegistry<Context>::entries()) {
    if (set.find(entry.name) != nullptr)
      throw BackendError("facet '" + std::string(entry.name) +
                         "' is registered twice in this backend; keep one "
                         "FacetRegistration per facet");
    set.held_.push_back(entry.make(context));
  }
  return set;
}

}  // namespace mixtrain::sdk
