// Fuzzes the llm.c token file reader (core::load_token_file) and the windows cut from what it
// accepts (split_token_tail, gather_tokens). Input: one token file. The reader ignores header[3]
// onwards, so byte 12 picks the block size (1 + b % 32) and byte 13 the eval fraction
// ((b % 10) / 10) of the split. sdk::UserError (DataError) is an expected rejection; a window
// whose targets are not its inputs shifted by one is a finding (abort).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_support.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

namespace {

// Every window of `d`: targets[t] == ids[t + 1] inside it, and the window is where it should be.
void check_windows(const mixtrain::core::Dataset& d) {
  const auto block = static_cast<std::size_t>(d.features);
  std::vector<std::int32_t> ids(block), targets(block);
  for (std::int64_t r = 0; r < d.rows; ++r) {
    const std::int64_t row[] = {r};
    mixtrain::core::gather_tokens(d, row, ids.data(), targets.data());
    const auto start = static_cast<std::size_t>(r * d.stride);
    for (std::size_t t = 0; t < block; ++t)
      if (ids[t] != d.tokens[start + t] || targets[t] != d.tokens[start + t + 1]) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto file = mixtrain::fuzz::scratch_file("tokens.bin", mixtrain::fuzz::as_view(data, size));
  const std::int64_t block = size > 12 ? 1 + data[12] % 32 : 4;
  const double eval_fraction = size > 13 ? (data[13] % 10) / 10.0 : 0.0;
  try {
    auto tokens = mixtrain::core::load_token_file(file, 50257);
    auto [train, eval] =
        mixtrain::core::split_token_tail(std::move(tokens), block, 50257, eval_fraction, "fuzz");
    check_windows(train);
    check_windows(eval);
  } catch (const mixtrain::sdk::UserError&) {
  }
  return 0;
}
