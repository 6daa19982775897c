// RecordAppender: a run-folder file that grows by whole records (a metrics.jsonl line, a CSV row,
// a TFRecord-framed TensorBoard event). Internal to the core; the metric sinks write through it.
//
// Contract
// - The constructor opens the file for appending, creating it; sdk::UserError naming the file and
//   the OS's reason (permissions, no space, no inodes) when it cannot.
// - append() hands one record to the OS before it returns (a killed run keeps every record
//   written before the kill), says whether it landed, never throws, and never leaves part of a
//   record: a write that fails
//   (a full disk, a quota) is cut back to the file's last whole record. The first failure logs
//   one warning naming the file and the reason, then later records are tried again; the first
//   that lands logs how many were lost. A file that cannot be cut back (the OS refuses even
//   that) is written no more, and says so once. Training goes on in every case: metrics are not
//   worth stopping a run for, but a reader must be able to trust what the file holds.
// - bytes_on_open(): the file's size when opened (0: new or empty), for a header written once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace mixtrain::core {

class RecordAppender {
 public:
  explicit RecordAppender(const std::filesystem::path& path);
  ~RecordAppender();
  RecordAppender(const RecordAppender&) = delete;
  RecordAppender& operator=(const RecordAppender&) = delete;

  bool append(std::string_view record);  // whether it landed
  std::uint64_t bytes_on_open() const { return bytes_on_open_; }
  std::uint64_t records_lost() const { return lost_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t bytes_on_open_ = 0;
  std::uint64_t whole_bytes_ = 0;  // the file's size after its last whole record
  std::uint64_t lost_ = 0;         // records dropped since the last one that landed
  bool broken_ = false;            // a torn record could not be cut back: write nothing more
};

}  // namespace mixtrain::core
