#include "mixtrain/core/runs/folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/resolved_values.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "runs/tensorboard_writer.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".mixtrain.lock";
// The first line resolved_toml() writes: a config.toml without it is not a run's but somebody's.
constexpr std::string_view kResolvedConfigHeader = "# mixtrain resolved config";

// Any trace of a run: its metrics, its summary, or a file in its checkpoints/ (a folder whose
// metrics were deleted, or where checkpoints were copied, still holds one: keep-pruning would
// count those files). error_code forms: a path the OS refuses (a name too long) is not a run, and
// creating the folder then says why.
bool holds_run(const fs::path& d) {
  std::error_code ec;
  if (fs::exists(d / "metrics.jsonl", ec) || fs::exists(d / "summary.json", ec)) return true;
  for (fs::directory_iterator it(d / "checkpoints", ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) return true;
  return false;
}

// The run a checkpoint belongs to: …/<run>/checkpoints/step-N.<ext> → …/<run>. A checkpoint kept
// anywhere else belongs to no run folder, and its grandparent is nobody's to write into.
std::optional<fs::path> run_of_checkpoint(const fs::path& checkpoint) {
  const fs::path parent = checkpoint.parent_path();
  if (parent.filename() != "checkpoints") return std::nullopt;
  // "checkpoints/step-N.mxt" given from inside the run folder: the run is here.
  return parent.has_parent_path() ? parent.parent_path() : fs::path(".");
}

// A config.toml that no run wrote (its first line is not resolved_toml()'s header): the user's.
bool holds_foreign_config(const fs::path& dir) {
  std::ifstream existing(dir / "config.toml");
  if (!existing) return false;
  std::string first;
  std::getline(existing, first);
  return !first.starts_with(kResolvedConfigHeader);
}

void refuse_foreign_config(const fs::path& dir) {
  throw sdk::UserError("run folder " + dir.string() +
                           " holds a config.toml that no run wrote (its first line is not \"" +
                           std::string(kResolvedConfigHeader) +
                           "\"), which the run's resolved config would replace",
                       "choose another --run-dir, or move that config.toml out of the folder");
}

std::string lock_holder(const fs::path& dir) {
  std::ifstream in(dir / kLockFile);
  std::string pid;
  std::getline(in, pid);
  return pid.empty() ? "another process" : "process " + pid;
}

// Creates `dir` and takes its lock, or returns nullopt when another live process holds it.
std::optional<RunFolderLock> try_lock(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw sdk::UserError("cannot create run folder " + dir.string() + ": " + ec.message(),
                         "choose a writable --run-dir");
  return RunFolderLock::try_take(dir / kLockFile);
}

void refuse_in_use(const fs::path& dir) {
  throw sdk::UserError("run folder " + dir.string() + " is in use by " + lock_holder(dir) +
                           ", a mixtrain run still writing there",
                       "wait for that run to end (or stop it), or choose another --run-dir");
}

// The folder and its lock. A folder with a user's config.toml, one another run holds, or one that
// holds a finished run is refused when the user named it (explicit_dir), in that order, and
// skipped otherwise, for the next "-2", "-3", … suffix. The user's config is looked for before
// anything is created in the folder; the lock is taken before the look for a run, so two runs
// started at once never share one, and a live run's folder is "in use", not "finished".
std::pair<fs::path, RunFolderLock> claim_run_dir(const fs::path& requested, bool explicit_dir) {
  if (explicit_dir) {
    if (holds_foreign_config(requested)) refuse_foreign_config(requested);
    auto lock = try_lock(requested);
    if (!lock) refuse_in_use(requested);
    if (holds_run(requested)) {
      // A run stopped before its first checkpoint left nothing to resume: say so, rather than
      // offer a --resume that fails.
      bool resumable = false;
      std::error_code ec;
      for (fs::directory_iterator it(requested / "checkpoints", ec), end; !ec && it != end;
           it.increment(ec))
        resumable = resumable || it->is_regular_file(ec);
      throw sdk::UserError(
          "run folder " + requested.string() + " already holds a run",
          resumable ? "choose a new run folder (train --run-dir), or continue that run with "
                      "--resume " +
                          (requested / "checkpoints").string()
                    : "choose a new run folder (train --run-dir); that run wrote no checkpoint "
                      "to resume from, so to train it again remove " +
                          requested.string() + " first");
    }
    return {requested, std::move(*lock)};
  }
  for (int i = 1;; ++i) {
    const fs::path candidate =
        i == 1 ? requested : fs::path(requested.string() + "-" + std::to_string(i));
    if (holds_run(candidate) || holds_foreign_config(candidate)) continue;
    auto lock = try_lock(candidate);
    if (lock && !holds_run(candidate)) return {candidate, std::move(*lock)};
  }
}

// "discarded-after-step-N", or with ".2", ".3", … when an earlier continuation from the same step
// already left its files: each abandoned continuation keeps its own, never overwritten.
std::string discard_suffix(const fs::path& dir, std::int64_t step) {
  const std::string base = "discarded-after-step-" + std::to_string(step);
  for (int i = 1;; ++i) {
    const std::string suffix = i == 1 ? base : base + "." + std::to_string(i);
    if (!fs::exists(dir / ("checkpoints." + suffix)) &&
        !fs::exists(dir / ("metrics." + suffix + ".jsonl")) &&
        !fs::exists(dir / ("metrics." + suffix + ".csv")) &&
        !fs::exists(dir / ("summary." + suffix + ".json")) &&
        !fs::exists(dir / ("config." + suffix + ".toml")) &&
        !fs::exists(dir / ("tensorboard." + suffix)))
      return suffix;
  }
}

// Where a metrics line stands against `step`: the step of a metrics.jsonl record, or the first
// field of a metrics.csv row (runs/csv_sink.h); none for a line that records no whole step (a
// header, a malformed or torn line). A step past int64 is after every step.
enum class LineStep { none, at_or_before, after };

LineStep line_step(const std::string& line, std::int64_t step, bool csv) {
  if (csv) {
    const std::string_view field = std::string_view(line).substr(0, line.find(','));
    if (field.empty() || field.find_first_not_of("0123456789") != std::string_view::npos)
      return LineStep::none;
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
    if (ec == std::errc::result_out_of_range) return LineStep::after;
    return value > step ? LineStep::after : LineStep::at_or_before;
  }
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("step")) return LineStep::none;
  const auto& s = j["step"];
  if (s.is_number_unsigned())
    return s.get<std::uint64_t>() > static_cast<std::uint64_t>(step) ? LineStep::after
                                                                     : LineStep::at_or_before;
  if (!s.is_number_integer()) return LineStep::none;
  return s.get<std::int64_t>() > step ? LineStep::after : LineStep::at_or_before;
}

