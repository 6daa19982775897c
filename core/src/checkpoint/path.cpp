#include "mixtrain/core/checkpoint/path.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

std::optional<std::int64_t> checkpoint_step(const fs::path& file, const std::string& extension) {
  const std::string name = file.filename().string();
  constexpr std::string_view kPrefix = "step-";
  if (name.size() <= kPrefix.size() + extension.size() || name.rfind(kPrefix, 0) != 0 ||
      name.compare(name.size() - extension.size(), extension.size(), extension) != 0)
    return std::nullopt;
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size() - extension.size();
  if (*first < '0' || *first > '9') return std::nullopt;  // from_chars would accept a '-'
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end != last) return std::nullopt;
  return step;
}

std::vector<fs::path> step_checkpoints(const fs::path& folder, const std::string& extension) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(folder, ec)) {
    std::error_code type_ec;
    if (!f.is_regular_file(type_ec)) continue;
    if (auto step = checkpoint_step(f.path(), extension)) found.emplace_back(*step, f.path());
  }
  // Equal steps ("step-7" and "step-0007") fall back to the name, so the order is total.
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  out.reserve(found.size());
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

namespace {

// Why a run folder holds no checkpoint, read from what the run left: the last step its
// metrics.jsonl logged, and whether it wrote summary.json (a run that ends, even by one Ctrl-C,
// writes a final checkpoint and its summary). Empty when `run` holds no run.
std::string why_no_checkpoint(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  if (!in) return {};
  std::int64_t last = -1;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer())
      last = std::max(last, j["step"].get<std::int64_t>());
  }
  std::error_code ec;
  const std::string logged =
      last < 0 ? "the run in " + run.string() + " logged no step"
               : "the run in " + run.string() + " logged up to step " + std::to_string(last);
  if (fs::exists(run / "summary.json", ec))
    return ": " + logged + " and finished, but its checkpoints were removed";
  return ": " + logged +
         " and ended without finishing, before its first checkpoint (checkpoint.every): it was "
         "killed (a second Ctrl-C ends a run at once, without the checkpoint a single one writes) "
         "or failed";
}

// `file` as the command takes it: after its option ("--checkpoint FILE"), or as it is.
std::string pass_file(const std::string& pass, const fs::path& file) {
  return (pass.empty() ? "" : pass + " ") + file.string();
}

// A checkpoint the folder does hold, of another kind than `extension`'s step-N files: the newest
// step checkpoint of another format (the run's checkpoint.format differs from this config's), or
// a best.* (checkpoint.keep_best without step checkpoints). The error to give for it (message,
// hint), or nullopt.
std::optional<std::pair<std::string, std::string>> other_checkpoints(const fs::path& folder,
                                                                     const std::string& extension,
                                                                     const std::string& pass) {
  std::error_code ec;
  std::optional<fs::path> newest, best;
  std::int64_t newest_step = -1;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const fs::path& p = entry.path();
    const std::string name = p.filename().string();
    if (name.rfind("best.", 0) == 0 && p.extension() == extension) best = p;
    if (name.rfind("step-", 0) != 0 || p.extension() == extension || p.extension().empty())
      continue;
    const auto step = checkpoint_step(p, p.extension().string());
    if (step && *step > newest_step) newest_step = *step, newest = p;
  }
  if (newest) {
    return std::pair{"no checkpoint (step-*" + extension + ") in " + folder.string() + ", but " +
                         newest->filename().string() +
                         ": the run wrote another checkpoint format than this config's",
                     pass == "--resume"
                         ? "a run cannot change its checkpoint format on resume: resume with the "
                           "run's config.toml (it names the run's checkpoint.format)"
                         : "use the run's config.toml (it names the run's checkpoint.format), or "
                           "pass the file itself: " +
                               pass_file(pass, *newest)};
  }
  if (best)
    return std::pair{"no step checkpoint (step-*" + extension + ") in " + folder.string() +
                         ", only its best one (checkpoint.keep_best)",
                     "pass it: " + pass_file(pass, *best)};
  return std::nullopt;
}

}  // namespace

fs::path resolve_checkpoint_path(const fs::path& path, const std::string& extension,
                                 const std::string& pass) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path folder =
        fs::is_directory(path / "checkpoints", ec) ? path / "checkpoints" : path;
    const auto all = step_checkpoints(folder, extension);
    // A Hugging Face model folder holds no step-N checkpoint, but weights mixtrain reads.
    if (all.empty() && fs::is_regular_file(path / kHfConfigFile, ec) &&
        fs::is_regular_file(path / kHfWeightsFile, ec))
      throw sdk::CheckpointError(
          path.string() + " is a Hugging Face model folder, not a mixtrain run",
          pass == "--resume"
              ? "a resume continues a mixtrain run; start a new run from these weights: --set "
                "checkpoint.init_from=" +
                    (path / kHfWeightsFile).string() +
                    " --set checkpoint.init_layout=gpt2, without --resume"
              : "pass its weights with their layout: " + pass_file(pass, path / kHfWeightsFile) +
                    " --layout gpt2");
    if (all.empty() && fs::is_regular_file(path / kPeftConfigFile, ec))
      throw sdk::CheckpointError(path.string() + " is a PEFT adapter folder (" +
                                     std::string(kPeftConfigFile) + "), not a mixtrain run",
                                 peft_adapter_route(path.string()));
    if (all.empty()) {
      if (const auto other = other_checkpoints(folder, extension, pass))
        throw sdk::CheckpointError(other->first, other->second);
      const std::string why = why_no_checkpoint(run_folder_of(folder));
      throw sdk::CheckpointError(
          "no checkpoint (step-*" + extension + ") in " + folder.string() + why,
          why.empty() ? "pass a checkpoint file, a run folder or its checkpoints/ folder"
                      : "train it again from its config.toml (mixtrain train " +
                            (run_folder_of(folder) / "config.toml").string() +
                            "); a single Ctrl-C stops a run with a checkpoint to resume");
    }
    return all.back();
  }
  if (!fs::exists(path, ec))
    throw sdk::CheckpointError("checkpoint " + path.string() + " does not exist",
                               "check the path; runs keep theirs in <run-dir>/checkpoints/");
  return path;
}

fs::path run_folder_of(const fs::path& path) {
  std::error_code ec;
  fs::path folder = fs::is_directory(path, ec) ? path : path.parent_path();
  if (folder.filename() == "checkpoints") folder = folder.parent_path();
  return folder.empty() ? fs::path(".") : folder;
}

}  // namespace mixtrain::core
