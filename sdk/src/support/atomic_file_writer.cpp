#include "mixtrain/sdk/support/atomic_file_writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "mixtrain/sdk/error.h"

namespace mixtrain::sdk {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kBufferCapacity = std::size_t{8} << 20;

std::string quoted(const fs::path& p) {
  return "'" + p.string() + "'";
}

fs::path temp_path_for(const fs::path& target) {
  // pid + counter: unique across processes and across threads of this one.
  static std::atomic<unsigned> counter{0};
  const unsigned n = counter.fetch_add(1);
  return target.parent_path() / ("." + target.filename().string() + ".tmp." +
                                 std::to_string(::getpid()) + "." + std::to_string(n));
}

// ".<target>.tmp.<pid>.<n>", as temp_path_for makes them.
bool is_temp_file_name(const std::string& name) {
  const auto tmp = name.rfind(".tmp.");
  if (name.size() < 2 || name[0] != '.' || tmp == std::string::npos || tmp < 2) return false;
  const std::string suffix = name.substr(tmp + 5);  // "<pid>.<n>"
  const auto dot = suffix.find('.');
  auto digits = [](const std::string& t) {
    return !t.empty() &&
           std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return dot != std::string::npos && digits(suffix.substr(0, dot)) &&
         digits(suffix.substr(dot + 1));
}

int write_all(int fd, const std::byte* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

}  // namespace

std::string hint_for_os_error(int err) {
  switch (err) {
    case ENOENT:
      return "the folder does not exist (or was removed); create it or choose another path";
    case EACCES:
    case EPERM:
      return "check the permissions of the folder and the file";
    case EROFS:
      return "the file system is read-only; choose a writable location";
    case ENOSPC:
    case EDQUOT:
      return "the disk or quota is full; free space or choose another location";
    case EISDIR:
      return "the path names a directory; give a file path";
    case ENOTDIR:
      return "a component of the path is a file, not a folder; check the path";
    case EFBIG:
      return "the file exceeds the size limit of this process or file system (see ulimit -f)";
    default:
      return "check the path, the free disk space and the permissions";
  }
}

void AtomicFileWriter::fail(const std::string& action, int err) const {
  throw CheckpointError(
      "cannot write " + what_ + " " + quoted(target_) + ": " + action + ": " + std::strerror(err),
      hint_for_os_error(err));
}

AtomicFileWriter::AtomicFileWriter(fs::path target, bool durable, std::string what)
    : target_(std::move(target)), durable_(durable), what_(std::move(what)) {
  if (target_.filename().empty())
    throw CheckpointError(
        "cannot write " + what_ + " " + quoted(target_) + ": the path has no file name",
        "give a file path, not a folder");
  struct stat target_stat {};
  const bool target_exists = ::stat(target_.c_str(), &target_stat) == 0;
  if (target_exists && S_ISDIR(target_stat.st_mode)) fail("the target is a directory", EISDIR);
  for (unsigned attempt = 0; fd_ < 0; ++attempt) {
    temp_ = temp_path_for(target_);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    const int err = errno;
    // EEXIST: a stale temp file from an earlier process with the same pid (containers reuse pids).
    if (fd_ < 0 && (err != EEXIST || attempt > 100))
      fail("cannot create the temporary file " + quoted(temp_), err);
    if (fd_ < 0) continue;
    // The lock marks the file as owned by a live writer (see remove_stale_temp_files). A cleaner
    // may have taken it between open() and here and unlinked the file: then the lock we get is on
    // an orphaned inode, so start over with a new name. Where the file system has no flock, the
    // write goes on unlocked: a cleaner there cannot lock either, so it removes nothing.
    int locked = ::flock(fd_, LOCK_EX);
    while (locked != 0 && errno == EINTR) locked = ::flock(fd_, LOCK_EX);  // a host's signal
    if (locked != 0) break;
    struct stat by_fd {};
    struct stat by_name {};
    if (::fstat(fd_, &by_fd) != 0 || ::stat(temp_.c_str(), &by_name) != 0 ||
        by_fd.st_ino != by_name.st_ino || by_fd.st_dev != by_name.st_dev) {
      ::close(fd_);
      fd_ = -1;
      if (attempt > 100) fail("the temporary file " + quoted(temp_) + " keeps vanishing", ENOENT);
    }
  }
  // Replacing a file should not silently change who may read it.
  if (target_exists) ::fchmod(fd_, target_stat.st_mode & 07777);
  buffer_.reserve(kBufferCapacity);
}

AtomicFileWriter::~AtomicFileWriter() {
  // Unlink while still holding the lock, so no cleaner sees an unlocked file of ours.
  if (!committed_) ::unlink(temp_.c_str());
  if (fd_ >= 0) ::close(fd_);
}

void AtomicFileWriter::flush() {
  if (buffer_.empty()) return;
  if (int err = write_all(fd_, buffer_.data(), buffer_.size()); err != 0)
    fail("writing " + quoted(temp_) + " failed", err);
  buffer_.clear();
}

void AtomicFileWriter::write(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const std::byte*>(data);
  // Big tensors go straight to write(2): a 400 MB state costs a few dozen syscalls and no copy.
  if (size >= kBufferCapacity / 2) {
    flush();
    if (int err = write_all(fd_, bytes, size); err != 0)
      fail("writing " + quoted(temp_) + " failed", err);
  } else {
    if (buffer_.size() + size > kBufferCapacity) flush();
    buffer_.insert(buffer_.end(), bytes, bytes + size);
  }
  written_ += size;
}

void AtomicFileWriter::write_zeros(std::size_t size) {
  static constexpr std::byte zeros[4096] = {};
  while (size > 0) {
    const auto n = std::min(size, sizeof zeros);
    write(zeros, n);
    size -= n;
  }
}

std::string AtomicFileWriter::commit() {
  flush();
  if (durable_ && ::fsync(fd_) != 0) fail("fsync of " + quoted(temp_) + " failed", errno);
  // close() can report a deferred write error (NFS, quota), so its result counts.
  const int fd = fd_;
  fd_ = -1;
  // The flock belongs to the open file description: a duplicate keeps it held across close(),
  // so a cleaner cannot take the file between close() and rename().
  const int lock_fd = ::dup(fd);
  const int close_result = ::close(fd);
  const int close_err = errno;
  if (close_result != 0) {
    if (lock_fd >= 0) ::close(lock_fd);
    fail("closing " + quoted(temp_), close_err);
  }
  const int rename_result = ::rename(temp_.c_str(), target_.c_str());
  const int rename_err = errno;
  if (lock_fd >= 0) ::close(lock_fd);
  if (rename_result != 0) fail("cannot rename " + quoted(temp_) + " over the target", rename_err);
  committed_ = true;
  if (!durable_) return {};
  // The new file is in place: failing to persist the folder entry is a warning, not a failure.
  const fs::path folder = target_.parent_path().empty() ? fs::path(".") : target_.parent_path();
  const int dir_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  std::string warning;
  if (dir_fd < 0 || ::fsync(dir_fd) != 0)
    warning = what_ + " " + quoted(target_) + " written, but fsync of its folder failed (" +
              std::strerror(errno) + "); it may be lost on power failure";
  if (dir_fd >= 0) ::close(dir_fd);
  return warning;
}

std::vector<fs::path> remove_stale_temp_files(const fs::path& folder) {
  std::vector<fs::path> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (!is_temp_file_name(name)) continue;
    const fs::path& path = entry.path();
    // O_NOFOLLOW: a symlink planted under a temp name is not ours to follow or lock.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat by_fd {};
    struct stat by_name {};
    // The writer holds its lock until it renames or unlinks the file, and the kernel drops it
    // when the writer dies: a lock we can take means no live writer. Unlink only while holding
    // it, and only if the name still names the inode we locked.
    // A shared lock conflicts with the writer's exclusive one just as well, and, unlike an
    // exclusive lock, NFS grants it on a file opened read-only.
    if (::fstat(fd, &by_fd) == 0 && S_ISREG(by_fd.st_mode) && ::flock(fd, LOCK_SH | LOCK_NB) == 0 &&
        ::lstat(path.c_str(), &by_name) == 0 && by_fd.st_ino == by_name.st_ino &&
        by_fd.st_dev == by_name.st_dev && ::unlink(path.c_str()) == 0)
      removed.push_back(path);
    ::close(fd);
  }
  return removed;
}

}  // namespace mixtrain::sdk
