// What `mixtrain predict` writes: one NumPy .npy array (format 1.0, little-endian, C order) of
// the model's predictions, streamed batch by batch and renamed into place only when complete.
//
// Contract
// - Values: logits (FP32, as the model computed them, widened from its logits dtype) or
//   probabilities (softmax of each position's logits, in double, stored as float32).
// - Positions (language models, T per window): last keeps each window's final position, the
//   prediction of the token after it; all keeps every position. Classifiers have one.
// - The array is [rows, classes], or [rows, T, classes] with all positions. With top_k = k > 0 it
//   is [rows, k] (or [rows, T, k]) of a structured dtype with fields `class` (<i4) and `score`
//   (<f4, the logit or probability): the k largest values of each position, largest first, ties
//   to the lower class (NaNs as top_k() below ranks them), as `np.load(f)["class"]` reads them.
// - append() takes batches in row order; commit() checks every row came, then renames the file
//   into place (sdk::AtomicFileWriter: an existing file is replaced whole, and a failure or an
//   uncommitted writer leaves no partial file). Errors: sdk::CheckpointError for I/O (naming the
//   file and the OS error), std::invalid_argument for a caller's bad sizes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain::sdk {
class AtomicFileWriter;
}

namespace mixtrain::core {

enum class PredictionValues { logits, probabilities };

struct PredictionFormat {
  PredictionValues values = PredictionValues::logits;
  std::int64_t top_k = 0;      // 0: every class
  bool all_positions = false;  // language models: every position, not just the last
};

class PredictionFile {
 public:
  // rows: the input's rows; positions: per row (T for a language model, 1 otherwise); classes:
  // logits per position. top_k must be in [0, classes].
  PredictionFile(std::filesystem::path out, PredictionFormat format, std::int64_t rows,
                 std::int64_t positions, std::int64_t classes);
  ~PredictionFile();
  PredictionFile(const PredictionFile&) = delete;
  PredictionFile& operator=(const PredictionFile&) = delete;

  // `logits` holds rows × positions × classes FP32 values, for the next `rows` rows.
  void append(std::int64_t rows, std::span<const float> logits);
  // Returns the writer's warning when only the final folder fsync failed (the file is in place).
  std::string commit();
  // The array's shape, as written in the header.
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t rows_written() const { return written_rows_; }

 private:
  PredictionFormat format_;
  std::int64_t rows_, positions_, classes_, written_rows_ = 0;
  std::vector<std::int64_t> shape_;
  std::unique_ptr<sdk::AtomicFileWriter> file_;
  std::vector<float> values_;     // one position's logits or probabilities
  std::vector<std::byte> bytes_;  // one position's output, little-endian
};

// Softmax of one position's logits, in double (x − max before exp), rounded to float.
void softmax(std::span<const float> logits, std::span<float> out);
// The k largest of `values`, largest first, ties to the lower index: (index, value) pairs. A NaN
// ranks as eval's top-k accuracy ranks it: first at index 0, after every number elsewhere.
std::vector<std::pair<std::int32_t, float>> top_k(std::span<const float> values, std::int64_t k);
// The .npy header (magic, version 1.0, length, dict padded so the data start at a multiple of
// 64 bytes) for `descr` (e.g. "'<f4'") and `shape`.
std::vector<std::byte> npy_header(const std::string& descr, std::span<const std::int64_t> shape);

}  // namespace mixtrain::core
