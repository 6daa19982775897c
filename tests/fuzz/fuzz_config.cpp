// Fuzzes the config front end as `mixtrain check` runs it: Config::from_string with `--set`
// overrides, parse_experiment against the real plugins of this build, create_components (the
// plugins' own checks on their options) and resolved_toml. Oracle beyond "no crash": the
// resolved config parses back to itself, as the run folder's config.toml must reproduce the run.
//
// Input: TOML text, optionally followed by a line "#--set" and up to four override lines
// ("key=value"). "#--set" is a TOML comment, so a seed stays a valid config either way.
// Every sdk::UserError is an expected rejection; any other exception, crash or sanitizer report
// is a finding (the CLI would exit 1 or die instead of exiting 2 with a message).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/error.h"

namespace {

const mixtrain::core::PluginRegistry& registry() {
  static const auto* r = [] {
    auto* reg = new mixtrain::core::PluginRegistry();
    reg->scan({MIXTRAIN_FUZZ_PLUGIN_DIR});
    if (reg->components().empty()) __builtin_trap();  // a broken build, not a finding
    return reg;
  }();
  return *r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& reg = registry();
  const auto parts = mixtrain::fuzz::split_at(mixtrain::fuzz::as_view(data, size), "#--set\n");
  std::vector<std::string> overrides;
  std::string_view rest = parts.second;
  while (parts.found && !rest.empty() && overrides.size() < 4) {
    const auto line = mixtrain::fuzz::split_at(rest, "\n");
    overrides.emplace_back(line.first);
    rest = line.found ? line.second : std::string_view{};
  }
  std::string resolved;
  try {
    const auto config = mixtrain::core::Config::from_string(parts.first, "fuzz.toml", overrides);
    const auto e = mixtrain::core::parse_experiment(config, reg);
    (void)mixtrain::core::create_components(e, reg);
    resolved = mixtrain::core::resolved_toml(e);
  } catch (const mixtrain::sdk::UserError&) {
    return 0;
  }
  // A resolved config that is refused, or resolves to something else, is a finding. Same source
  // name: the resolved config's first line names it.
  const auto again = mixtrain::core::resolved_toml(mixtrain::core::parse_experiment(
      mixtrain::core::Config::from_string(resolved, "fuzz.toml"), reg));
  if (again != resolved) __builtin_trap();
  return 0;
}
