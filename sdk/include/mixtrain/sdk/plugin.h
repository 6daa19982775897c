// The plugin entry point: one exported descriptor per shared library.
//
// Contract
// - A plugin library defines exactly one MIXTRAIN_PLUGIN(name, version, components_fn). It
//   exports, through a Boost.DLL alias named "mixtrain_plugin_descriptor", a function returning a
//   pointer to a static PluginDescriptor.
// - The host reads `abi_version` and `build_fingerprint` first — their position never changes —
//   and touches nothing else when either differs from its own: C++ objects cross this boundary, so
//   the compiler, the standard-library ABI and the SDK ABI must all match.
// - components() lists every component the library provides; a factory receives validated
//   Options and a PluginContext and returns an object of the kind's interface, or throws (the host
//   attaches the plugin and component names to the message).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/config.hpp>
#include <boost/dll/alias.hpp>

#include "mixtrain/sdk/component.h"
#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/version.h"

namespace mixtrain::sdk {

enum class ComponentKind { backend, policy, scaler, optimizer, checkpoint_format, communicator };
std::string_view component_kind_name(ComponentKind k) noexcept;  // "backend", "policy", ...

struct PluginContext {
  Logger logger;             // component-scoped, e.g. "scaler.dynamic"
  std::string plugin_name;   // "scalers"
  std::string component_name;
};

using ComponentFactory = std::unique_ptr<Component> (*)(const Options&, const PluginContext&);

struct ComponentInfo {
  ComponentKind kind;
  std::string name;         // selected in TOML: [scaler] type = "dynamic"
  std::string description;  // one line
  OptionSchema options;
  ComponentFactory create;
};

struct PluginDescriptor {
  std::uint32_t abi_version;      // must stay the first member
  const char* build_fingerprint;  // must stay the second member
  const char* name;
  const char* version;
  std::vector<ComponentInfo> (*components)();
};

// Factory adaptor for components constructible from (const Options&, const PluginContext&).
template <class T>
std::unique_ptr<Component> make_component(const Options& options, const PluginContext& context) {
  return std::make_unique<T>(options, context);
}

}  // namespace mixtrain::sdk

#define MIXTRAIN_PLUGIN(NAME, VERSION, COMPONENTS_FN)                                      \
  namespace {                                                                              \
  const ::mixtrain::sdk::PluginDescriptor* mixtrain_plugin_descriptor_impl() {             \
    static const ::mixtrain::sdk::PluginDescriptor descriptor{                             \
        ::mixtrain::sdk::kSdkAbiVersion, MIXTRAIN_BUILD_FINGERPRINT, NAME, VERSION,        \
        COMPONENTS_FN};                                                                    \
    return &descriptor;                                                                    \
  }                                                                                        \
  }                                                                                        \
  BOOST_DLL_ALIAS(mixtrain_plugin_descriptor_impl, mixtrain_plugin_descriptor)
