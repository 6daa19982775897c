// Token datasets: windows of block_size + 1 tokens cut from one stream, the tail split that keeps
// overlapping windows out of evaluation, and the gather that copies windows into a batch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

// Block sizes past int32 cannot run (GEMM dimensions and ids are 32-bit), and this bound keeps
// block_size + 1 and rows·T far from overflowing.
constexpr std::int64_t kMaxBlockSize = std::numeric_limits<std::int32_t>::max();

void require_window_arguments(std::int64_t block_size, std::int32_t vocab_size,
                              std::int64_t stride) {
  if (block_size < 1 || block_size > kMaxBlockSize || vocab_size < 1 || stride < 1)
    throw std::invalid_argument("token windows need 1 <= block_size < 2^31 (got " +
                                std::to_string(block_size) + "), vocab_size >= 1 (got " +
                                std::to_string(vocab_size) + ") and stride >= 1 (got " +
                                std::to_string(stride) + ")");
}

std::string window_count_hint(std::int64_t block_size) {
  return "one window is block_size + 1 = " + std::to_string(block_size + 1) +
         " tokens; lower data.block_size or give more text";
}

}  // namespace

Dataset make_token_dataset(std::vector<std::int32_t> tokens, std::int64_t block_size,
                           std::int32_t vocab_size, std::int64_t stride, std::string_view origin) {
  require_window_arguments(block_size, vocab_size, stride);
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n <= block_size)
    throw sdk::DataError(std::string(origin) + ": holds " + std::to_string(n) +
                             " tokens, fewer than the block_size + 1 = " +
                             std::to_string(block_size + 1) + " one window needs",
                         window_count_hint(block_size));
  Dataset d;
  d.features = block_size;
  d.classes = vocab_size;
  d.stride = stride;
  d.rows = (n - block_size - 1) / stride + 1;
  d.tokens = std::move(tokens);
  check_dataset(d, origin);  // every token below vocab_size, with its index
  return d;
}

Dataset token_data_shape(std::int64_t block_size, std::int32_t vocab_size) {
  require_window_arguments(block_size, vocab_size, 1);
  Dataset d;
  d.features = block_size;
  d.classes = vocab_size;
  d.stride = 1;
  return d;
}

std::pair<Dataset, Dataset> split_token_tail(std::vector<std::int32_t> tokens,
                                             std::int64_t block_size, std::int32_t vocab_size,
                                             double eval_fraction, std::string_view origin) {
  require_window_arguments(block_size, vocab_size, 1);
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0))
    throw sdk::DataError(std::string(origin) + ": eval_fraction must be in [0, 1), found " +
                             std::to_string(eval_fraction),
                         "use e.g. 0.1 to hold out the last 10% of the tokens, or 0 for none");
  const auto n = static_cast<std::int64_t>(tokens.size());
  Dataset eval;
  eval.features = block_size;
  eval.classes = vocab_size;
  eval.stride = block_size;
  if (eval_fraction > 0.0) {
    const auto held =
        static_cast<std::int64_t>(std::llround(static_cast<double>(n) * eval_fraction));
    if (held <= block_size) {
      // A fraction that would leave a training window too is worth suggesting; otherwise the
      // stream is too short to split at all (an empty file: no fraction helps).
      // Rounded up at its third digit: a fraction printed rounded down could fall short again.
      const double exact = static_cast<double>(block_size + 1) / static_cast<double>(n);
      const double digits = std::pow(10.0, 2.0 - std::floor(std::log10(exact)));
      char needed[32];
      std::snprintf(needed, sizeof needed, "%.3g", std::ceil(exact * digits) / digits);
      const bool splittable = n >= 2 * (block_size + 1);
      char fraction[32];  // as written: 0.1, not std::to_string's 0.100000
      std::snprintf(fraction, sizeof fraction, "%g", eval_fraction);
      throw sdk::DataError(
          std::string(origin) + ": the held-out tail (eval_fraction " + fraction + " of " +
              std::to_string(n) + " tokens) holds " + std::to_string(held) +
              " tokens, fewer than the block_size + 1 = " + std::to_string(block_size + 1) +
              " one evaluation window needs",
          (splittable ? "raise data.eval_fraction to at least " + std::string(needed) + ", "
                      : "the " + std::to_string(n) + " tokens cannot hold a training and an " +
                            "evaluation window of " + std::to_string(block_size + 1) +
                            " tokens each: give more data, ") +
              "give a separate eval file, lower data.block_size, or set eval_fraction = 0");
    }
    const auto train_tokens = n - held;
    if (train_tokens <= block_size)
      throw sdk::DataError(std::string(origin) + ": after holding out the last " +
                               std::to_string(held) + " of " + std::to_string(n) +
                               " tokens for evaluation, " + std::to_string(train_tokens) +
                               " remain for training, fewer than the block_size + 1 = " +
                               std::to_string(block_size + 1) + " one window needs",
                           "lower data.eval_fraction or data.block_size, or give more text");
    std::vector<std::int32_t> tail(tokens.begin() + train_tokens, tokens.end());
    tokens.resize(static_cast<std::size_t>(train_tokens));
    tokens.shrink_to_fit();
    eval = make_token_dataset(std::move(tail), block_size, vocab_size, block_size,
                              std::string(origin) + " (held-out tail)");
  }
  Dataset train = make_token_dataset(std::move(tokens), block_size, vocab_size, 1, origin);
  return {std::move(train), std::move(eval)};
}

void gather_tokens(const Dataset& data, std::span<const std::int64_t> rows, std::int32_t* ids_out,
                   std::int32_t* targets_out) {
  if (!data.is_tokens())
    throw std::logic_error("gather_tokens: the dataset holds table rows; use gather_batch");
  const auto block = static_cast<std::size_t>(data.features);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int64_t row = rows[i];
    if (row < 0 || row >= data.rows)
      throw std::out_of_range("gather_tokens: row " + std::to_string(row) + " outside [0, " +
                              std::to_string(data.rows) + ")");
    // The window starts at row·stride; targets are the same window shifted by one token.
    const std::int32_t* window = data.tokens.data() + static_cast<std::size_t>(row * data.stride);
    std::memcpy(ids_out + i * block, window, block * sizeof(std::int32_t));
    if (targets_out != nullptr)
      std::memcpy(targets_out + i * block, window + 1, block * sizeof(std::int32_t));
  }
}

}  // namespace mixtrain::core