// A metrics file split at a resumed step: the lines kept, the lines of the abandoned
// continuation, and the bytes after the last newline (a record torn by a crash or a full disk,
// which no reader parses; it goes aside with the discarded lines, so nothing is deleted).
struct MetricsSplit {
  std::string header;  // metrics.csv's first line, with its newline
  std::string keep, discarded, torn;
  std::int64_t discarded_records = 0;
  bool exists = false;
  bool changes() const { return !discarded.empty() || !torn.empty(); }
};

MetricsSplit split_metrics(const fs::path& file, std::int64_t step, bool csv) {
  MetricsSplit out;
  std::ifstream in(file, std::ios::binary);
  if (!in) return out;
  out.exists = true;
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::size_t from = 0;
  bool first = true;
  while (from < text.size()) {
    const auto nl = text.find('\n', from);
    if (nl == std::string::npos) {
      out.torn = text.substr(from);
      break;
    }
    const std::string line = text.substr(from, nl - from);
    from = nl + 1;
    if (csv && first) {
      out.header = line + '\n';
      first = false;
      continue;
    }
    first = false;
    if (line.empty()) continue;
    const bool after = line_step(line, step, csv) == LineStep::after;
    (after ? out.discarded : out.keep) += line + '\n';
    out.discarded_records += after ? 1 : 0;
  }
  if (!out.torn.empty()) out.discarded += out.torn + '\n';
  return out;
}

