// A save_pretrained folder's config file; see checkpoint/saved_folder.h for the contract.
#include "checkpoint/saved_folder.h"

#include <fstream>
#include <sstream>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

std::string read_saved_folder_config(const std::filesystem::path& folder,
                                     std::string_view config_file, const std::string& folder_hint,
                                     const std::string& config_hint) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw sdk::UserError(
        folder.string() + (fs::exists(folder, ec) ? " is not a folder" : " does not exist"),
        folder_hint);
  const fs::path file = folder / config_file;
  if (!fs::is_regular_file(file, ec))
    throw sdk::UserError(folder.string() + " has no " + std::string(config_file), config_hint);
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw sdk::UserError("cannot read " + file.string(), "check its permissions");
  return text.str();
}

}  // namespace mixtrain::core
