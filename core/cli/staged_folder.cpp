#include "staged_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "mixtrain/sdk/error.h"

namespace mixtrain::cli {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kStagingPrefix = ".mixtrain-export.tmp.";

// O_NOFOLLOW: a link planted under a staging name is not ours to lock or remove through.
int open_folder(const fs::path& folder) {
  return ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
}

// Whether `fd` is the folder `path` names now (not one a cleaner removed and another made).
bool names_it(int fd, const fs::path& path) {
  struct stat by_fd {};
  struct stat by_name {};
  return ::fstat(fd, &by_fd) == 0 && ::lstat(path.c_str(), &by_name) == 0 &&
         by_fd.st_ino == by_name.st_ino && by_fd.st_dev == by_name.st_dev;
}

}  // namespace

StagedFolder::StagedFolder(const fs::path& out) : out_(out) {
  // pid + counter, as the SDK's temporary files: a folder of this pid left by a process of
  // another pid namespace (a container sharing the folder) is never taken over.
  for (int n = 0; lock_fd_ < 0; ++n) {
    staging_ =
        out / (std::string(kStagingPrefix) + std::to_string(::getpid()) + "." + std::to_string(n));
    std::error_code ec;
    const bool made = fs::create_directory(staging_, ec);
    if (ec || n >= 100)
      throw sdk::UserError("cannot create " + staging_.string() + ": " +
                               (ec ? ec.message() : std::string("100 names taken")),
                           "choose an --out you may write to");
    if (!made) continue;
    const int fd = open_folder(staging_);
    if (fd < 0) {
      const int err = errno;
      throw sdk::UserError("cannot open " + staging_.string() + ": " + std::strerror(err),
                           "choose an --out you may write to");
    }
    // Held for the object's life: the next export's cleanup passes over a folder locked so.
    // Where the file system has no flock, that cleanup cannot lock it either and removes none.
    int locked = ::flock(fd, LOCK_EX);
    while (locked != 0 && errno == EINTR) locked = ::flock(fd, LOCK_EX);
    // A cleaner may have removed the folder between its creation and the lock: make another.
    if (locked == 0 && !names_it(fd, staging_)) {
      ::close(fd);
      continue;
    }
    lock_fd_ = fd;
  }
}

StagedFolder::~StagedFolder() {
  std::error_code ec;
  fs::remove_all(staging_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void StagedFolder::publish(const std::vector<std::string_view>& names) const {
  for (const std::string_view name : names) {
    std::error_code ec;
    fs::rename(staging_ / name, out_ / name, ec);
    if (ec)
      throw sdk::UserError("cannot move " + (staging_ / name).string() + " to " +
                               (out_ / name).string() + ": " + ec.message(),
                           "check the folder's permissions, then export again");
  }
}

std::vector<fs::path> remove_abandoned_staging_folders(const fs::path& out) {
  std::vector<fs::path> candidates, removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out, ec))
    if (entry.path().filename().string().starts_with(kStagingPrefix))
      candidates.push_back(entry.path());
  for (const auto& folder : candidates) {
    const int fd = open_folder(folder);
    if (fd < 0) continue;
    // A shared lock conflicts with the writer's exclusive one just as well and, unlike an
    // exclusive one, NFS grants it on a descriptor opened read-only. Removed while holding it,
    // and only if the name still names the folder locked.
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0 && names_it(fd, folder)) {
      std::error_code removal;
      fs::remove_all(folder, removal);
      if (!removal) removed.push_back(folder);
    }
    ::close(fd);
  }
  return removed;
}

}  // namespace mixtrain::cli
