#include "output_file.h"

#include <string>
#include <system_error>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::cli {

namespace fs = std::filesystem;

namespace {

void check_parent(const fs::path& out) {
  std::error_code ec;
  const fs::path folder = out.parent_path();
  if (!folder.empty() && !fs::is_directory(folder, ec))
    throw sdk::UserError(
        "the folder of " + out.string() + ", " + folder.string() +
            (fs::exists(folder, ec) ? ", is not a folder" : ", does not exist"),
        "create it first (mkdir -p " + folder.string() + "), or choose another --out");
}

}  // namespace

void check_output_file(const fs::path& out, const CommandInputs& inputs, bool force) {
  std::error_code ec;
  refuse_input_as_output("--out", out, inputs);
  if (fs::is_directory(out, ec))
    throw sdk::UserError(out.string() + " is a folder",
                         "give a file name, e.g. --out " + (out / "out.npy").string());
  if (fs::exists(out, ec) && !force)
    throw sdk::UserError(out.string() + " already exists",
                         "pass --force to overwrite it, or choose another --out");
  check_parent(out);
}

void check_output_folder(const fs::path& out, const std::vector<std::string>& files,
                         const CommandInputs& inputs, bool force) {
  std::error_code ec;
  refuse_input_as_output("--out", out, inputs);
  for (const auto& file : files) refuse_input_as_output("--out", out / file, inputs);
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw sdk::UserError(out.string() + " is a file, but this output is a folder",
                         "give a folder name, e.g. --out " + out.string() + "-hf");
  if (fs::is_directory(out, ec) && !fs::is_empty(out, ec) && !force)
    throw sdk::UserError(out.string() + " already exists and is not empty",
                         "pass --force to replace the files this export writes there (others "
                         "stay), or choose another --out");
  // "dir/" names dir, whose parent must exist.
  check_parent(out.has_filename() ? out : out.parent_path());
}

}  // namespace mixtrain::cli
