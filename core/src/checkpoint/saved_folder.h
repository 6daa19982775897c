// A folder a Python library's save_pretrained wrote (a Hugging Face model's, a PEFT adapter's):
// the text of the JSON config file it holds beside its weights. Internal to the core.
//
// Contract
// - read_saved_folder_config() returns <folder>/<config_file>'s text. sdk::UserError naming the
//   path: `folder` is not a folder or does not exist (hint `folder_hint`), it holds no
//   `config_file` (hint `config_hint`), or the file cannot be read.
// - parse_saved_config() is that text as JSON: sdk::ConfigError at `at` (hint `hint`) when it is
//   not JSON (a number no double holds included) or nests deeper than kMaxSavedConfigDepth. A
//   config file nests a few levels; a hostile one deep enough to overflow the recursive copies
//   and printers of nlohmann's values (ordered_json copies its entries when it grows).
// - json_shown() is a value of such a file as a message quotes it: a scalar, or a list or object
//   of scalars, as JSON; a deeper one by its kind and size. (dump() recurses into nesting, and a
//   hostile file nests deep enough to overflow the stack.)
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

std::string read_saved_folder_config(const std::filesystem::path& folder,
                                     std::string_view config_file, const std::string& folder_hint,
                                     const std::string& config_hint);

inline constexpr int kMaxSavedConfigDepth = 32;

template <typename BasicJson>
BasicJson parse_saved_config(std::string_view text, const sdk::SourceLocation& at,
                             const std::string& hint) {
  struct TooDeep {};
  try {
    return BasicJson::parse(text, [](int depth, typename BasicJson::parse_event_t, BasicJson&) {
      if (depth > kMaxSavedConfigDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    throw sdk::ConfigError(
        at, "",
        "not a config: it nests deeper than " + std::to_string(kMaxSavedConfigDepth) + " levels",
        hint);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range: 1e999
    throw sdk::ConfigError(at, "", std::string("not valid JSON: ") + e.what(), hint);
  }
}

// Either JSON type (nlohmann::json or ordered_json): converting one to the other copies the whole
// value, recursively.
template <typename BasicJson>
std::string json_shown(const BasicJson& value) {
  if (!value.is_structured()) return value.dump();
  for (const auto& element : value)
    if (element.is_structured())
      return std::string(value.is_array() ? "a nested list" : "a nested object") + " of " +
             std::to_string(value.size()) + (value.size() == 1 ? " entry" : " entries");
  return value.dump();
}

}  // namespace mixtrain::core
