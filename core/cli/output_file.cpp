#include "output_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"

namespace mixtrain::cli {

namespace fs = std::filesystem;

namespace {

// The writers write a new file beside the output and rename it into place: the folder must
// exist and take new files (checked now, not after a long calibration or prediction).
void check_writable_folder(const fs::path& folder, const fs::path& out, const std::string& flag) {
  std::error_code ec;
  const fs::path where = folder.empty() ? fs::path(".") : folder;
  if (!fs::is_directory(where, ec))
    throw sdk::UserError(
        "the folder of " + out.string() + ", " + where.string() +
            (fs::exists(where, ec) ? ", is not a folder" : ", does not exist"),
        "create it first (mkdir -p " + where.string() + "), or choose another " + flag);
  if (::access(where.c_str(), W_OK | X_OK) != 0)
    throw sdk::UserError(
        "cannot write " + out.string() + ": " + std::strerror(errno) + " (" + where.string() + ")",
        "choose another " + flag + " in a folder you may write to");
}

// A device, a FIFO, a socket or a symbolic link is not a file the rename may replace: it replaces
// the entry itself (as root, --force over /dev/null or /dev/stdout, a link, would replace the
// system's), never writes through it.
void refuse_special_file(const fs::path& out, const std::string& flag) {
  std::error_code ec;
  const auto entry = fs::symlink_status(out, ec);
  if (fs::is_symlink(entry))
    throw sdk::UserError(out.string() + " is a symbolic link",
                         "give the file's own path as " + flag +
                             ": the output is written as a new file and renamed into place, "
                             "which would replace the link, not what it points to");
  if (fs::exists(entry) && !fs::is_regular_file(entry) && !fs::is_directory(entry))
    throw sdk::UserError(out.string() + " is not a regular file (a device, a FIFO or a socket)",
                         "choose another " + flag +
                             ": the output is written as a new file and renamed into place, "
                             "which would replace it");
}

}  // namespace

void check_output_file(const fs::path& out, const CommandInputs& inputs, bool force,
                       const std::string& flag, const std::string& example_name) {
  std::error_code ec;
  refuse_input_as_output(flag, out, inputs);
  refuse_run_record_as_output(flag, out, inputs, example_name);
  if (fs::is_directory(out, ec))
    throw sdk::UserError(out.string() + " is a folder",
                         "give a file name, e.g. " + flag + " " + (out / example_name).string());
  refuse_special_file(out, flag);
  if (fs::exists(out, ec) && !force)
    throw sdk::UserError(out.string() + " already exists",
                         "pass --force to overwrite it, or choose another " + flag);
  check_writable_folder(out.parent_path(), out, flag);
}

void check_output_folder(const fs::path& out, const std::vector<std::string>& files,
                         const CommandInputs& inputs, bool force) {
  std::error_code ec;
  refuse_input_as_output("--out", out, inputs);
  for (const auto& file : files) refuse_input_as_output("--out", out / file, inputs);
  refuse_run_record_as_output("--out", out, inputs, "exported");
  for (const auto& file : files)
    refuse_run_record_as_output("--out", out / file, inputs, "exported");
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw sdk::UserError(out.string() + " is a file, but this output is a folder",
                         "give a folder name, e.g. --out " + out.string() + "-hf");
  if (fs::is_directory(out, ec) && !fs::is_empty(out, ec) && !force)
    throw sdk::UserError(out.string() + " already exists and is not empty",
                         "pass --force to replace the files this export writes there (others "
                         "stay), or choose another --out");
  for (const auto& file : files) refuse_special_file(out / file, "--out");
  // "dir/" names dir, whose parent must exist; an existing folder must take the files.
  const fs::path named = out.has_filename() ? out : out.parent_path();
  if (fs::is_directory(named, ec))
    check_writable_folder(named, named / files.front(), "--out");
  else
    check_writable_folder(named.parent_path(), named, "--out");
}

// A writer killed by a signal it cannot catch (SIGKILL, a second Ctrl-C) or a power cut leaves its
// temporary file (an output's size) beside the output; the next command writing there clears it.
std::vector<fs::path> remove_abandoned_temp_files(const fs::path& out) {
  const fs::path folder = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  return sdk::remove_stale_temp_files(folder);
}

}  // namespace mixtrain::cli
