// In-memory datasets: classification tables (synthetic generators, .npy / IDX loaders, seeded
// held-out split) and token streams for language models (llm.c token files, byte-level text,
// tail split), and load_train_and_eval() that builds both splits from a [data] section.
//
// Contract:
// - A Dataset lives in host memory and owns its data, in one of two forms:
//   table: x is row-major float32 [rows, features], y is int32 [rows] with every label in
//     [0, classes); tokens empty, stride 0.
//   token: stride > 0, x and y empty, `tokens` int32 in [0, classes) (classes = vocabulary V),
//     features = block size T. Row r is the window tokens[r·stride, r·stride + T + 1): its
//     inputs are the first T tokens, its targets (next-token labels) the last T, so
//     rows = (tokens.size() − T − 1) / stride + 1.
//   Every Dataset returned below passes check_dataset() (rows > 0, features > 0, sizes
//   consistent, labels / tokens in range, every feature finite) — except a deliberately empty
//   eval set (eval_fraction 0 and no eval file), which has rows = 0 but keeps the form, features
//   and classes of its training set.
// - Malformed input (missing / unreadable / truncated file, bad magic or header, unsupported
//   dtype or rank, mismatched row counts, bad labels or tokens, non-finite features, too few
//   tokens for one window, bad spec values) throws sdk::DataError whose message names the file
//   (or the spec field) and, for file contents, the byte offset; says what was expected and what
//   was found; and whose hint says how to fix it. Loaders never read past the end of a file and
//   never allocate more than the file can hold.
// - Everything seeded is bit-identical for a given seed on any IEEE-754 machine and compiler:
//   DataRng and the generators use only integer ops and correctly rounded +,-,*,/,sqrt (no libm,
//   no <random> distributions, whose output differs between standard libraries).
// - Functions are thread-compatible: distinct objects may be used from distinct threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mixtrain::core {

struct DataSettings;  // experiment.h: the [data] section

struct Dataset {
  std::int64_t rows = 0, features = 0;  // token form: features = block size T
  std::int32_t classes = 0;             // labels (tokens) are in [0, classes)
  std::vector<float> x;                 // table: [rows, features], row-major
  std::vector<std::int32_t> y;          // table: [rows]
  std::vector<std::int32_t> tokens;     // token form: the stream the windows are cut from
  std::int64_t stride = 0;              // token form: > 0, tokens between window starts

  bool is_tokens() const { return stride > 0; }
  // Labels one row holds: 1 (its class) for a table, T (one next token per position) for tokens.
  std::int64_t labels_per_row() const { return is_tokens() ? features : 1; }
};

// Throws sdk::DataError (naming `origin`, e.g. a file or "synthetic data") unless `data` keeps
// the Dataset contract above.
void check_dataset(const Dataset& data, std::string_view origin);

// ---- seeded randomness ----------------------------------------------------------------------

// xoshiro256** whose state is filled by splitmix64 from (seed, stream). The algorithms are part
// of the contract: changing them changes every seeded dataset and shuffle order. Distinct
// streams of one seed are independent sequences (used so that, e.g., asking for more rows does
// not move the class centres).
class DataRng {
 public:
  explicit DataRng(std::uint64_t seed, std::uint64_t stream = 0);
  std::uint64_t next_u64();
  double uniform();                      // [0, 1), 53 random bits
  std::uint64_t below(std::uint64_t n);  // uniform in [0, n), unbiased; n > 0
  double normal();                       // N(0, 1) by Box–Muller with portable log / sin / cos

 private:
  std::uint64_t state_[4];
  double spare_normal_ = 0.0;
  bool has_spare_normal_ = false;
};

// Fisher–Yates with rng.below(): the same permutation for the same rng state everywhere.
void seeded_shuffle(std::span<std::int64_t> values, DataRng& rng);

// ---- synthetic data -------------------------------------------------------------------------

struct SyntheticSpec {
  // "clusters": class c has a centre at distance `separation` from the origin in a random
  //   direction; a point is centre + noise·N(0, I). Defaults are > 90% learnable (~98%).
  // "teacher": x ~ N(0, I); y = argmax of a fixed random teacher MLP
  //   (features → teacher_hidden ReLU → classes, logits centred per class) applied to x.
  std::string kind = "clusters";
  std::int64_t rows = 8192, features = 32;
  std::int32_t classes = 10;
  std::uint64_t seed = 0;
  double noise = 1.0;                // clusters: standard deviation around the centres
  double separation = 4.0;           // clusters: distance of each centre from the origin
  std::int64_t teacher_hidden = 64;  // teacher: hidden width
  double label_noise = 0.0;          // both: probability a label is replaced by a uniform class
};

// Throws sdk::DataError on an unknown kind or out-of-range field.
Dataset make_synthetic(const SyntheticSpec& spec);

// ---- files ----------------------------------------------------------------------------------

