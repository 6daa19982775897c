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

std::string later_errors(const std::vector<sdk::ConfigError>& errors,
                         const std::vector<std::string>& others) {
  if (errors.empty() || errors.size() + others.size() < 2)
    throw std::invalid_argument("ConfigErrors: " + std::to_string(errors.size()) +
                                " config errors and " + std::to_string(others.size()) +
                                " others; one error is thrown as itself");
  const auto& first = errors.front();
  std::string text = message_of(first);
  for (std::size_t i = 1; i <= errors.size(); ++i) {
    // The previous error's hint, unless it is the last line of all (hint() carries that one).
    const bool last = i == errors.size() && others.empty();
    if (!last && !errors[i - 1].hint().empty()) text += "\n  HINT: " + errors[i - 1].hint();
    if (i < errors.size()) text += "\nerror: " + std::string(errors[i].what());
  }
  for (const auto& other : others) text += "\nerror: " + other;
  return text;
}

}  // namespace

ConfigErrors::ConfigErrors(std::vector<sdk::ConfigError> errors,
                           const std::vector<std::string>& others)
    : sdk::ConfigError(errors.empty() ? sdk::SourceLocation{} : errors.front().where(),
                       errors.empty() ? std::string() : errors.front().key(),
                       later_errors(errors, others),
                       errors.empty() || !others.empty() ? std::string() : errors.back().hint()),
      errors_(std::move(errors)),
      others_(others) {}

}  // namespace mixtrain::core
