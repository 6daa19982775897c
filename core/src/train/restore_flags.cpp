#include "train/restore_flags.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <string_view>

#include "mixtrain/core/console/shell_word.h"

namespace mixtrain::core {

namespace {

// "model.layers[1].type" as --set addresses it: "model.layers.1.type".
std::string set_key(std::string key) {
  std::string out;
  for (const char c : key) {
    if (c == '[')
      out += '.';
    else if (c != ']')
      out += c;
  }
  return out;
}

// A TOML string value without its quotes when --set would read the bare text as that same
// string: a name (letters, digits, "_.-/", not starting with a digit or a sign) that TOML does
// not read as a value of its own (true, inf, nan).
std::string set_value(const std::string& value) {
  if (value.size() < 3 || value.front() != '"' || value.back() != '"') return value;
  const std::string bare = value.substr(1, value.size() - 2);
  if (!std::isalpha(static_cast<unsigned char>(bare.front()))) return value;
  const bool name = std::all_of(bare.begin(), bare.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || std::strchr("_.-/", c) != nullptr;
  });
  constexpr std::array<std::string_view, 4> kTomlWords = {"true", "false", "inf", "nan"};
  if (!name || std::find(kTomlWords.begin(), kTomlWords.end(), bare) != kTomlWords.end())
    return value;
  return bare;
}

}  // namespace

std::string restore_flags(const std::vector<std::string>& changes) {
  std::string out;
  for (const auto& change : changes) {
    const auto eq = change.find(" = ");
    const auto arrow = eq == std::string::npos ? eq : change.find(" -> ", eq + 3);
    if (arrow == std::string::npos) continue;
    const std::string old = change.substr(eq + 3, arrow - eq - 3);
    if (old == "(none)" || old.empty()) continue;
    out += (out.empty() ? "" : " ") + std::string("--set ") +
           shell_word(set_key(change.substr(0, eq)) + "=" + set_value(old));
  }
  return out;
}

}  // namespace mixtrain::core
