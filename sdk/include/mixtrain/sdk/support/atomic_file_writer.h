// AtomicFileWriter: write a file so that readers see the old one or the complete new one, never
// a torn mix — the write path every checkpoint format needs.
//
// Contract
// - The constructor creates a unique temporary file next to `target` (same folder, so the final
//   rename is atomic), keeping an existing target's permission bits. A target that is a
//   directory, or a folder that cannot be written, raises CheckpointError.
// - write() appends bytes (large writes go straight to write(2); small ones are coalesced).
// - commit() flushes, fsyncs (when `durable`), closes, renames over the target and fsyncs the
//   folder. It returns a warning text when only that last folder fsync failed (the new file is in
//   place; the caller logs it), else an empty string.
// - Destroying an uncommitted writer removes the temporary file: no failure leaves one behind and
//   the previous target is untouched.
// - Errors are sdk::CheckpointError naming the target, the operation and the OS error, with a hint.
// - The temporary file is ".<target name>.tmp.<pid>.<n>" and the writer holds an exclusive
//   flock(2) on it for its whole life. A writer killed outright (kill -9, power loss) leaves the
//   file behind; remove_stale_temp_files() removes exactly those whose lock nobody holds.
//   A lock rather than "is the pid in the name alive": pids are reused (a container restarts at
//   pid 1, so a stale file's pid is often alive) and are meaningless to a writer in another pid
//   namespace sharing the folder, whereas the kernel drops a dead process's locks itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace mixtrain::sdk {

class AtomicFileWriter {
 public:
  // `what` names the file in messages ("checkpoint", "safetensors file").
  AtomicFileWriter(std::filesystem::path target, bool durable, std::string what = "file");
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, std::size_t size);
  void write_zeros(std::size_t size);
  std::uint64_t written() const { return written_; }
  std::string commit();

  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  void flush();
  [[noreturn]] void fail(const std::string& action, int err) const;

  std::filesystem::path target_, temp_;
  bool durable_;
  std::string what_;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<std::byte> buffer_;
  std::uint64_t written_ = 0;
};

// Removes the temporary files of AtomicFileWriters in `folder` (not its subfolders) that no live
// writer holds, and returns their paths. Other files, and temp files of live writers in any
// process, are left alone; an unreadable folder removes nothing.
std::vector<std::filesystem::path> remove_stale_temp_files(const std::filesystem::path& folder);

// A short, actionable hint for an errno from file I/O ("the disk is full; ...").
std::string hint_for_os_error(int err);

}  // namespace mixtrain::sdk
