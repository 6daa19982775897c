// checkpoint.keep_best: the best checkpoint written after an evaluation that improved the watched
// metric, and found again (or copied, or moved aside) after a resume. The state written is
// capture_state's (checkpoint_save.cpp).
#include <cstdio>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "checkpoint/state.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "train/trainer_state.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path best_file(const Trainer::State& s) {
  return s.run_dir / "checkpoints" / ("best" + s.c.checkpoint_format->file_extension());
}

// The progress.step of a checkpoint file, read whole through the run's format (nullopt, with a
// warning, when it cannot be read); `state` receives what was read.
std::optional<std::int64_t> file_step(Trainer::State& s, const fs::path& file,
                                      sdk::TrainingState* state = nullptr) {
  try {
    auto st = s.c.checkpoint_format->read(file);
    auto it = st.metadata.find("progress");
    if (it == st.metadata.end()) throw sdk::CheckpointError(file.string() + ": no progress");
    const auto step =
        read_progress(json::parse(it->second), std::numeric_limits<std::int64_t>::max(), file).step;
    if (state != nullptr) *state = std::move(st);
    return step;
  } catch (const std::exception& e) {
    s.log.warn(file.string() + " cannot be read as a checkpoint: " + e.what());
    return std::nullopt;
  }
}

}  // namespace

void save_best_checkpoint(Trainer::State& s) {
  const fs::path path = best_file(s);
  if (!s.writes) {  // a data-parallel rank other than 0: its part of the gathers only
    s.reducer->serve_save_reads(*s.c.optimizer);
    return;
  }
  {
    // Before the staging: however the save ends, the other ranks are let out of their gathers.
    const SaveReadsEnd reads_end{*s.reducer};
    const StagedState st = stage_state(s, /*weights_only=*/false, /*for_save=*/true);
    for (const auto& stale : sdk::remove_stale_temp_files(path.parent_path()))
      s.log.info("removed " + stale.string() + ", left by an interrupted checkpoint write");
    write_staged(*s.c.checkpoint_format, path, st);
  }
  s.metrics.best_path = path;
  char line[128];
  std::snprintf(line, sizeof line, "best %s so far: %.6g at step %lld, written to ",
                s.metrics.keep_best->state.metric.c_str(), s.metrics.keep_best->state.best,
                static_cast<long long>(s.position.step));
  s.log.info(line + path.string());
}

void reconcile_best_checkpoint(Trainer::State& s) {
  if (!s.metrics.keep_best || s.position.resumed_from.empty() || s.run_dir.empty()) return;
  const fs::path here = best_file(s);
  std::error_code ec;
  std::optional<std::int64_t> here_step;
  if (fs::exists(here, ec)) {
    here_step = file_step(s, here);
    if (here_step && *here_step > s.position.step) {
      // Written after the resumed step: it belongs to the abandoned continuation, as the step
      // checkpoints after it do (runs/folder.h), and goes aside with them.
      const fs::path aside =
          s.run_dir / ("checkpoints.discarded-after-step-" + std::to_string(s.position.step));
      fs::create_directories(aside, ec);
      fs::rename(here, aside / here.filename(), ec);
      if (ec)
        throw sdk::UserError("cannot move " + here.string() + " aside: " + ec.message(),
                             "it belongs to the abandoned continuation after step " +
                                 std::to_string(s.position.step) +
                                 "; move or delete it, then resume");
      s.log.info("moved " + here.string() + " (step " + std::to_string(*here_step) + ") to " +
                 aside.string() + ": it is from after the resumed step");
      here_step.reset();
    }
  }
  const auto& w = s.metrics.keep_best->state;
  if (!w.has_best) return;
  if (here_step && *here_step == w.best_step) {
    s.metrics.best_path = here;
    return;
  }
  // Resumed into another folder: the best comes along from the resumed run's, so this run's
  // folder holds what its summary names.
  const fs::path there =
      s.position.resumed_from.parent_path() / ("best" + s.c.checkpoint_format->file_extension());
  sdk::TrainingState st;
  if (!fs::equivalent(there, here, ec) && fs::exists(there, ec) &&
      file_step(s, there, &st) == w.best_step) {
    s.c.checkpoint_format->write(here, st);
    s.metrics.best_path = here;
    s.log.info("copied the best checkpoint (step " + std::to_string(w.best_step) + ") from " +
               there.string() + " to " + here.string());
    return;
  }
  // The best is the resumed step itself (its best.mxt went aside with a later continuation, or
  // was never written): the resumed checkpoint holds that state, and checkpoint.keep may prune
  // it, so it becomes the best checkpoint.
  if (w.best_step == s.position.step && file_step(s, s.position.resumed_from, &st) == w.best_step) {
    s.c.checkpoint_format->write(here, st);
    s.metrics.best_path = here;
    s.log.info("the best checkpoint of " + w.metric + " is the resumed step " +
               std::to_string(w.best_step) + ": written from " + s.position.resumed_from.string() +
               " to " + here.string());
    return;
  }
  s.log.warn("the best checkpoint of " + w.metric + " (step " + std::to_string(w.best_step) +
             ") is not in " + here.parent_path().string() + "; the next improvement writes one");
}

}  // namespace mixtrain::core
