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
  const core::Calibration calibration =
      core::calibrate(experiment, *registry, core::CalibrationOptions{args.steps, args.blocks});
  const core::Recommendation recommendation = core::recommend(calibration);
  std::printf("%s\n", core::calibration_table(calibration, recommendation).c_str());

  const std::string& source = cfg.config;
  const std::string text = core::recommendation_toml(
      recommendation, {"mixtrain calibrate: the precision block for " + source + " under policy " +
                           calibration.policy + ", from " + std::to_string(calibration.steps) +
                           " FP32 step" + (calibration.steps == 1 ? "" : "s"),
                       "thresholds: flush <= " + core::format_share(core::kMaxFlushShare) +
                           " of non-zero values, no saturation, amax growth <= " +
                           std::to_string(static_cast<int>(core::kMaxAmaxGrowth)) +
                           "x per step under FP8 delayed scaling (docs/precision-autopilot.md)",
                       "use it: mixtrain train " + source + " --merge " + out.string()});
  sdk::AtomicFileWriter writer(out, /*durable=*/false, "calibrated precision file");
  writer.write(text.data(), text.size());
  if (const auto warning = writer.commit(); !warning.empty())
    std::fprintf(stderr, "%s\n", warning.c_str());
  std::printf("wrote %s\nmixtrain train %s --merge %s\n", out.string().c_str(), cfg.config.c_str(),
              out.string().c_str());
  // The file holds the precision block only: whatever else the command line changed must be
  // given to `train` again.
  if (!cfg.sets.empty() || !cfg.merges.empty())
    std::printf(
        "(the file holds the precision block only: give train the other --merge and --set "
        "arguments used here too, the other --merge files before this one)\n");
  return 0;
}

}  // namespace mixtrain::cli
