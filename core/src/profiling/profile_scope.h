// ProfileScope: names what the calling thread is doing (a model node's type, "optimizer", ...)
// for ProfilingBackend, which files every backend op under the innermost open scope. Opening one
// is a pointer store, so the model and trainer open them whether or not anything profiles.
// The name must outlive the scope (string literals, or a node's type held by the model).
#pragma once

namespace mixtrain::core {

class ProfileScope {
 public:
  explicit ProfileScope(const char* name) noexcept : previous_(current_) { current_ = name; }
  ~ProfileScope() { current_ = previous_; }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

  static const char* current() noexcept { return current_ ? current_ : "other"; }

 private:
  const char* previous_;
  static thread_local const char* current_;
};

}  // namespace mixtrain::core
