// StagedFolder: the files of one output folder (`export --layout hf` and `peft`) written whole into
// a staging folder inside it, then renamed into place in a given order.
//
// Contract
// - The constructor creates `out/.mixtrain-export.tmp.<pid>.<n>` (the first n free) and holds an
//   exclusive flock(2) on it for the object's life; sdk::UserError when it cannot be created.
// - staged(name) is where a file is written; publish(names) renames them into `out` in that
//   order (renames need no space), sdk::UserError naming the file when one fails.
// - The destructor removes the staging folder, published or not: a failure while writing (a full
//   disk) leaves `out` as it was.
// - remove_abandoned_staging_folders(out): the staging folders in `out` that no live writer holds
//   (a writer killed by SIGKILL or Ctrl-C, which export does not catch, leaves its folder and a
//   partial weights file), removed and returned for the log. The kernel drops a dead process's
//   lock, so a lock we can take (shared: NFS grants it read-only) means no live writer, as for
//   sdk::remove_stale_temp_files.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

namespace mixtrain::cli {

class StagedFolder {
 public:
  explicit StagedFolder(const std::filesystem::path& out);
  ~StagedFolder();
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;

  std::filesystem::path staged(std::string_view name) const { return staging_ / name; }
  void publish(const std::vector<std::string_view>& names) const;

 private:
  std::filesystem::path out_, staging_;
  int lock_fd_ = -1;
};

std::vector<std::filesystem::path> remove_abandoned_staging_folders(
    const std::filesystem::path& out);

}  // namespace mixtrain::cli
