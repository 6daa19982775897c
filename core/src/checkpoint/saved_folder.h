// A folder a Python library's save_pretrained wrote (a Hugging Face model's, a PEFT adapter's):
// the text of the JSON config file it holds beside its weights. Internal to the core.
//
// Contract
// - read_saved_folder_config() returns <folder>/<config_file>'s text. sdk::UserError naming the
//   path: `folder` is not a folder or does not exist (hint `folder_hint`), it holds no
//   `config_file` (hint `config_hint`), or the file cannot be read.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace mixtrain::core {

std::string read_saved_folder_config(const std::filesystem::path& folder,
                                     std::string_view config_file, const std::string& folder_hint,
                                     const std::string& config_hint);

}  // namespace mixtrain::core