// Whether a metrics file holds nothing to split at `step`: it ends with a newline and its last
// record is of a step at or before it (records are appended in step order; a resume in place
// cuts the file back first). Read from the file's tail alone, so resuming a long run does not
// read a large file whole when nothing follows the step. false: split it (split_metrics).
bool nothing_after(const fs::path& file, std::int64_t step, bool csv) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) return true;  // no file
  const std::streamoff size = in.tellg();
  if (size <= 0) return true;
  const std::streamoff tail = std::min<std::streamoff>(size, 1 << 16);
  in.seekg(size - tail);
  std::string text(static_cast<std::size_t>(tail), '\0');
  if (!in.read(text.data(), tail) || text.back() != '\n') return false;  // torn, or unreadable
  const auto before = text.size() >= 2 ? text.rfind('\n', text.size() - 2) : std::string::npos;
  if (before == std::string::npos && tail < size) return false;  // a line longer than the tail
  const std::size_t from = before == std::string::npos ? 0 : before + 1;
  if (csv && before == std::string::npos) return true;  // the header alone
  // Only a line with a whole step at or before it ends the question; anything else takes the
  // split.
  return line_step(text.substr(from, text.size() - 1 - from), step, csv) == LineStep::at_or_before;
}

// Moves metrics.jsonl's and metrics.csv's records after `step` to metrics.<suffix>.*. The side
// files are written first, each whole (atomically), and only then are the originals cut: a
// failure anywhere (a full disk) leaves every record in one file or the other, and a failed
// attempt leaves no side file behind, so a retry uses the same suffix. Returns the JSONL records
// moved; `torn` says whether a torn last record went aside too.
std::int64_t abandon_metrics_after_step(const fs::path& dir, std::int64_t step,
                                        const std::string& suffix, bool& torn) {
  const fs::path csv_file = dir / "metrics.csv", jsonl_file = dir / "metrics.jsonl";
  torn = false;
  if (nothing_after(csv_file, step, /*csv=*/true) && nothing_after(jsonl_file, step, false))
    return 0;
  const MetricsSplit csv = split_metrics(csv_file, step, /*csv=*/true);
  const MetricsSplit jsonl = split_metrics(jsonl_file, step, /*csv=*/false);
  torn = !csv.torn.empty() || !jsonl.torn.empty();
  std::vector<fs::path> written;
  try {
    if (!csv.discarded.empty()) {
      const fs::path side = dir / ("metrics." + suffix + ".csv");
      write_run_file(side, csv.header + csv.discarded, "discarded metrics table");
      written.push_back(side);
    }
    if (!jsonl.discarded.empty()) {
      const fs::path side = dir / ("metrics." + suffix + ".jsonl");
      write_run_file(side, jsonl.discarded, "discarded metrics");
      written.push_back(side);
    }
  } catch (...) {
    std::error_code ec;
    for (const auto& f : written) fs::remove(f, ec);
    throw;
  }
  if (csv.exists && csv.changes()) write_run_file(csv_file, csv.header + csv.keep, "metrics table");
  if (jsonl.exists && jsonl.changes()) write_run_file(jsonl_file, jsonl.keep, "metrics");
  return jsonl.discarded_records;
}

// Whether two resolved configs hold other values: the comments (the header names the file each
// came from) are none.
bool other_values(const std::string& a, const std::string& b) {
  const auto values = [](const std::string& text) {
    std::vector<std::string> out;
    for (const auto& v : resolved_values(text)) out.push_back(v.text);
    return out;
  };
  return values(a) != values(b);
}

