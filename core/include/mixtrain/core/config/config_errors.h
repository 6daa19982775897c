// Several mistakes of one config reported together: parse_experiment() reads every section it can
// and throws them all at once, so a user fixes a config in one round, not one error per attempt.
//
// Contract
// - ConfigErrors is an sdk::ConfigError: where(), key() and the first line of what() are the first
//   error's, so a caller that handles one ConfigError handles it. what() then carries each later
//   error as the CLI prints an error ("\nerror: <message>\n  HINT: <hint>"), the last one's hint
//   being hint(), so full_message() reads as the errors printed one after another.
// - errors(): every ConfigError, in the order the sections were read. `others` are the full
//   messages of other mistakes of the sections (a component no plugin offers: a PluginError),
//   printed after them; the last hint is then the last ConfigError's when it is not in one.
// - The constructor takes one or more ConfigErrors and two or more errors in all
//   (std::invalid_argument otherwise: one error is thrown as itself).
#pragma once

#include <string>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

class ConfigErrors : public sdk::ConfigError {
 public:
  explicit ConfigErrors(std::vector<sdk::ConfigError> errors,
                        const std::vector<std::string>& others = {});
  const std::vector<sdk::ConfigError>& errors() const noexcept { return errors_; }
  const std::vector<std::string>& others() const noexcept { return others_; }

 private:
  std::vector<sdk::ConfigError> errors_;
  std::vector<std::string> others_;
};

}  // namespace mixtrain::core
