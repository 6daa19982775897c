#include "output_file.h"

#include <string>
#include <system_error>

#include "mixtrain/sdk/error.h"

namespace mixtrain::cli {

namespace fs = std::filesystem;

void check_output_file(const fs::path& out, const fs::path& input, bool force) {
  std::error_code ec;
  if (fs::equivalent(out, input, ec))
    throw sdk::UserError(out.string() + " is the input " + input.string(),
                         "write to another file with --out");
  if (fs::is_directory(out, ec))
    throw sdk::UserError(out.string() + " is a folder",
                         "give a file name, e.g. --out " + (out / "out.npy").string());
  if (fs::exists(out, ec) && !force)
    throw sdk::UserError(out.string() + " already exists",
                         "pass --force to overwrite it, or choose another --out");
  const fs::path folder = out.parent_path();
  if (!folder.empty() && !fs::is_directory(folder, ec))
    throw sdk::UserError(
        "the folder of " + out.string() + ", " + folder.string() +
            (fs::exists(folder, ec) ? ", is not a folder" : ", does not exist"),
        "create it first (mkdir -p " + folder.string() + "), or choose another --out");
}

}  // namespace mixtrain::cli
