// The message of the sdk::BackendError a call throws, for tests of the backends' argument checks,
// which compare messages piece by piece.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "mixtrain/sdk/error.h"

namespace mixtrain::test {

// The what() of the BackendError `f` throws, or "(no error)" when it throws none.
template <class F>
std::string backend_error_of(F&& f) {
  try {
    f();
  } catch (const sdk::BackendError& e) {
    return e.what();
  }
  return "(no error)";
}

// What is off in an argument check's message: empty when `message` starts with `prefix`
// ("backend_test.decode_images: ") and mentions each of `parts`, else the first miss and the
// message.
inline std::string message_mismatch(const std::string& message, std::string_view prefix,
                                    std::initializer_list<const char*> parts) {
  if (message.rfind(prefix, 0) != 0)
    return "does not start with \"" + std::string(prefix) + "\": " + message;
  for (const char* part : parts)
    if (message.find(part) == std::string::npos)
      return "does not mention \"" + std::string(part) + "\": " + message;
  return {};
}

}  // namespace mixtrain::test
