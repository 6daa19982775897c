// Fuzzes the IDX loader (core::load_idx), plain and gzip-compressed (the loader recognises gzip by
// its magic bytes, so gzip seeds reach the decompressing path). Input: the images file, then
// optionally "--labels--\n" and the labels file; without it the same bytes serve as both.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = mixtrain::fuzz::split_at(mixtrain::fuzz::as_view(data, size), "--labels--\n");
  const auto x = mixtrain::fuzz::scratch_file("images.idx", parts.first);
  const auto y =
      mixtrain::fuzz::scratch_file("labels.idx", parts.found ? parts.second : parts.first);
  try {
    (void)mixtrain::core::load_idx(x, y);
  } catch (const mixtrain::sdk::UserError&) {
  }
  return 0;
}
