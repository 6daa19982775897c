// ScopedEnv: sets an environment variable for the rest of a scope (the programs a test starts
// inherit it), or removes it when the value is nullptr, and restores the previous value, or its
// absence, when the scope ends. Not thread-safe: setenv never is, so use it only on a test's own
// thread before it starts other threads or processes. Not copyable.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace mixtrain::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace mixtrain::test
