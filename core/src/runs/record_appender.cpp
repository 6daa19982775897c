#include "runs/record_appender.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

// Writes all of `bytes` at the file's end; the errno of the write that failed, or 0.
int write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

}  // namespace

RecordAppender::RecordAppender(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw sdk::UserError("cannot write " + path.string() + ": " + std::strerror(errno),
                         "choose a --run-dir on a disk with free space that you may write to");
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode))
    bytes_on_open_ = static_cast<std::uint64_t>(st.st_size);
  whole_bytes_ = bytes_on_open_;
}

RecordAppender::~RecordAppender() {
  if (fd_ >= 0) ::close(fd_);
}

bool RecordAppender::append(std::string_view record) {
  if (broken_ || fd_ < 0) return false;
  const int error = write_all(fd_, record);
  if (error == 0) {
    whole_bytes_ += record.size();
    if (lost_ > 0)
      core_logger("metrics").info("writing " + path_.string() + " again; " + std::to_string(lost_) +
                                  " record" + (lost_ == 1 ? "" : "s") +
                                  " before this one could not be written");
    lost_ = 0;
    return true;
  }
  // Part of the record may have landed: cut it off, so that the file ends with a whole record
  // and the next one that lands is read as one.
  if (::ftruncate(fd_, static_cast<off_t>(whole_bytes_)) != 0) {
    const int cut_error = errno;
    broken_ = true;
    core_logger("metrics").warn("cannot write " + path_.string() + ": " + std::strerror(error) +
                                ", nor truncate it back to its last whole record (" +
                                std::strerror(cut_error) +
                                "); it is written no more this run (training goes on)");
    return false;
  }
  if (lost_++ == 0)
    core_logger("metrics").warn("cannot write " + path_.string() + ": " + std::strerror(error) +
                                "; its records are dropped until a write succeeds (training goes "
                                "on). Free space on the run folder's disk");
  return false;
}

}  // namespace mixtrain::core
