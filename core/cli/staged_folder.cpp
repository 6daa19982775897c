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

}  // namespace

StagedFolder::StagedFolder(const fs::path& out)
    : out_(out), staging_(out / (std::string(kStagingPrefix) + std::to_string(::getpid()))) {
  std::error_code ec;
  fs::remove_all(staging_, ec);
  fs::create_directory(staging_, ec);
  if (ec)
    throw sdk::UserError("cannot create " + staging_.string() + ": " + ec.message(),
                         "choose an --out you may write to");
  lock_fd_ = open_folder(staging_);
  // Where the file system has no flock the folder is still used; only a later export's cleanup
  // could then not tell it from an abandoned one.
  if (lock_fd_ >= 0)
    while (::flock(lock_fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
}

StagedFolder::~StagedFolder() {
  std::error_code ec;
  fs::remove_all(staging_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void StagedFolder::publish(std::initializer_list<std::string_view> names) const {
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
    // Removed while holding the lock, so a writer cannot start in it meanwhile (it would fail to
    // write and say so, never publish a partial file).
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code removal;
      fs::remove_all(folder, removal);
      if (!removal) removed.push_back(folder);
    }
    ::close(fd);
  }
  return removed;
}

}  // namespace mixtrain::cli