// Returns what it moved, as one sentence, or "" when the folder held nothing after `step`.
// `old_config`: the config.toml the abandoned continuation trained with (empty: none), kept
// beside its records when the resumed run's holds other values.
std::string abandon_after_step(const fs::path& dir, std::int64_t step, const std::string& extension,
                               const std::string& old_config, const std::string& new_config) {
  const std::string suffix = discard_suffix(dir, step);
  bool torn = false;
  const std::int64_t records = abandon_metrics_after_step(dir, step, suffix, torn);

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
  // TensorBoard's event files, so that no reader shows the abandoned steps
  // (runs/tensorboard_writer.h says why the resumed file's session start is not enough).
  const fs::path events_aside = dir / ("tensorboard." + suffix);
  const std::int64_t events = drop_events_after_step(dir, step, events_aside);
  if (records == 0 && !torn && checkpoints == 0 && events == 0) return {};
  // The summary of the abandoned continuation describes steps this folder no longer holds;
  // `compare` would read it in preference to metrics.jsonl until the resumed run writes its own.
  // Its profile (train --profile) too, unless it names kept steps alone.
  // Returns where `name`.json went, or nullopt when there was none.
  const auto move_aside = [&](const std::string& name) -> std::optional<fs::path> {
    const fs::path file = dir / (name + ".json"), aside = dir / (name + "." + suffix + ".json");
    if (!fs::exists(file)) return std::nullopt;
    std::error_code ec;
    fs::rename(file, aside, ec);
    if (ec)
      throw sdk::UserError("cannot move " + file.string() + " aside: " + ec.message(),
                           "it describes the abandoned continuation after step " +
                               std::to_string(step) + "; move or delete it, then resume");
    return aside;
  };
  const auto summary_aside = move_aside("summary");
  // The resumed run's config.toml replaces it: the settings that trained the abandoned steps
  // (what a resume with other settings warns of) would be in no file.
  std::optional<fs::path> config_aside;
  if (!old_config.empty() && other_values(old_config, new_config)) {
    config_aside = dir / ("config." + suffix + ".toml");
    write_run_file(*config_aside, old_config, "discarded continuation's config");
  }
  const auto profiled = profile_steps(dir / "profile.json");
  const auto profile_aside =
      profiled && profiled->last <= step ? std::nullopt : move_aside("profile");
  auto count = [](std::int64_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  std::vector<std::string> moved;
  if (checkpoints > 0)
    moved.push_back(count(checkpoints, "checkpoint") + " to " + aside.string() + "/");
  if (records > 0)
    moved.push_back(count(records, "metrics record") + " to " +
                    (dir / ("metrics." + suffix)).string() + ".*");
  if (torn)
    moved.push_back("a torn last metrics record (a crash's or a full disk's) to " +
                    (dir / ("metrics." + suffix)).string() + ".*");
  if (events > 0)
    moved.push_back(count(events, "TensorBoard event") + " to " + events_aside.string() + "/");
  if (summary_aside) moved.push_back("summary.json to " + summary_aside->string());
  if (profile_aside) moved.push_back("profile.json to " + profile_aside->string());
  if (config_aside)
    moved.push_back("the config.toml it last trained with to " + config_aside->string());
  std::string list;
  for (std::size_t i = 0; i < moved.size(); ++i) list += (i ? "; " : "") + moved[i];
  return "from after step " + std::to_string(step) + ", moved aside: " + list +
         " (resuming an earlier checkpoint abandons its later continuation; nothing is deleted)";
}

}  // namespace

std::optional<ProfileSteps> profile_steps(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  const auto j = nlohmann::json::parse(in, nullptr, false);
  const auto step = [&](const char* key) -> std::optional<std::int64_t> {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
    return j[key].get<std::int64_t>();
  };
  const auto first = step("first_step"), last = step("last_step");
  if (!first || !last) return std::nullopt;
  return ProfileSteps{*first, *last};
}

