// Training parity: the quickstart config trained on both backends through the core API.
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "conformance_fixture.h"
#include "embedded_quickstart.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/trainer.h"

namespace mixtrain::conformance {
namespace internal {
void link_training() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

TEST_P(Conformance, TrainingParityOnQuickstart) {
  auto train = [&](const std::vector<std::string>& backend_sets) {
    auto config = core::Config::from_string(kEmbeddedQuickstartToml, "quickstart.toml", [&] {
      std::vector<std::string> sets = {"run.steps=100", "run.log_every=1", "run.eval_every=0",
                                       "checkpoint.every=0"};
      sets.insert(sets.end(), backend_sets.begin(), backend_sets.end());
      return sets;
    }());
    core::PluginRegistry registry(&core::host_log_sink());
    registry.scan(plugin_search_path());
    auto e = core::parse_experiment(config, registry);
    auto c = core::create_components(e, registry);
    auto dir = std::filesystem::temp_directory_path() /
               ("mixtrain-conformance-" + std::to_string(::getpid()) + "-" +
                std::to_string(backend_sets.size()));
    std::filesystem::remove_all(dir);
    core::TrainOptions opt;
    opt.run_dir = dir;
    core::Trainer(e, std::move(c), opt).run();
    std::vector<double> losses;
    std::ifstream metrics(dir / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    }
    std::filesystem::remove_all(dir);
    return losses;
  };
  if (GetParam().config_overrides.empty())
    GTEST_SKIP() << "no config selects backend '" << GetParam().name << "'";
  auto want = train({"backend.type=cpu"});
  std::vector<double> got;
  try {
    got = train(GetParam().config_overrides);
  } catch (const sdk::BackendError& e) {
    // A backend that lacks an op the training step needs (a facet is optional) cannot train:
    // skipped, as every case of a facet it lacks is. Any other failure fails the case.
    if (std::string(e.what()).find("does not provide") == std::string::npos) throw;
    GTEST_SKIP() << "backend '" << GetParam().name << "' cannot train the quickstart: " << e.what();
  }
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-3 * std::abs(want[i]) + 1e-5) << "step " << i + 1;
}

}  // namespace
}  // namespace mixtrain::conformance
