// UniqueFd: sole owner of a POSIX file descriptor, closed when the owner goes away, so a reader
// that throws halfway (a truncated or corrupt file) leaks no descriptor.
//
// Contract
// - Construct from a descriptor open(2) returned, or from a negative value (owns nothing).
// - The destructor closes a non-negative descriptor and ignores close(2)'s result: for a file
//   opened to read, no data can be lost there. A writer that must see deferred write errors
//   (NFS, quota) closes through AtomicFileWriter instead.
// - Neither copyable nor movable: hold it where it lives (a member, std::optional::emplace).
// - get() lends the descriptor; the caller must not close it.
#pragma once

#include <unistd.h>

namespace mixtrain::sdk {

class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace mixtrain::sdk
