#include "runs/tensorboard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <string_view>

#include "mixtrain/sdk/error.h"
#include "runs/tfrecord.h"
#include "tensorboard/event.pb.h"

namespace mixtrain::core {

namespace fs = std::filesystem;

namespace {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

tensorboard::Event event_at(std::int64_t step) {
  tensorboard::Event e;
  e.set_wall_time(wall_time());
  e.set_step(step);
  return e;
}

constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";
constexpr std::string_view kTrimmedPrefix = ".events-trimmed.";

// What an event record is to a resume's trim.
struct EventRecord {
  bool step_event = false;  // parsed, and not the file-version record
  bool session_start = false;
  bool run_text = false;  // what a starting run writes at its first step (run/config, ...)
  std::int64_t step = 0;
};

EventRecord classify(const std::string& data) {
  tensorboard::Event e;
  EventRecord r;
  // An event that does not parse is kept as it is: only a step past the cut is abandoned.
  if (e.ParseFromArray(data.data(), static_cast<int>(data.size())) && !e.has_file_version()) {
    r.step_event = true;
    r.step = e.step();
    r.session_start =
        e.has_session_log() && e.session_log().status() == tensorboard::SessionLog::START;
    r.run_text = e.has_summary() && e.summary().value_size() > 0;
    for (const auto& v : e.summary().value())
      r.run_text = r.run_text && v.tag().starts_with("run/");
  }
  return r;
}

// Whether a resume abandons the event: a step from the file's cut on, or a continuation's run
// texts, which sit at the step it resumed from, one before its first step (the run resuming now
// writes its own there).
bool abandoned(const EventRecord& r, std::int64_t cut) {
  return r.step_event && (r.step >= cut || (r.run_text && r.step >= cut - 1));
}

}  // namespace

std::int64_t drop_events_after_step(const fs::path& dir, std::int64_t step, const fs::path& aside) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind(kEventFilePrefix, 0) == 0 && f.is_regular_file(ec)) files.push_back(f.path());
    // A trimmed copy a killed resume left unrenamed: the original beside it is whole.
    if (name.rfind(kTrimmedPrefix, 0) == 0) fs::remove(f.path(), ec);
  }
  std::sort(files.begin(), files.end());  // TensorBoard's order: a resumed run's file is later
  // Two passes over each file, a record at a time (a long run's event files are hundreds of MB,
  // and a resume from the newest checkpoint, the usual one, changes nothing): what each file
  // holds, then a rewrite of only the files that hold abandoned events.
  struct Scan {
    std::int64_t first_start = std::numeric_limits<std::int64_t>::max();  // session start <= step
    std::int64_t last_step = std::numeric_limits<std::int64_t>::min();    // of its step events
    std::int64_t last_text = std::numeric_limits<std::int64_t>::min();    // of its run texts
  };
  std::vector<Scan> scans(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    TfRecordReader reader(files[i]);
    while (const std::string* data = reader.next()) {
      const EventRecord r = classify(*data);
      if (!r.step_event) continue;
      scans[i].last_step = std::max(scans[i].last_step, r.step);
      if (r.run_text) scans[i].last_text = std::max(scans[i].last_text, r.step);
      if (r.session_start && r.step <= step)
        scans[i].first_start = std::min(scans[i].first_start, r.step);
    }
  }
  // The first abandoned step of each file: past `step`, or from a later file's session start on
  // (an earlier resume in place kept those steps, for readers that honour the marker to drop).
  std::vector<std::int64_t> cut(files.size(), step + 1);
  std::int64_t later_start = std::numeric_limits<std::int64_t>::max();
  for (std::size_t i = files.size(); i-- > 0;) {
    cut[i] = std::min(step + 1, later_start);
    later_start = std::min(later_start, scans[i].first_start);
  }
  std::int64_t dropped = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (scans[i].last_step < cut[i] && scans[i].last_text < cut[i] - 1) continue;
    // The whole file goes aside as a second link first, then the trimmed one replaces it by a
    // rename: at every moment the folder holds one of the two, and a kill loses neither.
    fs::create_directories(aside, ec);
    if (ec)
      throw sdk::UserError("cannot create " + aside.string() + ": " + ec.message(),
                           "it would keep the event files' abandoned continuation after step " +
                               std::to_string(step) +
                               "; check the run folder's free space, then resume again");
    const std::string rest = files[i].filename().string().substr(kEventFilePrefix.size());
    const fs::path whole = aside / ("events.out.discarded." + rest);
    ec.clear();
    fs::create_hard_link(files[i], whole, ec);
    if (ec) {
      ec.clear();
      fs::copy_file(files[i], whole, ec);
    }
    if (ec)
      throw sdk::UserError(
          "cannot keep " + files[i].string() + " in " + aside.string() + ": " + ec.message(),
          "it holds the abandoned continuation after step " + std::to_string(step) +
              "; check the run folder's free space, then "
              "resume again");
    // Named without "tfevents", which TensorBoard loads: a half-written one is never shown.
    const fs::path trimmed = dir / (std::string(kTrimmedPrefix) + rest);
    std::int64_t past = 0;
    {
      std::ofstream out(trimmed, std::ios::binary | std::ios::trunc);
      TfRecordReader reader(files[i]);
      while (const std::string* data = reader.next()) {
        if (abandoned(classify(*data), cut[i])) {
          ++past;
          continue;
        }
        const std::string frame = tfrecord_frame(*data);
        out.write(frame.data(), static_cast<std::streamsize>(frame.size()));
      }
      out.close();
      if (!out)
        throw sdk::UserError("cannot write " + trimmed.string(),
                             "check the run folder's free space, then resume again");
    }
    fs::rename(trimmed, files[i], ec);
    if (ec)
      throw sdk::UserError("cannot replace " + files[i].string() + ": " + ec.message(),
                           "check the run folder's permissions, then resume again");
    dropped += past;
  }
  return dropped;
}

