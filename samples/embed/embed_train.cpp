// embed_train: trains a small MLP through mixtrain's core API, without the `mixtrain` executable.
//
// Usage: embed_train RUN_DIR [--set key=value]...
// Builds the config from a TOML string, scans the installed plugins (plus the default search
// path: MIXTRAIN_PLUGIN_PATH), resolves and validates the experiment, creates the components and
// trains into RUN_DIR (which must not exist yet), then prints the summary. Exit 0 on success,
// 2 on a user error (bad config, plugin, data), 1 on anything else.
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/error.h"

namespace {

// bf16 GEMMs with the classifier head kept in FP32, dynamic loss scaling (harmless for bf16; it
// shows the scaler in the summary), 200 steps on synthetic clusters.
constexpr const char* kConfig = R"toml(
[run]
name = "embedded"
seed = 7
steps = 200
log_every = 50

[backend]
type = "cpu"
threads = 2

[precision]
policy = "bf16-mixed"

[[precision.override]]
layers = "head"
compute = "fp32"

[scaler]
type = "dynamic"

[optimizer]
type = "adamw"
lr = 0.003

[model]
loss = "softmax_cross_entropy"
layers = [
  { type = "linear", name = "fc1", out = 64 },
  { type = "relu" },
  { type = "linear", name = "head", out = 4 },
]

[data]
source = "synthetic"
kind = "clusters"
rows = 2048
features = 16
num_classes = 4
batch_size = 64

[checkpoint]
format = "native"
)toml";

}  // namespace

int main(int argc, char** argv) {
  namespace core = mixtrain::core;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s RUN_DIR [--set key=value]...\n", argv[0]);
    return 2;
  }
  // A program of your own would use its argument parser (CLI11, as mixtrain's CLI does); this one
  // reads `--set key=value` pairs and refuses anything else, so a typo is never silently dropped.
  std::vector<std::string> overrides;
  for (int i = 2; i < argc; i += 2) {
    if (std::string(argv[i]) != "--set" || i + 1 >= argc) {
      std::fprintf(stderr,
                   "error: '%s' is not --set key=value\nusage: %s RUN_DIR [--set key=value]...\n",
                   argv[i], argv[0]);
      return 2;
    }
    overrides.emplace_back(argv[i + 1]);
  }

  try {
    auto config = core::Config::from_string(kConfig, "<embedded>", overrides);

    // Plugins log through the host's sink, like the core itself.
    core::PluginRegistry registry(&core::host_log_sink());
    auto paths = core::PluginRegistry::default_search_path();
    paths.emplace_back(MIXTRAIN_PLUGIN_DIR);
    for (const auto& p : core::config_plugin_paths(config)) paths.push_back(p);
    registry.scan(paths);

    auto experiment = core::parse_experiment(config, registry);
    auto components = core::create_components(experiment, registry);
    core::TrainOptions options;
    options.run_dir = argv[1];
    // Each metrics.jsonl record as it is written: a program's own logging or early exit hooks
    // here instead of reading the file back.
    std::size_t records = 0;
    std::string last_record;
    options.on_record = [&](std::string_view line) {
      ++records;
      last_record = line;
    };
    core::Trainer trainer(experiment, std::move(components), options);
    const auto s = trainer.run();
    std::printf("%zu metrics records seen in-process; the last: %s\n", records,
                last_record.c_str());

    std::printf("trained %lld steps (%lld skipped): final loss %.4f, eval accuracy %.3f, "
                "loss scale %g, %.0f samples/s\nrun folder: %s\n",
                static_cast<long long>(s.steps), static_cast<long long>(s.skipped_steps),
                s.final_loss, s.eval.accuracy, s.final_loss_scale, s.samples_per_s,
                s.run_dir.string().c_str());
    return 0;
  } catch (const mixtrain::sdk::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.full_message().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
}
