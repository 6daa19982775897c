// ScopedFilesystemUser: this thread's filesystem user and group (setfsuid(2), setfsgid(2)) set to
// an unprivileged id for the object's life, so a test of a permission error runs as root too.
//
// Contract
// - Linux only. Changing the filesystem uid from 0 to another drops CAP_DAC_OVERRIDE and its kin
//   from the effective set, so open() and the rest check permissions as that user would; back to
//   0 on destruction, they return. Only the constructing thread is affected: the code under test
//   must open its files on this thread (no thread pool).
// - active() is false where the process is not root (nothing to drop: permissions already apply),
//   and where the switch did not take (no CAP_SETUID, or a user namespace without that id):
//   setfsuid reports nothing, so the ids are read back. A test of a permission error skips as
//   root when !active().
#pragma once

#include <sys/fsuid.h>
#include <unistd.h>

namespace mixtrain::test {

class ScopedFilesystemUser {
 public:
  explicit ScopedFilesystemUser(unsigned id = 65534) : active_(::geteuid() == 0) {
    if (!active_) return;
    previous_gid_ = static_cast<unsigned>(::setfsgid(id));
    previous_uid_ = static_cast<unsigned>(::setfsuid(id));
    // -1 changes nothing and returns the current id: whether the switch took.
    if (static_cast<unsigned>(::setfsuid(static_cast<uid_t>(-1))) != id ||
        static_cast<unsigned>(::setfsgid(static_cast<gid_t>(-1))) != id) {
      ::setfsuid(previous_uid_);
      ::setfsgid(previous_gid_);
      active_ = false;
    }
  }
  ~ScopedFilesystemUser() {
    if (!active_) return;
    ::setfsuid(previous_uid_);
    ::setfsgid(previous_gid_);
  }
  ScopedFilesystemUser(const ScopedFilesystemUser&) = delete;
  ScopedFilesystemUser& operator=(const ScopedFilesystemUser&) = delete;
  bool active() const { return active_; }
  // Whether permissions bind on this thread: not root, or root switched to `id`.
  bool permissions_bind() const { return active_ || ::geteuid() != 0; }

 private:
  bool active_;
  unsigned previous_uid_ = 0, previous_gid_ = 0;
};

}  // namespace mixtrain::test
