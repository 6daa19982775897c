// Dataset checks, the portable PRNG, held-out split and batch gathering.
#include "mixtrain/core/data/dataset.h"

#include "data/byte_images.h"
#include "data/image_folder/image_batch.h"
#include "data/portable_math.h"
#include "mixtrain/sdk/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

// Bit-identical results need a*b+c rounded twice everywhere; clang would otherwise fuse it on
// targets with FMA (GCC already does not fuse in ISO mode, -std=c++20).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace mixtrain::core {
namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::uint64_t rotl(std::uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

// sin and cos of angle in [0, pi/4] by Taylor series (the error term is below 1e-19).
void small_sin_cos(double angle, double& sin_out, double& cos_out) {
  const double a2 = angle * angle;
  double sin_series = 0.0, cos_series = 0.0;
  // sin = a·Σ (-a²)^k / (2k+1)!, cos = Σ (-a²)^k / (2k)!, evaluated by Horner from k = 10.
  for (int k = 10; k >= 0; --k) {
    const double sin_den = static_cast<double>((2 * k + 2) * (2 * k + 3));
    const double cos_den = static_cast<double>((2 * k + 1) * (2 * k + 2));
    sin_series = 1.0 - a2 * sin_series / sin_den;
    cos_series = 1.0 - a2 * cos_series / cos_den;
  }
  sin_out = angle * sin_series;
  cos_out = cos_series;
}

// sin(2πu), cos(2πu) for u in [0, 1): reduce by quadrant and octant exactly (u is dyadic).
void sin_cos_turns(double u, double& sin_out, double& cos_out) {
  constexpr double kHalfPi = 1.57079632679489661923;
  const double quarter_turns = u * 4.0;  // exact
  const int quadrant = static_cast<int>(quarter_turns);
  const double frac = quarter_turns - static_cast<double>(quadrant);  // exact, [0, 1)
  double s = 0.0, c = 0.0;
  if (frac <= 0.5) {
    small_sin_cos(frac * kHalfPi, s, c);
  } else {
    small_sin_cos((1.0 - frac) * kHalfPi, c, s);  // sin(π/2 − φ) = cos φ
  }
  switch (quadrant & 3) {
    case 0:
      sin_out = s;
      cos_out = c;
      break;
    case 1:
      sin_out = c;
      cos_out = -s;
      break;
    case 2:
      sin_out = -s;
      cos_out = -c;
      break;
    default:
      sin_out = -c;
      cos_out = s;
      break;
  }
}

// [0, 1) from a draw's top 53 bits (DataRng::uniform's rule).
double unit_interval(std::uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Box–Muller from two draws as DataRng::normal() takes them: u1 in (0, 1] from the first, u2 in
// [0, 1) from the second; `first` = radius·cos (returned first), `second` = radius·sin (the
// spare). normal() and normals() share it, so their values are one definition.
void box_muller(std::uint64_t a, std::uint64_t b, double& first, double& second) {
  const double u1 = static_cast<double>((a >> 11) + 1) * 0x1.0p-53;  // (0, 1]
  const double radius = std::sqrt(-2.0 * portable_log(u1));          // sqrt is correctly rounded
  double s = 0.0, c = 0.0;
  sin_cos_turns(unit_interval(b), s, c);
  first = radius * c;
  second = radius * s;
}

[[noreturn]] void fail(std::string_view origin, const std::string& what, const std::string& hint) {
  throw sdk::DataError(std::string(origin) + ": " + what, hint);
}

}  // namespace

// ---- DataRng --------------------------------------------------------------------------------

DataRng::DataRng(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t sm = seed;
  // Mix the stream in through a second splitmix64 so (seed, stream) pairs do not alias.
  std::uint64_t stream_state = stream ^ 0xD1B54A32D192ED03ULL;
  sm ^= splitmix64(stream_state);
  for (auto& word : state_) word = splitmix64(sm);
}

std::uint64_t DataRng::next_u64() {
  const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const std::uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

double DataRng::uniform() {
  return unit_interval(next_u64());
}

std::uint64_t DataRng::below(std::uint64_t n) {
  if (n == 0) throw std::invalid_argument("DataRng::below(0)");
  // Reject the low 2^64 mod n values so every residue is equally likely.
  const std::uint64_t threshold = (0 - n) % n;
  for (;;) {
    const std::uint64_t r = next_u64();
    if (r >= threshold) return r % n;
  }
}

double DataRng::normal() {
  if (has_spare_normal_) {
    has_spare_normal_ = false;
    return spare_normal_;
  }
  const std::uint64_t a = next_u64();
  const std::uint64_t b = next_u64();
  double first = 0.0;
  box_muller(a, b, first, spare_normal_);
  has_spare_normal_ = true;
  return first;
}

void DataRng::normals(std::span<float> out, double scale, unsigned threads) {
  std::size_t i = 0;
  if (has_spare_normal_ && !out.empty()) {
    out[0] = static_cast<float>(scale * spare_normal_);
    has_spare_normal_ = false;
    i = 1;
  }
  // Pairs as normal() forms them (box_muller).
  const std::size_t pairs = (out.size() - i) / 2;
  constexpr std::size_t kChunk = std::size_t{1} << 18;  // pairs a round: 4 MiB of draws
  std::vector<std::uint64_t> draws(2 * std::min(pairs, kChunk));
  for (std::size_t p0 = 0; p0 < pairs; p0 += kChunk) {
    const std::size_t n = std::min(kChunk, pairs - p0);
    for (std::size_t k = 0; k < 2 * n; ++k) draws[k] = next_u64();
    float* dst = out.data() + i + 2 * p0;
    const auto transform = [&](std::size_t k0, std::size_t k1) {
      for (std::size_t k = k0; k < k1; ++k) {
        double first = 0.0, second = 0.0;
        box_muller(draws[2 * k], draws[2 * k + 1], first, second);
        dst[2 * k] = static_cast<float>(scale * first);
        dst[2 * k + 1] = static_cast<float>(scale * second);
      }
    };
    // A thread per 16 Ki pairs at least: fewer would cost more to start than they save.
    const std::size_t workers = std::clamp<std::size_t>(n / 16384, 1, std::max(1u, threads));
    std::vector<std::thread> team;
    for (std::size_t w = 1; w < workers; ++w)
      team.emplace_back(transform, n * w / workers, n * (w + 1) / workers);
    transform(0, n / workers);
    for (auto& t : team) t.join();
  }
  i += 2 * pairs;
  if (i < out.size()) out[i] = static_cast<float>(scale * normal());  // leaves the spare
}

void seeded_shuffle(std::span<std::int64_t> values, DataRng& rng) {
  for (std::size_t i = values.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(rng.below(i));
    std::swap(values[i - 1], values[j]);
  }
}

// ---- checks ---------------------------------------------------------------------------------

namespace {

// The token form's invariants (see Dataset); the row count follows from the stream's length.
void check_token_dataset(const Dataset& data, std::string_view origin) {
  if (data.features <= 0)
    fail(origin, "the block size must be >= 1 (found " + std::to_string(data.features) + ")",
         "set data.block_size to the context length, e.g. 64");
  if (data.classes <= 0)
    fail(origin, "the vocabulary size must be >= 1 (found " + std::to_string(data.classes) + ")",
         "set data.vocab_size (GPT-2 token files: 50257)");
  if (!data.x.empty() || !data.y.empty() || !data.sample_shape.empty())
    fail(origin, "a token dataset holds features, labels or a sample shape as well as tokens",
         "this is a bug in whatever built the dataset");
  const auto block = data.features, n = static_cast<std::int64_t>(data.tokens.size());
  if (n <= block)
    fail(origin,
         "holds " + std::to_string(n) + " tokens, fewer than block_size + 1 = " +
             std::to_string(static_cast<std::uint64_t>(block) + 1) + " needed for one window",
         "lower data.block_size or give more text");
  const std::int64_t rows = (n - block - 1) / data.stride + 1;
  if (data.rows != rows)
    fail(origin,
         "has " + std::to_string(data.rows) + " rows, but " + std::to_string(n) +
             " tokens in windows of " + std::to_string(block + 1) + " every " +
             std::to_string(data.stride) + " make " + std::to_string(rows),
         "this is a bug in whatever built the dataset");
  for (std::size_t i = 0; i < data.tokens.size(); ++i)
    if (data.tokens[i] < 0 || data.tokens[i] >= data.classes)
      fail(origin,
           "token " + std::to_string(data.tokens[i]) + " at index " + std::to_string(i) +
               " is outside the vocabulary [0, " + std::to_string(data.classes) + ")",
           "raise data.vocab_size to the tokenizer's vocabulary size (GPT-2: 50257)");
}

// The byte-image form's invariants (see Dataset): images, no floats beside the bytes, one finite
// table row of 256 values per channel.
void check_byte_images(const Dataset& data, std::string_view origin) {
  if (!data.is_image() || !data.x.empty() ||
      data.pixel_values.size() != static_cast<std::size_t>(data.channels()) * 256)
    fail(origin,
         "byte images need [C, H, W] samples, no float features and a table of C x 256 values "
         "(found " +
             std::to_string(data.pixel_values.size()) + " values)",
         "this is a bug in whatever built the dataset");
  for (std::size_t i = 0; i < data.pixel_values.size(); ++i)
    if (!std::isfinite(data.pixel_values[i]))
      fail(origin,
           "byte " + std::to_string(i % 256) + " of channel " + std::to_string(i / 256) +
               " decodes to a value that is not finite",
           "check the normalisation's mean and std");
}

}  // namespace

void check_dataset(const Dataset& data, std::string_view origin) {
  if (data.stride < 0)
    fail(origin, "the window stride is negative (" + std::to_string(data.stride) + ")",
         "this is a bug in whatever built the dataset");
  if (data.is_tokens()) {
    check_token_dataset(data, origin);
    return;
  }
  if (data.rows <= 0)
    fail(origin, "the dataset has no rows (found " + std::to_string(data.rows) + ")",
         "give a file with at least one sample");
  if (data.features <= 0)
    fail(origin, "each sample has no features (found " + std::to_string(data.features) + ")",
         "features must have shape [N, D] with D >= 1");
  if (data.classes <= 0)
    fail(origin, "the number of classes must be >= 1 (found " + std::to_string(data.classes) + ")",
         "set the number of classes or let it be inferred from the labels");
  if (!data.tokens.empty())
    fail(origin, "a table dataset holds tokens", "this is a bug in whatever built the dataset");
  if (!data.sample_shape.empty()) {
    std::string shape = "[";
    std::int64_t product = 1;
    bool fits = data.sample_shape.size() == 3;
    for (const auto d : data.sample_shape) {
      shape += (shape.size() > 1 ? ", " : "") + std::to_string(d);
      // d <= features / product keeps product·d <= features, so nothing overflows.
      if (d < 1 || d > data.features / product)
        fits = false;
      else
        product *= d;
    }
    shape += "]";
    if (!fits || product != data.features)
      fail(origin,
           "the sample shape " + shape + " does not describe " + std::to_string(data.features) +
               " features per row (expected [C, H, W] with C·H·W = features)",
           "this is a bug in whatever built the dataset");
  }
  if (data.is_bytes()) check_byte_images(data, origin);
  if (data.is_image_files()) {
    if (data.image_files.size() != static_cast<std::size_t>(data.rows) || !data.pixels.empty() ||
        !data.is_bytes())
      fail(origin,
           "image files need one file per row (found " + std::to_string(data.image_files.size()) +
               " for " + std::to_string(data.rows) + " rows), no pixels in memory and a table",
           "this is a bug in whatever built the dataset");
  }
  const std::size_t held = data.is_image_files()
                               ? static_cast<std::size_t>(data.rows * data.features)
                           : data.is_bytes() ? data.pixels.size()
                                             : data.x.size();
  if (data.features > static_cast<std::int64_t>(data.x.max_size()) / data.rows ||
      held != static_cast<std::size_t>(data.rows * data.features))
    fail(origin,
         "features hold " + std::to_string(held) + " values, expected rows x features = " +
             std::to_string(data.rows) + " x " + std::to_string(data.features),
         "this is a bug in whatever built the dataset");
  if (data.y.size() != static_cast<std::size_t>(data.rows))
    fail(origin,
         "there are " + std::to_string(data.y.size()) + " labels for " + std::to_string(data.rows) +
             " rows",
         "give exactly one label per row");
  for (std::size_t i = 0; i < data.y.size(); ++i) {
    if (data.y[i] < 0 || data.y[i] >= data.classes)
      fail(origin,
           "label " + std::to_string(data.y[i]) + " of row " + std::to_string(i) +
               " is outside [0, " + std::to_string(data.classes) + ")",
           data.y[i] < 0 ? "labels must be class indices 0, 1, 2, ..."
                         : "raise the number of classes or fix the labels");
  }
  for (std::size_t i = 0; i < data.x.size(); ++i) {
    if (!std::isfinite(data.x[i])) {
      const auto row = static_cast<std::int64_t>(i) / data.features;
      const auto col = static_cast<std::int64_t>(i) % data.features;
      fail(origin,
           "feature [" + std::to_string(row) + ", " + std::to_string(col) + "] is " +
               (std::isnan(data.x[i]) ? "NaN" : "infinite") + ", expected a finite number",
           "clean or impute the data before training (e.g. numpy.nan_to_num)");
    }
  }
}

// ---- split and gather -----------------------------------------------------------------------

namespace {

// Row j of `values` [n, width] (and label j) becomes row source[j], in place: the permutation's
// cycles are followed with one row of scratch.
template <class T>
void permute_rows(std::vector<T>& values, std::vector<std::int32_t>& labels,
                  std::span<const std::int64_t> source, std::size_t width) {
  const std::size_t n = source.size();
  std::vector<bool> done(n, false);
  std::vector<T> row(width);
  const auto at = [&](std::size_t r) {
    return values.begin() + static_cast<std::ptrdiff_t>(r * width);
  };
  for (std::size_t start = 0; start < n; ++start) {
    if (done[start]) continue;
    std::copy_n(at(start), width, row.begin());
    const std::int32_t label = labels[start];
    std::size_t j = start;
    while (true) {
      done[j] = true;
      const auto from = static_cast<std::size_t>(source[j]);
      if (from == start) break;
      std::copy_n(at(from), width, at(j));
      labels[j] = labels[from];
      j = from;
    }
    std::copy_n(row.begin(), width, at(j));
    labels[j] = label;
  }
}

}  // namespace

std::pair<Dataset, Dataset> split_holdout(Dataset all, double eval_fraction, std::uint64_t seed) {
  if (all.is_tokens())
    throw std::logic_error(
        "split_holdout: a token dataset's windows overlap, so a shuffled split would leak "
        "training text into evaluation; use split_token_tail");
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0))
    fail("held-out split",
         "eval_fraction must be in [0, 1), found " + std::to_string(eval_fraction),
         "use e.g. 0.1 to hold out 10% of the rows for evaluation, or 0 for none");
  check_dataset(all, "held-out split input");
  std::int64_t eval_rows = 0;
  if (eval_fraction > 0.0) {
    eval_rows = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::llround(static_cast<double>(all.rows) * eval_fraction)));
  }
  if (eval_rows >= all.rows)
    fail("held-out split",
         "holding out " + std::to_string(eval_rows) + " of " + std::to_string(all.rows) +
             " rows leaves no training rows",
         "lower eval_fraction or provide more data");

  std::vector<std::int64_t> order(static_cast<std::size_t>(all.rows));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  // Nothing held out: the training rows stay in the file's order (data.shuffle = false then
  // means that order, as a reference implementation reading the same file sees it).
  if (eval_rows > 0) {
    DataRng rng(seed);
    seeded_shuffle(order, rng);
  }

  // Image files: the file names move, not pixels. The lists are taken out of `all` first, so
  // that each part copies the rest of it, not a list of every file.
  if (all.is_image_files()) {
    const std::vector<std::filesystem::path> files = std::move(all.image_files);
    const std::vector<std::int32_t> labels = std::move(all.y);
    all.image_files.clear();
    all.y.clear();
    const auto part_of = [&](std::span<const std::int64_t> rows) {
      Dataset part = all;
      part.rows = static_cast<std::int64_t>(rows.size());
      for (const std::int64_t r : rows) {
        part.image_files.push_back(files[static_cast<std::size_t>(r)]);
        part.y.push_back(labels[static_cast<std::size_t>(r)]);
      }
      return part;
    };
    const auto split_at = static_cast<std::size_t>(eval_rows);
    Dataset eval = part_of(std::span<const std::int64_t>(order).first(split_at));
    Dataset train = part_of(std::span<const std::int64_t>(order).subspan(split_at));
    return {std::move(train), std::move(eval)};
  }

  auto take = [&](std::span<const std::int64_t> rows) {
    Dataset part;
    part.rows = static_cast<std::int64_t>(rows.size());
    part.features = all.features;
    part.classes = all.classes;
    part.sample_shape = all.sample_shape;
    part.y.resize(rows.size());
    const std::size_t values = rows.size() * static_cast<std::size_t>(all.features);
    if (all.is_bytes()) {
      part.pixel_values = all.pixel_values;
      part.pixels.resize(values);
      if (!rows.empty()) gather_pixels(all, rows, part.pixels.data(), part.y.data());
    } else {
      part.x.resize(values);
      if (!rows.empty()) gather_batch(all, rows, part.x.data(), part.y.data());
    }
    return part;
  };
  const auto split_at = static_cast<std::size_t>(eval_rows);
  Dataset eval = take(std::span<const std::int64_t>(order).first(split_at));

  // The training rows are permuted in place (following the permutation's cycles with one row of
  // scratch) and the tail dropped, so a large dataset is never held twice in memory.
  const auto width = static_cast<std::size_t>(all.features);
  const auto n = static_cast<std::size_t>(all.rows);
  std::vector<std::int64_t> source(n);  // row j of the result comes from row source[j]
  std::copy(order.begin() + static_cast<std::ptrdiff_t>(split_at), order.end(), source.begin());
  std::copy(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(split_at),
            source.begin() + static_cast<std::ptrdiff_t>(n - split_at));
  if (all.is_bytes())
    permute_rows(all.pixels, all.y, source, width);
  else
    permute_rows(all.x, all.y, source, width);
  Dataset train = std::move(all);
  train.rows = static_cast<std::int64_t>(n - split_at);
  const auto kept = static_cast<std::size_t>(train.rows) * width;
  if (train.is_bytes()) {
    train.pixels.resize(kept);
    train.pixels.shrink_to_fit();
  } else {
    train.x.resize(kept);
    train.x.shrink_to_fit();
  }
  train.y.resize(static_cast<std::size_t>(train.rows));
  train.y.shrink_to_fit();
  return {std::move(train), std::move(eval)};
}

void gather_batch(const Dataset& data, std::span<const std::int64_t> rows, float* x_out,
                  std::int32_t* y_out) {
  if (data.is_tokens())
    throw std::logic_error("gather_batch: the dataset holds token windows; use gather_tokens");
  const auto width = static_cast<std::size_t>(data.features);
  if (data.is_image_files()) {
    decode_image_rows_as_floats(data, rows, std::nullopt, 0, 0, false, x_out, y_out);
    return;
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int64_t row = rows[i];
    if (row < 0 || row >= data.rows)
      throw std::out_of_range("gather_batch: row " + std::to_string(row) + " outside [0, " +
                              std::to_string(data.rows) + ")");
    const auto r = static_cast<std::size_t>(row);
    if (data.is_bytes()) {
      decode_bytes(data.pixel_values, data.channels(), width, 1, data.pixels.data() + r * width,
                   x_out + i * width);
    } else {
      std::memcpy(x_out + i * width, data.x.data() + r * width, width * sizeof(float));
    }
    if (y_out != nullptr) y_out[i] = data.y[r];
  }
}

}  // namespace mixtrain::core
