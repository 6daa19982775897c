// ProfileScope: names what the calling thread is doing (a model node's type, "optimizer", ...)
// for ProfilingBackend, which files every backend op under the innermost open scope, and, inside a
// model node's scope, under that node's name too (its per-node table). Opening one is two pointer
// stores, so the model and trainer open them whether or not anything profiles. Both names must
// outlive the scope (string literals, or a node's type and name held by the model); a scope opened
// without a node keeps the enclosing one's.
#pragma once

namespace mixtrain::core {

class ProfileScope {
 public:
  explicit ProfileScope(const char* name, const char* node = nullptr) noexcept
      : previous_(current_), previous_node_(node_) {
    current_ = name;
    if (node != nullptr) node_ = node;
  }
  ~ProfileScope() {
    current_ = previous_;
    node_ = previous_node_;
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

  static const char* current() noexcept { return current_ ? current_ : "other"; }
  // The model node whose op is running, or nullptr outside any.
  static const char* node() noexcept { return node_; }

 private:
  const char *previous_, *previous_node_;
  static thread_local const char* current_;
  static thread_local const char* node_;
};

}  // namespace mixtrain::core
