#include "mixtrain/core/config/config_errors.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace mixtrain::core {

namespace {

// What sdk::ConfigError's constructor was given: its what() less the "where: 'key': " it adds.
std::string message_of(const sdk::ConfigError& e) {
  const std::string prefix =
      e.where().to_string() + ": " + (e.key().empty() ? "" : "'" + e.key() + "': ");
  const std::string what = e.what();
  return what.starts_with(prefix) ? what.substr(prefix.size()) : what;
}

std::string later_errors(const std::vector<sdk::ConfigError>& errors) {
  if (errors.size() < 2)
    throw std::invalid_argument("ConfigErrors: " + std::to_string(errors.size()) +
                                " errors; one is thrown as itself");
  const auto& first = errors.front();
  std::string text = message_of(first);
  if (!first.hint().empty()) text += "\n  HINT: " + first.hint();
  for (std::size_t i = 1; i < errors.size(); ++i) {
    text += "\nerror: ";
    text += errors[i].what();
    if (i + 1 < errors.size() && !errors[i].hint().empty()) text += "\n  HINT: " + errors[i].hint();
  }
  return text;
}

}  // namespace

ConfigErrors::ConfigErrors(std::vector<sdk::ConfigError> errors)
    : sdk::ConfigError(errors.empty() ? sdk::SourceLocation{} : errors.front().where(),
                       errors.empty() ? std::string() : errors.front().key(), later_errors(errors),
                       errors.empty() ? std::string() : errors.back().hint()),
      errors_(std::move(errors)) {}

}  // namespace mixtrain::core
