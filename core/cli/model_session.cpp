#include "model_session.h"

#include "cli_registry.h"
#include "embedded_quickstart.h"
#include "mixtrain/core/checkpoint/path.h"

namespace mixtrain::cli {

core::Config load_config(const ConfigArgs& cfg) {
  if (cfg.config.empty())
    return core::Config::from_string(kEmbeddedQuickstartToml, "<embedded configs/quickstart.toml>",
                                     cfg.sets, cfg.merges);
  return core::Config::from_file(cfg.config, cfg.sets, cfg.merges);
}

ModelSession open_model_session(const ConfigArgs& cfg, SessionWeights weights, bool rehearses,
                                core::DataSplits splits, const SessionCheckpoint& checkpoint) {
  ModelSession s;
  auto config = load_config(cfg);
  s.registry = make_registry(&config);
  // Only check rehearses a training step: the others never use [scaler] or [optimizer], so the
  // tables there of a plugin they do not load (the run's own) are a warning.
  s.experiment = core::parse_experiment(
      config, *s.registry,
      rehearses ? core::ExperimentUse::training : core::ExperimentUse::model_only);
  auto components = core::create_components(s.experiment, *s.registry);
  s.policy = components.policy;
  s.checkpoint_format = components.checkpoint_format;
  if (weights == SessionWeights::from_checkpoint) {
    s.experiment.checkpoint.init_from.clear();
    s.experiment.from_peft = {};
    // The learning-rate schedule's warnings are training's matter: eval, predict and sample never
    // step it.
    std::erase_if(s.experiment.config_warnings,
                  [](const std::string& w) { return w.starts_with("optimizer."); });
  }
  // No session trains: the order of training batches (and the rows an unshuffled order never
  // reaches) is training's matter.
  s.experiment.data.shuffle = true;
  core::TrainOptions opt;
  opt.write_outputs = false;
  // Only check rehearses a training step; the others never step the optimizer.
  opt.trains = rehearses;
  opt.splits = splits;
  if (!checkpoint.path.empty())
    s.checkpoint = core::resolve_checkpoint_path(
        checkpoint.path, s.checkpoint_format->file_extension(), "--checkpoint");
  if (splits != core::DataSplits::both && !checkpoint.path.empty() && checkpoint.records_shape &&
      !core::is_token_source(s.experiment.data.source))
    opt.shape_from = s.checkpoint;
  if (weights == SessionWeights::from_checkpoint && !checkpoint.path.empty()) {
    opt.weights = s.checkpoint;
    opt.weights_layout = core::parse_weight_layout(checkpoint.layout);
  }
  opt.check_model = checkpoint.check_model;
  s.trainer = std::make_unique<core::Trainer>(s.experiment, std::move(components), opt);
  return s;
}

}  // namespace mixtrain::cli
