// An internal error of a plugin (an exception that is no sdk::UserError), met where the host can
// say what it interrupted and what is left to continue from: a checkpoint format's write() that
// threw a std::runtime_error in the middle of a run. Not the user's to fix, so the command still
// exits 1 as for any internal error, but with the message and hint a UserError would have.
#pragma once

#include <stdexcept>
#include <string>

namespace mixtrain::core {

class PluginFault : public std::runtime_error {
 public:
  PluginFault(const std::string& what, std::string hint)
      : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const noexcept { return hint_; }
  // The message followed by "\n  HINT: <hint>", as sdk::UserError::full_message().
  std::string full_message() const {
    return hint_.empty() ? std::string(what()) : std::string(what()) + "\n  HINT: " + hint_;
  }

 private:
  std::string hint_;
};

}  // namespace mixtrain::core
