// `mixtrain calibrate CONFIG`: measures every op's tensors over a few FP32 training steps and
// writes the precision block the config's policy should run with (commands.h, run_calibrate).
#include <cstdio>
#include <filesystem>
#include <string>

#include "cli_registry.h"
#include "commands.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/precision/calibration.h"
#include "mixtrain/core/precision/calibration_table.h"
#include "mixtrain/core/precision/recommendation.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "model_session.h"
#include "output_file.h"

namespace mixtrain::cli {

namespace fs = std::filesystem;

namespace {

// In the current folder, as `predict --out` resolves a relative path: the config's folder may be
// read-only (an installed configs/).
fs::path default_calibration_output(const std::string& config) {
  return fs::path(fs::path(config).stem().string() + ".precision.toml");
}

}  // namespace

int run_calibrate(const ConfigArgs& cfg, const CalibrateArgs& args) {
  const fs::path out =
      args.output.empty() ? default_calibration_output(cfg.config) : fs::path(args.output);
  check_output_file(out, config_inputs(cfg), args.force, "--out", "calibration.toml");

  auto config = load_config(cfg);
  auto registry = make_registry(&config);
  const auto experiment = core::parse_experiment(config, *registry);
  core::Calibration calibration =
      core::calibrate(experiment, *registry, core::CalibrationOptions{args.steps, args.blocks});
  // The file sets [scaler] type = "dynamic", so the config's [scaler.dynamic] bounds apply to its
  // init_scale when merged, whatever scaler the config names now.
  for (const auto& o : config.table_options("scaler.dynamic")) {
    const auto* real = std::get_if<double>(&o.value);
    const auto* integer = std::get_if<std::int64_t>(&o.value);
    if (real == nullptr && integer == nullptr) continue;
    const double v = real != nullptr ? *real : static_cast<double>(*integer);
    if (o.key == "min_scale") calibration.min_scale = v;
    if (o.key == "max_scale") calibration.max_scale = v;
  }
  const core::Recommendation recommendation = core::recommend(calibration);
  std::printf("%s\n", core::calibration_table(calibration, recommendation).c_str());

  const std::string& source = cfg.config;
  const std::string text = core::recommendation_toml(
      recommendation, {"mixtrain calibrate: the precision block for " + source + " under policy " +
                           calibration.policy + ", from " + std::to_string(calibration.steps) +
                           " FP32 step" + (calibration.steps == 1 ? "" : "s"),
                       "thresholds: flush <= " + core::format_share(core::kMaxFlushShare) +
                           " of non-zero values, no saturation (block formats per block: 1.5x "
                           "what they lose of normal values), amax growth <= " +
                           std::to_string(static_cast<int>(core::kMaxAmaxGrowth)) +
                           "x per step under FP8 delayed scaling (docs/precision-autopilot.md)",
                       "use it: mixtrain train " + source + " --merge " + out.string()});
  sdk::AtomicFileWriter writer(out, /*durable=*/false, "calibrated precision file");
  writer.write(text.data(), text.size());
  if (const auto warning = writer.commit(); !warning.empty())
    std::fprintf(stderr, "%s\n", warning.c_str());
  std::printf("wrote %s\nmixtrain train %s --merge %s\n", out.string().c_str(), cfg.config.c_str(),
              out.string().c_str());
  // The file holds the precision block (and the scaler's when it recommends one): whatever else
  // the command line changed must be given to `train` again, but a --set of a key the file sets
  // would undo the recommendation (train applies --set after --merge).
  const bool scaler = recommendation.scaler.needed;
  // The keys recommendation_toml() writes; tables merge key by key, so others stay the config's.
  const auto file_sets = [&](const std::string& key) {
    return key == "precision.policy" || key == "precision.override" ||
           key.starts_with("precision.override.") ||
           (scaler && (key == "scaler.type" || key == "scaler.dynamic.init_scale" ||
                       key == "scaler.init_scale"));
  };
  std::string repeat, leave_out;  // command-line arguments, as typed
  int left_out = 0;
  for (const auto& set : cfg.sets) {
    const bool in_file = file_sets(set.substr(0, set.find('=')));
    (in_file ? leave_out : repeat) += " --set '" + set + "'";
    left_out += in_file ? 1 : 0;
  }
  const std::string keys =
      scaler ? "the policy, its overrides and the loss scale" : "the policy and its overrides";
  if (!cfg.merges.empty())
    std::printf("(the file sets %s only: give train the other --merge files, before this one%s)\n",
                keys.c_str(), repeat.empty() ? "" : (", and" + repeat).c_str());
  else if (!repeat.empty())
    std::printf("(the file sets %s only: give train%s too)\n", keys.c_str(), repeat.c_str());
  if (left_out > 0)
    std::printf("(leave out%s: the file sets %s, and train applies --set after --merge)\n",
                leave_out.c_str(), left_out == 1 ? "that key" : "those keys");
  return 0;
}

}  // namespace mixtrain::cli
