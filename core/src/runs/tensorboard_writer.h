// TensorBoardWriter: one TensorBoard event file, events.out.tfevents.<seconds>.<host>.<pid> in a
// folder; `tensorboard --logdir` shows each folder holding such files as one run and merges the
// files of a folder in name order.
//
// Contract
// - The constructor creates the file (a new one each time: a resumed run adds a file), named to
//   sort after the folder's other event files, and writes the first record, file_version
//   "brain.Event:2"; sdk::UserError when it cannot.
// - Each add_* call writes one Event (wall time, step) in TFRecord framing (runs/tfrecord.h) and
//   hands it to the OS, so a killed run keeps every record before the kill; a write that fails
//   (a full disk) drops that event whole and warns (runs/record_appender.h), so the file never
//   holds a torn record that would end what readers load.
// - Scalars are Summary values with simple_value (TensorBoard's scalars dashboard); text is a
//   string tensor for the text plugin, rendered as markdown.
// - add_session_start(step) tells readers that what earlier files hold from `step` on belongs to
//   an abandoned continuation (a resume from step - 1), so they drop it.
// - drop_events_after_step(dir, step, aside) makes the folder's event files hold nothing of an
//   abandoned continuation (a resume from `step`): no step past `step`, nor, in a file, a step from
//   a later file's session start on (what a resume in place by an earlier version left for readers
//   to drop), nor the run/* texts (config, precision plan) a continuation wrote at the step it
//   resumed from, where the resuming run writes its own. Each file with such events gets a second
//   link (a copy where links fail) in `aside` (created), named events.out.discarded.* so that
//   TensorBoard does not load it (it loads any file whose name holds "tfevents"), and is then
//   replaced by a rename of its trimmed copy: at every moment the folder holds the whole file or
//   the trimmed one. The trimmed copy is written under a name without "tfevents" first; one a
//   killed resume left is removed. Every reader then shows one history: TensorBoard's server
//   honours a session start only after an earlier one, and its data server none (it drops a tag's
//   points only when that tag steps back). A torn last record (a killed run) ends what is kept.
//   Returns how many events were dropped; sdk::UserError when a file cannot be read, kept or
//   replaced.
// - The protobuf messages stay inside the implementation: this header names none.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "runs/record_appender.h"

namespace mixtrain::core {

std::int64_t drop_events_after_step(const std::filesystem::path& dir, std::int64_t step,
                                    const std::filesystem::path& aside);

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::filesystem::path& dir);

  const std::filesystem::path& path() const { return out_.path(); }
  void add_scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& values);
  void add_text(std::int64_t step, const std::string& tag, const std::string& markdown);
  void add_session_start(std::int64_t step);

 private:
  static std::filesystem::path new_file_name(const std::filesystem::path& dir);
  void write_record(const std::string& serialized_event);
  RecordAppender out_;
};

}  // namespace mixtrain::core
