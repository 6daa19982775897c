#include "mixtrain/sdk/error.h"

namespace mixtrain::sdk {

std::string SourceLocation::to_string() const {
  std::string f = file.empty() ? "<config>" : file;
  if (line == 0) return f;
  return f + ":" + std::to_string(line) + ":" + std::to_string(column);
}

UserError::UserError(const std::string& what, std::string hint)
    : std::runtime_error(what), hint_(std::move(hint)) {}

std::string UserError::full_message() const {
  std::string m = what();
  if (!hint_.empty()) m += "\n  HINT: " + hint_;
  return m;
}

ConfigError::ConfigError(const SourceLocation& where, const std::string& key,
                         const std::string& what, std::string hint)
    : UserError(where.to_string() + ": " + (key.empty() ? "" : "'" + key + "': ") + what,
                std::move(hint)),
      where_(where),
      key_(key) {}

}  // namespace mixtrain::sdk
