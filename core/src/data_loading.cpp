// load_train_and_eval: the [data] section's source turned into the training and held-out sets.
#include <algorithm>
#include <string>
#include <utility>

#include "mixtrain/core/dataset.h"
#include "mixtrain/core/experiment.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

// "token file 'a.bin'", "text 'a.txt' + 2 more files": how messages name a stream.
std::string stream_origin(const std::string& kind,
                          const std::vector<std::filesystem::path>& files) {
  std::string out = kind + " '" + (files.empty() ? std::string() : files.front().string()) + "'";
  if (files.size() > 1) out += " + " + std::to_string(files.size() - 1) + " more files";
  return out;
}

std::vector<std::int32_t> read_stream(const DataSettings& settings,
                                      const std::vector<std::filesystem::path>& files) {
  if (settings.source == "text") return load_text_tokens(files);
  if (files.size() != 1)
    throw sdk::DataError(
        "token data: expected one llm.c token file, got " + std::to_string(files.size()),
        "set data.train (and optionally data.eval) to one .bin file each");
  return load_token_file(files.front(), settings.vocab_size);
}

std::pair<Dataset, Dataset> load_token_splits(const DataSettings& settings) {
  const std::string kind = settings.source == "text" ? "text" : "token file";
  const auto T = settings.block_size;
  const auto V = settings.vocab_size;
  auto stream = read_stream(settings, settings.token_paths);
  const auto origin = stream_origin(kind, settings.token_paths);
  if (settings.eval_token_paths.empty())
    return split_token_tail(std::move(stream), T, V, settings.eval_fraction, origin);
  // A separate held-out stream: the whole training stream trains, eval_fraction is unused.
  Dataset train = make_token_dataset(std::move(stream), T, V, 1, origin);
  Dataset eval = make_token_dataset(read_stream(settings, settings.eval_token_paths), T, V, T,
                                    stream_origin(kind, settings.eval_token_paths));
  return {std::move(train), std::move(eval)};
}

}  // namespace

std::pair<Dataset, Dataset> load_train_and_eval(const DataSettings& settings, std::uint64_t seed) {
  if (settings.source == "tokens" || settings.source == "text") return load_token_splits(settings);
  Dataset all;
  if (settings.source == "synthetic") {
    all = make_synthetic(settings.synthetic);
  } else if (settings.source == "npy") {
    all = load_npy(settings.features_path, settings.labels_path, settings.classes);
  } else if (settings.source == "idx") {
    all = load_idx(settings.images_path, settings.labels_path, settings.classes);
  } else {
    throw sdk::DataError("unknown data source '" + settings.source + "'",
                         "use one of: synthetic, npy, idx, tokens, text");
  }
  if (settings.classes > 0) all.classes = std::max(all.classes, settings.classes);
  return split_holdout(std::move(all), settings.eval_fraction, seed);
}

}  // namespace mixtrain::core
