// TensorBoardWriter: one TensorBoard event file, events.out.tfevents.<seconds>.<host>.<pid> in a
// folder; `tensorboard --logdir` shows each folder holding such files as one run and merges the
// files of a folder in name order.
//
// Contract
// - The constructor creates the file (a new one each time: a resumed run adds a file), named to
//   sort after the folder's other event files, and writes the first record, file_version
//   "brain.Event:2"; sdk::UserError when it cannot.
// - Each add_* call writes one Event (wall time, step) in TFRecord framing (runs/tfrecord.h) and
//   flushes it, so a killed run keeps every record before the kill.
// - Scalars are Summary values with simple_value (TensorBoard's scalars dashboard); text is a
//   string tensor for the text plugin, rendered as markdown.
// - add_session_start(step) tells readers that what earlier files hold from `step` on belongs to
//   an abandoned continuation (a resume from step - 1), so they drop it.
// - drop_events_after_step(dir, step, aside) makes the folder's event files hold nothing past
//   `step` (a resume from `step` abandons its later continuation): each file with an event past it
//   moves into `aside` (created), renamed events.out.discarded.* so that TensorBoard no longer
//   loads it (it loads any file whose name holds "tfevents"), and a copy of its events up to
//   `step` (the first, the file version, included) takes its place, written atomically. Every
//   reader then shows the resumed run alone: TensorBoard's older reader honours the session start
//   that a resumed file writes only after an earlier one, and its newer data server ignores those
//   markers (it drops a tag's points only when that tag steps back). A torn last record (a killed
//   run) ends what is kept. Returns how many events moved aside; sdk::UserError when a file cannot
//   be read, moved or written.
// - The protobuf messages stay inside the implementation: this header names none.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain::core {

std::int64_t drop_events_after_step(const std::filesystem::path& dir, std::int64_t step,
                                    const std::filesystem::path& aside);

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::filesystem::path& dir);

  const std::filesystem::path& path() const { return path_; }
  void add_scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& values);
  void add_text(std::int64_t step, const std::string& tag, const std::string& markdown);
  void add_session_start(std::int64_t step);

 private:
  void write_record(const std::string& serialized_event);
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace mixtrain::core
