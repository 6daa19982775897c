// The hint of a key written in the wrong table (`run.lr` for the optimizer's lr): an unknown key
// with no near name in its own table is looked up in every other section of the config
// (section_catalog.h), so the error points where the key lives instead of saying nothing.
//
// Contract: for a ConfigError "unknown key" whose hint has no "did you mean", and whose last
// component (the whole key for one outside any table) is a key of other sections, the same error
// (location, key, message) with a hint naming those sections first (a section's default component
// first); any other error gives std::nullopt, for the caller to rethrow unchanged. A section that
// `config` would not read (the table of a component it does not select: [data.cifar10] under
// source = "text") is never offered as a "did you mean": the hint names it with the selector that
// reads it instead, so following the hint never leads to a key that is ignored.
#pragma once

#include <optional>

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

std::optional<sdk::ConfigError> with_owner_hint(const sdk::ConfigError& e,
                                                const PluginRegistry& registry,
                                                const Config& config);

}  // namespace mixtrain::core