void write_run_file(const fs::path& file, const std::string& text, const std::string& what) {
  sdk::AtomicFileWriter out(file, /*durable=*/false, what);
  out.write(text.data(), text.size());
  out.commit();
}

std::optional<RunFolderLock> RunFolderLock::try_take(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  // Another user's lock file (0644): flock needs no write access, only the pid note does.
  if (fd < 0 && errno == EACCES) fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw sdk::UserError("cannot open " + file.string() + ": " + std::strerror(errno),
                         "choose a writable --run-dir");
  auto owned = std::make_unique<sdk::UniqueFd>(fd);
  int locked = ::flock(fd, LOCK_EX | LOCK_NB);
  while (locked != 0 && errno == EINTR) locked = ::flock(fd, LOCK_EX | LOCK_NB);
  if (locked != 0) {
    if (errno == EWOULDBLOCK) return std::nullopt;
    // A file system without flock (some network mounts): run unlocked, as before locks existed.
    return RunFolderLock(std::move(owned));
  }
  // Who holds it, for the message a second run gets; the lock itself is the flock, not the text.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // Only the message's pid is lost.
  }
  return RunFolderLock(std::move(owned));
}

std::optional<fs::path> continued_run_folder(const fs::path& run_dir,
                                             const fs::path& resumed_from) {
  if (resumed_from.empty()) return std::nullopt;
  const auto resumed_run = run_of_checkpoint(resumed_from);
  if (!resumed_run) return std::nullopt;
  const fs::path requested = run_dir.empty() ? *resumed_run : run_dir;
  // holds_run() first: equivalent() needs both paths to exist.
  std::error_code ec;
  if (!holds_run(requested) || !fs::equivalent(requested, *resumed_run, ec)) return std::nullopt;
  return requested;
}

// folder.h
bool holds_training_run(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  if (holds_run(dir)) return true;
  std::ifstream config(dir / "config.toml");
  std::string first;
  return config && std::getline(config, first) && first.starts_with(kResolvedConfigHeader);
}

PreparedRunFolder prepare_run_folder(const RunFolderRequest& r,
                                     const std::string& resolved_config) {
  const auto continued = continued_run_folder(r.run_dir, r.resumed_from);
  fs::path requested = r.run_dir;
  bool explicit_dir = !requested.empty();
  if (requested.empty() && !r.resumed_from.empty())
    if (const auto resumed_run = run_of_checkpoint(r.resumed_from)) {
      requested = *resumed_run;
      explicit_dir = true;
    }
  if (requested.empty())
    requested = r.config_dir.empty() ? fs::path("runs") / r.run_name : fs::path(r.config_dir);
  std::optional<RunFolderLock> lock;
  fs::path dir;
  if (continued) {
    dir = *continued;
    // A user's folder that merely holds checkpoints/ (their config.toml beside it) is theirs too.
    if (holds_foreign_config(dir)) refuse_foreign_config(dir);
    lock = try_lock(dir);
    if (!lock) refuse_in_use(dir);
  } else {
    auto [claimed, held] = claim_run_dir(requested, explicit_dir);
    dir = std::move(claimed);
    lock.emplace(std::move(held));
  }
  std::error_code ec;
  fs::create_directories(dir / "checkpoints", ec);
  if (ec)
    throw sdk::UserError("cannot create run folder " + dir.string() + ": " + ec.message(),
                         "choose a writable --run-dir");
  std::string old_config;
  if (continued) {
    std::ifstream in(dir / "config.toml", std::ios::binary);
    old_config.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  write_run_file(dir / "config.toml", resolved_config, "resolved config");
  PreparedRunFolder prepared{dir, {}, std::move(*lock)};
  if (continued)
    prepared.moved_aside = abandon_after_step(dir, r.resumed_step, r.checkpoint_extension,
                                              old_config, resolved_config);
  return prepared;
}

}  // namespace mixtrain::core
