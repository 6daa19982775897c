#include "runs/tensorboard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <string_view>

#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
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

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof())
    throw sdk::UserError("cannot read " + file.string(), "check the run folder's permissions");
  return bytes;
}

}  // namespace

std::int64_t drop_events_after_step(const fs::path& dir, std::int64_t step, const fs::path& aside) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec))
    if (f.path().filename().string().rfind(kEventFilePrefix, 0) == 0 && f.is_regular_file(ec))
      files.push_back(f.path());
  std::sort(files.begin(), files.end());
  std::int64_t dropped = 0;
  for (const auto& file : files) {
    const std::string bytes = read_file(file);
    std::string kept;
    std::int64_t past = 0;
    for (const auto record : tfrecord_records(bytes)) {
      tensorboard::Event e;
      // An event that does not parse is kept as it is: only a step past `step` is abandoned.
      if (e.ParseFromArray(record.data(), static_cast<int>(record.size())) &&
          !e.has_file_version() && e.step() > step) {
        ++past;
        continue;
      }
      kept += tfrecord_frame(record);
    }
    if (past == 0) continue;
    fs::create_directories(aside, ec);
    const std::string name = file.filename().string();
    const fs::path moved = aside / ("events.out.discarded." + name.substr(kEventFilePrefix.size()));
    fs::rename(file, moved, ec);
    if (ec)
      throw sdk::UserError("cannot move " + file.string() + " aside: " + ec.message(),
                           "it holds the abandoned continuation after step " +
                               std::to_string(step) + "; move or delete it, then resume");
    sdk::AtomicFileWriter out(file, /*durable=*/false, "TensorBoard event file");
    out.write(kept.data(), kept.size());
    out.commit();
    dropped += past;
  }
  return dropped;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
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
  path_ = dir / (prefix + std::to_string(seconds) + tail);
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw sdk::UserError("cannot write " + path_.string(), "choose a writable --run-dir");
  auto e = event_at(0);
  e.set_file_version("brain.Event:2");
  e.mutable_source_metadata()->set_writer("mixtrain");
  write_record(e.SerializeAsString());
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
  out_ << tfrecord_frame(serialized_event);
  out_.flush();
}

}  // namespace mixtrain::core
