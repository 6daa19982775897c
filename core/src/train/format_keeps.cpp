// What checkpoint.format keeps of a training state, asked of the format itself, and so how a run
// goes on from one of its checkpoints (contract in trainer_state.h).
//
// A format that keeps part of the state marks what it reads back with "mixtrain.weights_only"
// (sdk/checkpoint_format.h); nothing says so before a file is written, so the probe writes one.
#include <system_error>

#include "checkpoint/state.h"
#include "train/trainer_state.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

// trainer_state.h
FormatKeeps probe_checkpoint_format(const Trainer::State& s) {
  FormatKeeps keeps;
  if (s.run_dir.empty() || !s.writes) return keeps;
  const auto& format = *s.c.checkpoint_format;
  const fs::path probe = s.run_dir / "checkpoints" / (".format-probe" + format.file_extension());
  sdk::TrainingState st;
  sdk::HostTensor t{"ema/probe", sdk::DType::fp32, {1}, std::vector<std::byte>(sizeof(float))};
  st.tensors.push_back(std::move(t));
  st.metadata["mixtrain.state_version"] = kTrainingStateVersion;
  try {
    format.write(probe, st);
    const sdk::TrainingState back = format.read(probe);
    keeps.ema = back.find("ema/probe") != nullptr;
    keeps.training_state = back.metadata.count("mixtrain.weights_only") == 0 &&
                           back.metadata.count("mixtrain.state_version") == 1;
  } catch (const std::exception&) {  // a format that refuses such a state: no answer
  }
  std::error_code ec;
  fs::remove(probe, ec);
  return keeps;
}

// trainer_state.h
std::optional<std::string> ema_kept_by_format_warning(const Trainer::State& s,
                                                      const FormatKeeps& keeps) {
  if (s.ema.empty() || keeps.ema) return std::nullopt;
  return "checkpoint.format = \"" + s.e.checkpoint.format + "\" does not keep the EMA of the " +
         "weights ([ema]): its checkpoints hold the masters, so eval, predict, sample and export " +
         "of them give the masters' numbers, not the averages " +
         (s.e.eval.weights == EvalWeights::ema ? "this run evaluates" : "it keeps") +
         ". Use checkpoint.format = \"native\" to keep it (export writes either set from it)";
}

// trainer_state.h
std::optional<std::string> weights_only_format_warning(const Trainer::State& s,
                                                       const FormatKeeps& keeps) {
  if (keeps.training_state) return std::nullopt;
  return "checkpoint.format = \"" + s.e.checkpoint.format +
         "\" keeps the weights only (no optimizer, scaler, schedule or data-position state): " +
         "this run's checkpoints cannot be resumed, only started from by a new run " +
         "(checkpoint.init_from). Use checkpoint.format = \"native\" for checkpoints that " +
         "resume (export writes a safetensors file of any of them)";
}

// trainer_state.h
std::string continue_route(const Trainer::State& s, const fs::path& checkpoint,
                           const fs::path& resume_as) {
  if (s.checkpoints_resume) return "--resume " + resume_as.string();
  return "a new run from the weights of " + checkpoint.string() + ", since checkpoint.format = \"" +
         s.e.checkpoint.format + "\" keeps nothing else: mixtrain train " +
         (s.run_dir / "config.toml").string() +
         " --set checkpoint.init_from=" + checkpoint.string();
}

}  // namespace mixtrain::core
