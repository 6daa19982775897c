// Components::origins, which the data-parallel start check compares with the config: each
// configured component with the plugin, version and library file it came from, in TOML lines
// whose first difference between two ranks is named by its key.
#include <gtest/gtest.h>

#include <string>

#include "built_plugins.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/distributed/config_agreement.h"

namespace mixtrain {
namespace {

TEST(ComponentOrigins, NameEachComponentsPluginVersionAndLibrary) {
  auto& registry = test::built_plugins();
  const auto experiment =
      core::parse_experiment(core::Config::from_file(MIXTRAIN_CONFIGS_DIR "/quickstart.toml",
                                                     {"scaler.type=dynamic", "optimizer.type=sgd"}),
                             registry);
  const auto c = core::create_components(experiment, registry);
  const auto* scaler = registry.find(sdk::ComponentKind::scaler, "dynamic");
  ASSERT_NE(scaler, nullptr);
  const std::string line = "scaler = \"dynamic from plugin " + scaler->plugin_name + " " +
                           scaler->plugin_version + " (" + scaler->library.filename().string() +
                           ")\"\n";
  EXPECT_EQ(c.origins.rfind("[loaded]\n", 0), 0u) << c.origins;
  EXPECT_NE(c.origins.find(line), std::string::npos) << c.origins;
  for (const char* kind :
       {"\nbackend = \"cpu from plugin ", "\npolicy = \"fp32 from plugin ",
        "\noptimizer = \"sgd from plugin ", "\ncheckpoint_format = \"native from plugin "})
    EXPECT_NE(c.origins.find(kind), std::string::npos) << kind << c.origins;
  // Another build of the scaler's plugin on one rank: the start check names the component.
  std::string other = c.origins;
  other.replace(other.find(line), line.size(),
                "scaler = \"dynamic from plugin " + scaler->plugin_name + " 9.9.9 (" +
                    scaler->library.filename().string() + ")\"\n");
  EXPECT_EQ(core::first_config_difference(c.origins, other).rfind("loaded.scaler: ", 0), 0u)
      << core::first_config_difference(c.origins, other);
  EXPECT_EQ(core::first_config_difference(c.origins, c.origins), "");
}

}  // namespace
}  // namespace mixtrain