// NumPy .npy (format 1.0 / 2.0 / 3.0, little-endian, C order). Features: float32 or float64
// (converted), shape [N, D] or [N, d1, d2, ...] (flattened to D = d1·d2·…). Labels: any
// integer dtype of 1, 2, 4 or 8 bytes, shape [N] or [N, 1]. `classes` = 0 infers max label + 1;
// otherwise every label must be below it.
Dataset load_npy(const std::filesystem::path& features, const std::filesystem::path& labels,
                 std::int32_t classes = 0);

// MNIST IDX: images u8 [N, H, W] (magic 0x00000803; [N, D] and [N, H, W, C] are accepted too)
// become N rows of H·W features scaled to [0, 1]; labels u8 [N] (magic 0x00000801). `classes` as
// for load_npy. A gzip-compressed file (recognised by its magic bytes 1f 8b, whatever its name)
// is decompressed while read, never beyond the data size its IDX header declares.
Dataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels,
                 std::int32_t classes = 0);

// ---- splitting and batching -----------------------------------------------------------------

// (train, eval): rows are shuffled with DataRng(seed) before round(rows·eval_fraction) of them
// (at least one when eval_fraction > 0) go to eval. eval_fraction = 0 gives an empty eval set
// (rows = 0). Both keep all.classes and all.features. Throws sdk::DataError when eval_fraction
// is outside [0, 1) or no training row would remain, std::logic_error for a token dataset (its
// windows overlap, so a shuffled split would leak text into evaluation: split_token_tail).
std::pair<Dataset, Dataset> split_holdout(Dataset all, double eval_fraction, std::uint64_t seed);

// Copies the given rows of a table dataset into x_out [rows.size(), features] and y_out
// [rows.size()] (y_out may be null). Throws std::out_of_range on an index outside [0, data.rows)
// and std::logic_error on a token dataset (use gather_tokens) — caller bugs.
void gather_batch(const Dataset& data, std::span<const std::int64_t> rows, float* x_out,
                  std::int32_t* y_out);

// ---- token data (language models) -----------------------------------------------------------

// llm.c token file (dev/data/data_common.py): a header of 256 little-endian int32 — header[0] =
// 20240520 (magic), header[1] = 1 (version: uint16 tokens), header[2] = N tokens — then exactly
// N little-endian uint16 tokens. Returns them as int32; each must be below vocab_size (GPT-2's
// files: 50257). Errors name the file and the byte offset of what is wrong: bad magic or
// version, a negative count, a file shorter than its header or than the count says (or longer),
// a token >= vocab_size (its value, index and offset).
std::vector<std::int32_t> load_token_file(const std::filesystem::path& file,
                                          std::int32_t vocab_size);

// Byte-level tokens (vocabulary 256): every byte of `files`, one file after another, as a token
// in [0, 256). An empty file (or an empty list) is a DataError.
std::vector<std::int32_t> load_text_tokens(std::span<const std::filesystem::path> files);

// The token dataset of windows of block_size + 1 tokens every `stride` tokens (see Dataset).
// Throws sdk::DataError naming `origin` when the stream holds fewer than block_size + 1 tokens
// (both numbers in the message) or a token outside [0, vocab_size); std::invalid_argument on
// block_size, vocab_size or stride < 1.
Dataset make_token_dataset(std::vector<std::int32_t> tokens, std::int64_t block_size,
                           std::int32_t vocab_size, std::int64_t stride, std::string_view origin);

// (train, eval) from one stream, never shuffled (overlapping windows would leak between the
// splits): eval is the tail, round(N·eval_fraction) tokens, cut into non-overlapping windows
// (stride block_size: each held-out token is predicted at most once); train is the rest, a window
// at every start (stride 1). eval_fraction = 0 gives an empty eval set. Throws sdk::DataError,
// naming `origin` and the numbers, when eval_fraction is outside [0, 1), when the tail holds
// fewer than block_size + 1 tokens although eval_fraction > 0, or when the rest does.
std::pair<Dataset, Dataset> split_token_tail(std::vector<std::int32_t> tokens,
                                             std::int64_t block_size, std::int32_t vocab_size,
                                             double eval_fraction, std::string_view origin);

// Copies the windows `rows` of a token dataset: ids_out [rows.size(), T] gets each window's
// first T tokens, targets_out [rows.size(), T] its last T (the next token at every position;
// may be null). Throws std::out_of_range on an index outside [0, data.rows) and
// std::logic_error on a table dataset (use gather_batch) — caller bugs.
void gather_tokens(const Dataset& data, std::span<const std::int64_t> rows, std::int32_t* ids_out,
                   std::int32_t* targets_out);

// ---- from the config ------------------------------------------------------------------------

// The (train, eval) datasets a [data] section describes. Tables (synthetic, npy, idx): loaded,
// classes raised to settings.classes when that is larger, then split_holdout(…, seed). Tokens
// (tokens: an llm.c file; text: bytes of one or more files): the training stream with a window
// at every start; eval from the eval file(s) in non-overlapping windows when given, else the
// stream's tail (split_token_tail; eval_fraction). `seed` only matters for tables.
std::pair<Dataset, Dataset> load_train_and_eval(const DataSettings& settings, std::uint64_t seed);

}  // namespace mixtrain::core
