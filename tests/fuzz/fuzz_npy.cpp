// Fuzzes the .npy loader (core::load_npy). Input: the features file, then optionally the line
// "--labels--\n" and the labels file; without it the same bytes serve as both, which still
// reaches the label-dtype checks. sdk::UserError (DataError) is an expected rejection.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = mixtrain::fuzz::split_at(mixtrain::fuzz::as_view(data, size), "--labels--\n");
  const auto x = mixtrain::fuzz::scratch_file("x.npy", parts.first);
  const auto y = mixtrain::fuzz::scratch_file("y.npy", parts.found ? parts.second : parts.first);
  try {
    (void)mixtrain::core::load_npy(x, y);
  } catch (const mixtrain::sdk::UserError&) {
  }
  return 0;
}
