// What the policy and checkpoint format suites share (not installed): small models trained through
// the host (core::Trainer) with a component under test in place of the configured one.
//
// Contract
// - TinyModel names a config the kit carries: an MLP on synthetic clusters, a one-block GPT on a
//   byte corpus the kit writes into the run's scratch folder, a two-convolution CNN with batch
//   norm on synthetic images. Each logs every step's loss, evaluates only when asked and writes
//   checkpoints only where `sets` asks (checkpoint.every).
// - tiny_session() parses the config with `sets` and makes its components from
//   plugin_search_path()'s plugins (a PluginRegistry of its own, kept alive by the components):
//   sdk::PluginError where those folders lack the CPU backend or a built-in component.
// - step_losses() reads a run folder's metrics.jsonl: the loss of each step record by its step, as
//   the bits the host wrote (doubles), NaN for a null.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/config/experiment.h"

namespace mixtrain::conformance::internal {

enum class TinyModel { mlp, gpt, cnn };
std::string_view tiny_model_name(TinyModel model);

struct TinySession {
  core::Experiment experiment;
  core::Components components;
};
TinySession tiny_session(TinyModel model, const std::vector<std::string>& sets,
                         const std::filesystem::path& scratch);

std::map<std::int64_t, double> step_losses(const std::filesystem::path& run_dir);

// A component's test name as add_scaler() and the others take it: letters, digits and '_', and
// not one `taken` already has (GoogleTest would abort the program over it, naming neither);
// std::invalid_argument naming the kind, the name and the rule otherwise.
void check_test_name(const std::string& kind, const std::string& name,
                     const std::vector<std::string>& taken);

// A factory's failure as the user reads it: a UserError's hint says how to fix it.
std::string failure_text(const std::exception& e);

// A folder of its own under the system's temporary folder for the running test, removed when the
// object goes unless the test failed (then kept, and its path is in the failure's text).
class ScratchFolder {
 public:
  ScratchFolder();
  ~ScratchFolder();
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace mixtrain::conformance::internal
