// What the commands that run a config's model without training it share (check, eval, sample,
// predict, export --initial): the config read with its --set lines, the plugins it names, its
// components and a Trainer that writes nothing (it loads the data, so image normalisation
// computed from the training split is the run's, and plans and allocates the model).
//
// Contract
// - Members are destroyed in reverse order: the Trainer and the components go before the
//   registry, which keeps the plugin libraries they come from loaded.
// - `weights` says where the model's weights come from. from_checkpoint: `checkpoint`'s (below);
//   the config's checkpoint.init_from is not opened (a missing or foreign init file must not stop
//   `eval` of a finished run; `experiment` has it cleared too). as_training_starts: the weights
//   step 0 of `train` starts from: the seeded initialisation, then init_from when the config names
//   one.
// - `checkpoint` (from_checkpoint): the file or run folder the Trainer loads as it opens
//   (TrainOptions::weights, so no weight it replaces is drawn first), in its `layout`; its
//   `check_model` runs on the built model before (sample: whether it can decode at all).
// - `rehearses` (check): the Trainer's optimizer is bound as training binds it, for a rehearsed
//   step; otherwise it holds no state (TrainOptions::trains = false).
// - `splits` (TrainOptions::splits) says what of the config's data the session reads: both
//   (check), held_out (eval: a token source with held-out files of its own opens only those), or
//   none (predict's --input, sample's prompt, export --initial: a token source is not opened). A
//   run folder so evaluates, samples and predicts on a machine without its training token files.
//   Image and table sources load their files, except that with a `checkpoint` whose
//   `records_shape` is set (predict's and eval's) and that records the data's shape, the model is
//   built from that record (TrainOptions::shape_from): with splits none no data file is opened,
//   and with held_out a cifar10 source opens only its held-out files.
// - Errors are those of Config, parse_experiment, create_components and the Trainer
//   (sdk::UserError subclasses for bad input).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "commands.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/trainer.h"

namespace mixtrain::cli {

enum class SessionWeights { from_checkpoint, as_training_starts };

struct SessionCheckpoint {
  std::string path;               // --checkpoint: a file or a run's folder; empty: none
  std::string layout = "native";  // --layout: native or gpt2
  bool records_shape = false;     // a table or image model's input shape may come from its record
  std::function<void(core::Model&)> check_model;  // TrainOptions::check_model
};

struct ModelSession {
  std::unique_ptr<core::PluginRegistry> registry;
  core::Experiment experiment;
  std::shared_ptr<sdk::PrecisionPolicy> policy;
  std::shared_ptr<sdk::CheckpointFormat> checkpoint_format;
  std::unique_ptr<core::Trainer> trainer;
  // The `checkpoint` given to open_model_session(), resolved once (a run's folder names its newest
  // checkpoint at that moment) in the config's format (checkpoint/path.h); empty when none was
  // given.
  std::filesystem::path checkpoint;
};

// The config (the embedded quickstart when cfg.config is empty) opened as described above.
ModelSession open_model_session(const ConfigArgs& cfg, SessionWeights weights,
                                bool rehearses = false,
                                core::DataSplits splits = core::DataSplits::both,
                                const SessionCheckpoint& checkpoint = {});

// The config with its --set lines: the file, or the embedded quickstart when none is given.
core::Config load_config(const ConfigArgs& cfg);

}  // namespace mixtrain::cli
