#include "command_inputs.h"

#include <iterator>
#include <optional>
#include <system_error>

#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/core/runs/folder.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::cli {

namespace fs = std::filesystem;

CommandInputs config_inputs(const ConfigArgs& cfg) {
  CommandInputs inputs{{"config", cfg.config}};
  for (const auto& merge : cfg.merges) inputs.push_back({"--merge", merge});
  return inputs;
}

bool is_input(const fs::path& out, const fs::path& input) {
  if (out.empty() || input.empty()) return false;
  std::error_code ec;
  // equivalent() reports an error, not false, when either path is missing: a new file is no input.
  return fs::equivalent(out, input, ec) && !ec;
}

void refuse_input_as_output(const std::string& out_flag, const fs::path& out,
                            const CommandInputs& inputs) {
  for (const auto& in : inputs)
    if (is_input(out, in.path))
      throw sdk::UserError(
          out_flag + " " + out.string() + " is the input " + in.argument + " " + in.path.string() +
              ": writing it would destroy what this command reads",
          "choose another " + out_flag + "; an input is never overwritten, --force or not");
}

namespace {

// The run folder of an input as the user spelled it; "run/checkpoints/" (a trailing separator)
// is the checkpoints/ folder of "run", as "run/checkpoints" is.
fs::path named_run_folder(const fs::path& input) {
  fs::path path = input.lexically_normal();
  if (!path.has_filename() && path.has_parent_path()) path = path.parent_path();
  return core::run_folder_of(path);
}

// The training run an input belongs to, as its canonical folder: one that holds checkpoints/.
std::optional<fs::path> run_folder_holding(const fs::path& input) {
  if (input.empty()) return std::nullopt;
  std::error_code ec;
  const fs::path run = fs::weakly_canonical(named_run_folder(input), ec);
  if (ec) return std::nullopt;
  if (!fs::is_directory(run / "checkpoints", ec)) return std::nullopt;
  return fs::canonical(run, ec);
}

// `out` absolute, with the links of the part of it that exists resolved; empty when the OS
// refuses the path.
fs::path resolved_output(const fs::path& out) {
  std::error_code ec;
  fs::path path = fs::weakly_canonical(fs::absolute(out, ec), ec);
  if (ec) return {};
  // "run/checkpoints/" is the folder "run/checkpoints".
  if (!path.has_filename() && path.has_parent_path()) path = path.parent_path();
  return path;
}

// What of the run folder `run` (canonical) the resolved output `path` is: "config.toml",
// "checkpoints/", ...; empty when it is none of the run's own records.
std::string run_record(const fs::path& path, const fs::path& run) {
  if (path.empty()) return {};
  const fs::path relative = path.lexically_relative(run);
  if (relative.empty() || *relative.begin() == ".." || *relative.begin() == ".") return {};
  const std::string first = relative.begin()->string();
  const bool nested = std::distance(relative.begin(), relative.end()) > 1;
  // The trainer's rotation prunes checkpoints/, and train --resume, eval, predict and export take
  // the newest step-N file in it, whatever wrote it.
  if (first == "checkpoints") return "checkpoints/";
  // What continuing a run moved aside (runs/folder.h): kept so nothing is lost, not overwritten.
  if (first.find("discarded-after-step-") != std::string::npos) return first;
  if (nested) return {};
  for (const char* record : {"config.toml", "summary.json", "profile.json", "metrics.jsonl",
                             "metrics.csv", "normalization.json", ".mixtrain.lock"})
    if (first == record) return first;
  if (first.starts_with("events.out.tfevents.")) return first;
  return {};
}

// The folder `levels` above `out`, as the user spelled `out` ("other/checkpoints/x.mxt", 2:
// "other").
fs::path spelled_folder_above(const fs::path& out, std::size_t levels) {
  fs::path path = out.lexically_normal();
  if (!path.has_filename() && path.has_parent_path()) path = path.parent_path();
  for (std::size_t i = 0; i < levels; ++i) path = path.parent_path();
  return path.empty() ? fs::path(".") : path;
}

[[noreturn]] void refuse_record(const std::string& out_flag, const fs::path& out,
                                const fs::path& named, const std::string& record,
                                const std::string& whose, const std::string& example_name) {
  const std::string what =
      record == "checkpoints/"
          ? "is in the checkpoints/ folder of the run " + named.string() +
                ", which the trainer's rotation prunes and train --resume, eval, predict and "
                "export read their newest checkpoint from"
          : "is the run " + named.string() + "'s own " + record + ", " + whose;
  throw sdk::UserError(out_flag + " " + out.string() + " " + what,
                       "write it elsewhere, e.g. beside the run: " + out_flag + " " +
                           (named / example_name).string() +
                           "; a run's own files are never overwritten, --force or not");
}

}  // namespace

void refuse_run_record_as_output(const std::string& out_flag, const fs::path& out,
                                 const CommandInputs& inputs, const std::string& example_name) {
  const fs::path resolved = resolved_output(out);
  if (resolved.empty()) return;
  for (const auto& in : inputs) {
    const auto run = run_folder_holding(in.path);
    if (!run) continue;
    const std::string record = run_record(resolved, *run);
    if (record.empty()) continue;
    // The run as the user named it: the input's own spelling of the folder.
    refuse_record(
        out_flag, out, named_run_folder(in.path), record,
        "a record of the run that " + in.argument + " " + in.path.string() + " belongs to",
        example_name);
  }
  // Any other run's too: an export named OTHER/checkpoints/step-N.mxt would be the checkpoint
  // `train --resume OTHER` reads, and --force over OTHER/config.toml would replace the config it
  // resumes with. Each folder above the output that holds a run (core::holds_training_run).
  std::size_t levels = 1;
  for (fs::path folder = resolved.parent_path();; folder = folder.parent_path(), ++levels) {
    const std::string record = run_record(resolved, folder);
    if (!record.empty() && core::holds_training_run(folder))
      refuse_record(out_flag, out, spelled_folder_above(out, levels), record,
                    "a record of the training run that folder holds", example_name);
    if (folder == folder.parent_path() || !folder.has_parent_path()) break;
  }
}

}  // namespace mixtrain::cli
