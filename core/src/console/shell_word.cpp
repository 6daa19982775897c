// console/shell_word.h
#include "mixtrain/core/console/shell_word.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace mixtrain::core {

std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || std::strchr("_./=:,+-@%", c) != nullptr;
  });
  if (plain) return word;
  std::string quoted = "'";
  for (const char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace mixtrain::core
