#include "mixtrain/core/runs/folder.h"

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

namespace {

bool holds_run(const fs::path& d) {
  return fs::exists(d / "metrics.jsonl") || fs::exists(d / "summary.json");
}

fs::path claim_run_dir(const fs::path& requested, bool explicit_dir) {
  if (!holds_run(requested)) return requested;
  if (explicit_dir)
    throw sdk::UserError("run folder " + requested.string() + " already holds a run",
                         "choose a new --run-dir, or continue that run with --resume " +
                             (requested / "checkpoints").string());
  for (int i = 2;; ++i) {
    fs::path candidate = requested.string() + "-" + std::to_string(i);
    if (!holds_run(candidate)) return candidate;
  }
}

bool after_step(const std::string& record, std::int64_t step) {
  const auto j = nlohmann::json::parse(record, nullptr, false);
  if (!j.is_object() || !j.contains("step")) return false;
  const auto& s = j["step"];
  if (s.is_number_unsigned()) return s.get<std::uint64_t>() > static_cast<std::uint64_t>(step);
  return s.is_number_integer() && s.get<std::int64_t>() > step;
}

// metrics.csv (runs/csv_sink.h) as metrics.jsonl: rows whose step, the first field, is above
// `step` move to metrics.<suffix>.csv under the same header. TensorBoard's files stay: the resumed
// run's event file tells readers to drop those steps.
void abandon_csv_after_step(const fs::path& dir, std::int64_t step, const std::string& suffix) {
  const fs::path file = dir / "metrics.csv";
  if (!fs::exists(file)) return;
  std::ifstream in(file);
  std::string header, keep, discarded, line;
  if (!std::getline(in, header)) return;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto first = line.substr(0, line.find(','));
    const bool digits =
        !first.empty() && first.find_first_not_of("0123456789") == std::string::npos;
    const bool after = digits && (first.size() > 19 || std::stoll(first) > step);
    (after ? discarded : keep) += line + '\n';
  }
  in.close();
  if (discarded.empty()) return;
  const fs::path side = dir / ("metrics." + suffix + ".csv");
  const bool side_fresh = !fs::exists(side);
  std::ofstream out(side, std::ios::app);
  out << (side_fresh ? header + '\n' : std::string()) << discarded;
  if (!out)
    throw sdk::UserError("cannot write " + side.string(),
                         "check the run folder's free space and permissions");
  write_run_file(file, header + '\n' + keep, "metrics table");
}

// Returns what it moved, as one sentence, or "" when the folder held nothing after `step`.
std::string abandon_after_step(const fs::path& dir, std::int64_t step,
                               const std::string& extension) {
  const std::string suffix = "discarded-after-step-" + std::to_string(step);
  abandon_csv_after_step(dir, step, suffix);
  std::ifstream in(dir / "metrics.jsonl");
  std::string keep, discarded, line;
  std::int64_t records = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const bool after = after_step(line, step);
    (after ? discarded : keep) += line + '\n';
    records += after ? 1 : 0;
  }
  in.close();
  if (!discarded.empty()) {
    std::ofstream side(dir / ("metrics." + suffix + ".jsonl"), std::ios::app);
    side << discarded;
    if (!side)
      throw sdk::UserError("cannot write " + (dir / ("metrics." + suffix + ".jsonl")).string(),
                           "check the run folder's free space and permissions");
  }
  // Atomically: a failure here must not cost the records before the step.
  write_run_file(dir / "metrics.jsonl", keep, "metrics");

  const fs::path aside = dir / ("checkpoints." + suffix);
  std::int64_t checkpoints = 0;
  for (const auto& file : step_checkpoints(dir / "checkpoints", extension)) {
    if (checkpoint_step(file, extension).value_or(0) <= step) continue;
    std::error_code ec;
    fs::create_directories(aside, ec);
    fs::rename(file, aside / file.filename(), ec);
    if (ec)
      throw sdk::UserError("cannot move " + file.string() + " aside: " + ec.message(),
                           "it belongs to the abandoned continuation after step " +
                               std::to_string(step) + "; move or delete it, then resume");
    ++checkpoints;
  }
  if (records == 0 && checkpoints == 0) return {};
  auto count = [](std::int64_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  return count(checkpoints, "checkpoint") + " and " + count(records, "metrics record") +
         " from after step " + std::to_string(step) + " moved aside to " + aside.string() +
         "/ and " + (dir / ("metrics." + suffix)).string() +
         ".* (resuming an earlier checkpoint abandons its later continuation; nothing is deleted)";
}

}  // namespace

void write_run_file(const fs::path& file, const std::string& text, const std::string& what) {
  sdk::AtomicFileWriter out(file, /*durable=*/false, what);
  out.write(text.data(), text.size());
  out.commit();
}

std::optional<fs::path> continued_run_folder(const fs::path& run_dir,
                                             const fs::path& resumed_from) {
  if (resumed_from.empty()) return std::nullopt;
  const fs::path resumed_run = resumed_from.parent_path().parent_path();
  const fs::path requested = run_dir.empty() ? resumed_run : run_dir;
  // exists() first: equivalent() needs both paths to exist.
  if (!fs::exists(requested / "metrics.jsonl") || !fs::equivalent(requested, resumed_run))
    return std::nullopt;
  return requested;
}

PreparedRunFolder prepare_run_folder(const RunFolderRequest& r,
                                     const std::string& resolved_config) {
  const auto continued = continued_run_folder(r.run_dir, r.resumed_from);
  fs::path requested = r.run_dir;
  bool explicit_dir = !requested.empty();
  if (requested.empty() && !r.resumed_from.empty()) {
    requested = r.resumed_from.parent_path().parent_path();  // the resumed run's folder
    explicit_dir = true;
  }
  if (requested.empty())
    requested = r.config_dir.empty() ? fs::path("runs") / r.run_name : fs::path(r.config_dir);
  const fs::path dir = continued ? *continued : claim_run_dir(requested, explicit_dir);
  std::error_code ec;
  fs::create_directories(dir / "checkpoints", ec);
  if (ec)
    throw sdk::UserError("cannot create run folder " + dir.string() + ": " + ec.message(),
                         "choose a writable --run-dir");
  write_run_file(dir / "config.toml", resolved_config, "resolved config");
  PreparedRunFolder prepared{dir, {}};
  if (continued)
    prepared.moved_aside = abandon_after_step(dir, r.resumed_step, r.checkpoint_extension);
  return prepared;
}

}  // namespace mixtrain::core
