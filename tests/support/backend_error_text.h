// The message of the sdk::BackendError a call throws, for tests of the backends' argument checks,
// which compare messages piece by piece.
#pragma once

#include <string>

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

}  // namespace mixtrain::test
