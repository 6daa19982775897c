// Exceptions used across mixtrain.
//
// Contract: inside a component, failures are exceptions. `UserError` and its subclasses mean the
// user's input (config, data, checkpoint, plugin choice) is wrong: the CLI prints the message and
// exits with 2. Anything else is an internal error (exit 1). Every message says what went wrong,
// where, and — in `hint` — how to fix it.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mixtrain::sdk {

// Where a config value came from. line/column are 1-based; 0 means unknown.
struct SourceLocation {
  std::string file;
  std::uint32_t line = 0;
  std::uint32_t column = 0;
  std::string to_string() const;  // "file:line:col", or "file" / "<config>" when unknown
};

class MIXTRAIN_SDK_API UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& what, std::string hint = {});
  const std::string& hint() const noexcept { return hint_; }
  // The message followed by "\n  HINT: <hint>" when there is a hint.
  std::string full_message() const;

 private:
  std::string hint_;
};

// A config value is malformed: wrong type, out of range, unknown key, unknown choice.
class MIXTRAIN_SDK_API ConfigError : public UserError {
 public:
  ConfigError(const SourceLocation& where, const std::string& key, const std::string& what,
              std::string hint = {});
  const SourceLocation& where() const noexcept { return where_; }
  const std::string& key() const noexcept { return key_; }

 private:
  SourceLocation where_;
  std::string key_;
};

// A plugin could not be loaded, was not found, or failed inside a factory / call.
class MIXTRAIN_SDK_API PluginError : public UserError {
 public:
  using UserError::UserError;
};

// A data file is missing or malformed.
class MIXTRAIN_SDK_API DataError : public UserError {
 public:
  using UserError::UserError;
};

// A checkpoint is missing, truncated, corrupted or incompatible.
class MIXTRAIN_SDK_API CheckpointError : public UserError {
 public:
  using UserError::UserError;
};

// A request the chosen backend cannot serve (dtype, device, memory).
class MIXTRAIN_SDK_API BackendError : public UserError {
 public:
  using UserError::UserError;
};

}  // namespace mixtrain::sdk