fs::path TensorBoardWriter::new_file_name(const fs::path& dir) {
  // TensorBoard reads a folder's event files in name order and a resumed run's session start
  // only drops what came before it: the new file must sort last, also when it starts within the
  // same second as the previous one (the pid alone would order them by chance).
  const std::string prefix = "events.out.tfevents.";
  std::string last;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name > last) last = name;
  }
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  const std::string tail = "." + host_name() + "." + std::to_string(getpid());
  if (!last.empty()) {
    const std::string field =
        last.substr(prefix.size(), last.find('.', prefix.size()) - prefix.size());
    if (!field.empty() && field.size() <= 18 &&
        field.find_first_not_of("0123456789") == std::string::npos)
      seconds = std::max<std::int64_t>(seconds, std::stoll(field));
    if (prefix + std::to_string(seconds) + tail <= last) ++seconds;
  }
  return dir / (prefix + std::to_string(seconds) + tail);
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) : out_(new_file_name(dir)) {
  auto e = event_at(0);
  e.set_file_version("brain.Event:2");
  e.mutable_source_metadata()->set_writer("mixtrain");
  // Readers take a file for an event file by its first record.
  if (!out_.append(tfrecord_frame(e.SerializeAsString())))
    throw sdk::UserError("cannot write the first record of " + out_.path().string(),
                         "free space on the run folder's disk, or choose another --run-dir");
}

void TensorBoardWriter::add_scalars(std::int64_t step,
                                    const std::vector<std::pair<std::string, float>>& values) {
  if (values.empty()) return;
  auto e = event_at(step);
  for (const auto& [tag, value] : values) {
    auto* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(value);
  }
  write_record(e.SerializeAsString());
}

void TensorBoardWriter::add_text(std::int64_t step, const std::string& tag,
                                 const std::string& markdown) {
  auto e = event_at(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  // The text plugin claims values by plugin name; its settings (content) are empty at version 0.
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->mutable_tensor_shape();  // no dims: one string
  t->add_string_val(markdown);
  write_record(e.SerializeAsString());
}

void TensorBoardWriter::add_session_start(std::int64_t step) {
  auto e = event_at(step);
  e.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write_record(e.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& serialized_event) {
  out_.append(tfrecord_frame(serialized_event));
}

}  // namespace mixtrain::core
