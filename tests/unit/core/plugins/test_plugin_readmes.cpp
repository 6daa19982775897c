// Every option of every component the build's plugins declare is in its plugin's README, with its
// default: the README is the reference a user reads, so it is checked against the schemas the
// code declares (docs/architecture.md, "Contracts kept true by tests").
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// plugins/<folder>/README.md of a plugin library: libmixtrain_<stem>.so is built from
// plugins/<stem>, plugins/communicator_<stem> or plugins/backend_<stem>.
fs::path readme_of(const fs::path& library) {
  std::string stem = library.stem().string();
  stem = stem.substr(std::string("libmixtrain_").size());
  const fs::path plugins = fs::path(MIXTRAIN_TEST_SOURCE_DIR) / "plugins";
  for (const std::string& folder : {stem, "communicator_" + stem, "backend_" + stem})
    if (fs::exists(plugins / folder / "README.md")) return plugins / folder / "README.md";
  return {};
}

TEST(PluginReadmes, EveryDeclaredOptionIsDocumentedWithItsDefault) {
  PluginRegistry registry;
  registry.scan({fs::path(MIXTRAIN_TEST_PLUGIN_DIR).parent_path().parent_path() / "lib" /
                 "mixtrain" / "plugins"});
  int checked = 0;
  for (const auto& kind : {sdk::ComponentKind::backend, sdk::ComponentKind::policy,
                           sdk::ComponentKind::scaler, sdk::ComponentKind::optimizer,
                           sdk::ComponentKind::checkpoint_format, sdk::ComponentKind::communicator})
    for (const auto& name : registry.names(kind)) {
      const LoadedComponent* c = registry.find(kind, name);
      ASSERT_NE(c, nullptr);
      if (c->info.options.empty()) continue;
      const fs::path readme = readme_of(c->library);
      ASSERT_FALSE(readme.empty()) << c->library << " has no README next to its sources";
      const std::string text = read_text(readme);
      for (const auto& spec : c->info.options) {
        // A row of this option that gives its default (a README may table the option once per
        // component, with each one's default).
        const std::string row = "| `" + spec.name + "` |";
        const std::string dflt = sdk::option_value_to_string(spec.default_value);
        bool named = false, documented = false;
        for (auto at = text.find(row); at != std::string::npos; at = text.find(row, at + 1)) {
          named = true;
          documented |= text.substr(at, text.find('\n', at) - at).find(dflt) != std::string::npos;
        }
        EXPECT_TRUE(named) << readme << " has no row for " << sdk::component_kind_name(kind) << " '"
                           << name << "' option `" << spec.name << "`";
        EXPECT_TRUE(!named || documented) << readme << ": no row of `" << spec.name << "` gives "
                                          << name << "'s default " << dflt;
        ++checked;
      }
    }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace mixtrain::core
