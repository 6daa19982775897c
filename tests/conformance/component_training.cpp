// Small models trained through the host for the component kit (contract in component_training.h).
#include "component_training.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <utility>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "conformance_fixture.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::conformance::internal {

namespace {

namespace fs = std::filesystem;

// Common to every tiny model: each step logged, no evaluation or checkpoint unless asked, a
// dynamic scaler so that a policy that needs one (fp16) trains as a config would run it.
constexpr const char* kRun = R"(
[run]
seed = 3
steps = 24
log_every = 1
eval_every = 0

[backend]
type = "cpu"

[precision]
policy = "fp32"

[scaler]
type = "dynamic"

[optimizer]
type = "adamw"

[optimizer.adamw]
lr = 0.01

[checkpoint]
format = "native"
every = 0
keep = 2
)";

// Widths that divide by 32: block-scaled policies plan their operand blocks along them.
constexpr const char* kMlp = R"(
[model]
layers = [ { type = "linear", name = "fc1", out = 64 }, { type = "relu" },
           { type = "linear", name = "head", out = 16 } ]

[data]
source = "synthetic"
batch_size = 32
eval_fraction = 0.125

[data.synthetic]
kind = "clusters"
rows = 1024
features = 32
num_classes = 16
)";

constexpr const char* kGpt = R"(
[model]
preset = "gpt"

[model.gpt]
n_layer = 1
n_head = 2
n_embd = 64

[data]
source = "text"
block_size = 32
batch_size = 4
eval_fraction = 0.1

[data.text]
path = "corpus.txt"  # the scratch folder's, given by tiny_session()
)";

constexpr const char* kCnn = R"(
[model]
nodes = [
  { type = "conv2d", name = "conv1", inputs = ["input"], out = 32, kernel = 3, padding = 1, bias = false },
  { type = "batchnorm2d", name = "bn1", inputs = ["conv1"] },
  { type = "relu", name = "relu1", inputs = ["bn1"] },
  { type = "maxpool2d", name = "pool1", inputs = ["relu1"], kernel = 2 },
  { type = "conv2d", name = "conv2", inputs = ["pool1"], out = 32, kernel = 3, padding = 1 },
  { type = "relu", name = "relu2", inputs = ["conv2"] },
  { type = "global_avgpool", name = "gap", inputs = ["relu2"] },
  { type = "linear", name = "fc", inputs = ["gap"], out = 16 },
]

[data]
source = "synthetic"
batch_size = 32
eval_fraction = 0.125

[data.synthetic]
kind = "images"
rows = 512
channels = 1
height = 8
width = 8
num_classes = 16
noise = 0.3
)";

// About 32 KB of sentences from a small vocabulary, the same bytes every time: a byte-level model
// learns its spelling within a few steps.
void write_corpus(const fs::path& file) {
  static const char* const words[] = {"the",  "plugin", "loads",   "a",     "policy", "scaler",
                                      "runs", "every",  "step",    "and",   "keeps",  "its",
                                      "fp32", "master", "weights", "while", "bf16",   "copies"};
  std::ofstream out(file, std::ios::binary);
  std::uint32_t x = 12345;
  std::size_t bytes = 0;
  while (bytes < 32768) {
    std::string sentence;
    const int n = 4 + static_cast<int>(x % 6);
    for (int i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      sentence += std::string(i == 0 ? "" : " ") + words[(x >> 16) % std::size(words)];
    }
    sentence += ".\n";
    out << sentence;
    bytes += sentence.size();
  }
  if (!out) throw std::runtime_error("cannot write the kit's corpus " + file.string());
}

}  // namespace

std::string_view tiny_model_name(TinyModel model) {
  switch (model) {
    case TinyModel::mlp:
      return "mlp";
    case TinyModel::gpt:
      return "gpt";
    case TinyModel::cnn:
      return "cnn";
  }
  return "?";
}

TinySession tiny_session(TinyModel model, const std::vector<std::string>& sets,
                         const fs::path& scratch) {
  std::string text = kRun;
  switch (model) {
    case TinyModel::mlp:
      text += kMlp;
      break;
    case TinyModel::gpt:
      text += kGpt;
      if (!fs::exists(scratch / "corpus.txt")) write_corpus(scratch / "corpus.txt");
      break;
    case TinyModel::cnn:
      text += kCnn;
      break;
  }
  std::vector<std::string> all = sets;
  if (model == TinyModel::gpt) {
    all.insert(all.begin(), "optimizer.adamw.lr=0.003");
    all.insert(all.begin(), "data.text.path=" + (scratch / "corpus.txt").string());
  }
  const auto config = core::Config::from_string(
      text, (scratch / (std::string(tiny_model_name(model)) + ".toml")).string(), all);
  auto registry = std::make_shared<core::PluginRegistry>(&core::host_log_sink());
  const auto paths = plugin_search_path();
  registry->scan(paths);
  if (registry->find(sdk::ComponentKind::backend, "cpu") == nullptr) {
    std::string searched;
    for (const auto& p : paths) searched += (searched.empty() ? "" : ", ") + p.string();
    throw std::runtime_error(
        "the kit trains its models with mixtrain's own plugins (the CPU backend, AdamW, the "
        "dynamic scaler, the native format), but its plugin search path (" +
        (searched.empty() ? std::string("empty") : searched) +
        ") holds no CPU backend: call mixtrain::conformance::set_plugin_search_path("
        "{MIXTRAIN_PLUGIN_DIR}) before RUN_ALL_TESTS (CMake's find_package(mixtrain) sets "
        "MIXTRAIN_PLUGIN_DIR to the installed plugin folder)");
  }
  TinySession s{core::parse_experiment(config, *registry), {}};
  s.components = core::create_components(s.experiment, *registry);
  return s;
}

std::map<std::int64_t, double> step_losses(const fs::path& run_dir) {
  std::map<std::int64_t, double> losses;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss") || !j.contains("step")) continue;
    losses[j["step"].get<std::int64_t>()] =
        j["loss"].is_null() ? std::nan("") : j["loss"].get<double>();
  }
  return losses;
}

void check_test_name(const std::string& kind, const std::string& name,
                     const std::vector<std::string>& taken) {
  const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
  });
  if (!valid)
    throw std::invalid_argument("add_" + kind + "(\"" + name + "\"): a test name takes letters, " +
                                "digits and '_' only (register \"fp16-mixed\" as fp16_mixed)");
  if (std::find(taken.begin(), taken.end(), name) != taken.end())
    throw std::invalid_argument("add_" + kind + "(\"" + name + "\"): that name is registered " +
                                "already; each " + kind + " under test needs its own");
}

std::string failure_text(const std::exception& e) {
  if (const auto* u = dynamic_cast<const sdk::UserError*>(&e)) return u->full_message();
  return e.what();
}

ScratchFolder::ScratchFolder() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info != nullptr ? std::string(info->test_suite_name()) + "-" + info->name()
                                     : std::string("kit");
  for (char& c : name)
    if (c == '/') c = '-';
  path_ = fs::temp_directory_path() / ("mixtrain-kit-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(path_);
  fs::create_directories(path_);
}

ScratchFolder::~ScratchFolder() {
  std::error_code ec;
  // Empty (a factory that failed before anything was written): nothing to keep.
  if (::testing::Test::HasFailure() && !fs::is_empty(path_, ec)) {
    std::cerr << "kept for the failure: " << path_.string() << '\n';
    return;
  }
  fs::remove_all(path_, ec);
}

}  // namespace mixtrain::conformance::internal
