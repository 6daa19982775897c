// In-memory classification datasets: synthetic generators, .npy / IDX loaders, held-out split.
//
// Contract:
// - A Dataset lives in host memory and owns its data. x is row-major float32 [rows, features],
//   y is int32 [rows] with every label in [0, classes). Every Dataset returned below passes
//   check_dataset() (rows > 0, features > 0, sizes consistent, labels in range, every feature
//   finite) — except the deliberately empty eval set of split_holdout(all, 0, seed).
// - Malformed input (missing / unreadable / truncated file, bad magic or header, unsupported
//   dtype or rank, mismatched row counts, bad labels, non-finite features, bad spec values)
//   throws sdk::DataError whose message names the file (or the spec field), says what was
//   expected and what was found, and whose hint says how to fix it. Loaders never read past the
//   end of a file and never allocate more than the file can hold.
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

struct Dataset {
  std::int64_t rows = 0, features = 0;
  std::int32_t classes = 0;      // labels are in [0, classes)
  std::vector<float> x;          // [rows, features], row-major
  std::vector<std::int32_t> y;   // [rows]
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
  double uniform();                    // [0, 1), 53 random bits
  std::uint64_t below(std::uint64_t n);  // uniform in [0, n), unbiased; n > 0
  double normal();                     // N(0, 1) by Box–Muller with portable log / sin / cos

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
  double noise = 1.0;              // clusters: standard deviation around the centres
  double separation = 4.0;         // clusters: distance of each centre from the origin
  std::int64_t teacher_hidden = 64;  // teacher: hidden width
  double label_noise = 0.0;        // both: probability a label is replaced by a uniform class
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
// is outside [0, 1) or no training row would remain.
std::pair<Dataset, Dataset> split_holdout(Dataset all, double eval_fraction, std::uint64_t seed);

// Copies the given rows into x_out [rows.size(), features] and y_out [rows.size()] (y_out may
// be null). Throws std::out_of_range on an index outside [0, data.rows) — a caller bug.
void gather_batch(const Dataset& data, std::span<const std::int64_t> rows, float* x_out,
                  std::int32_t* y_out);

}  // namespace mixtrain::core
