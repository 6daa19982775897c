#include "mixtrain/core/predict/prediction_file.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "mixtrain/sdk/support/atomic_file_writer.h"

namespace mixtrain::core {

std::vector<std::byte> npy_header(const std::string& descr, std::span<const std::int64_t> shape) {
  std::string dict = "{'descr': " + descr + ", 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i)
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
  if (shape.size() == 1) dict.pop_back();  // "(5,)"
  dict += "), }";
  // magic (6) + version (2) + length (2) + dict + padding + '\n', a multiple of 64 in all.
  const std::size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  if (dict.size() > 0xFFFF) throw std::invalid_argument("npy_header: the header is too long");
  std::vector<std::byte> out(10 + dict.size());
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  std::memcpy(out.data(), magic, 8);
  out[8] = static_cast<std::byte>(dict.size() & 0xFF);
  out[9] = static_cast<std::byte>(dict.size() >> 8);
  std::memcpy(out.data() + 10, dict.data(), dict.size());
  return out;
}

void softmax(std::span<const float> logits, std::span<float> out) {
  if (logits.empty()) return;
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float v : logits) sum += std::exp(static_cast<double>(v) - top);
  for (std::size_t i = 0; i < logits.size(); ++i)
    out[i] = static_cast<float>(std::exp(static_cast<double>(logits[i]) - top) / sum);
}

std::vector<std::pair<std::int32_t, float>> top_k(std::span<const float> values, std::int64_t k) {
  std::vector<std::int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  const auto n =
      std::min<std::size_t>(static_cast<std::size_t>(std::max<std::int64_t>(k, 0)), order.size());
  // A NaN ranks as eval's argmax and top-k accuracy rank it (train/top_k.h): first at index 0,
  // last anywhere else. Comparing NaNs by value would not be a strict weak ordering, which
  // partial_sort needs (a NaN among the logits dropped the largest class from the result).
  const auto group = [&](std::int32_t i) {
    if (!std::isnan(values[static_cast<std::size_t>(i)])) return 1;
    return i == 0 ? 0 : 2;
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      const int ga = group(a), gb = group(b);
                      if (ga != gb) return ga < gb;
                      if (ga != 1) return a < b;
                      const float va = values[static_cast<std::size_t>(a)];
                      const float vb = values[static_cast<std::size_t>(b)];
                      return va > vb || (va == vb && a < b);
                    });
  std::vector<std::pair<std::int32_t, float>> out;
  for (std::size_t i = 0; i < n; ++i)
    out.emplace_back(order[i], values[static_cast<std::size_t>(order[i])]);
  return out;
}

PredictionFile::PredictionFile(std::filesystem::path out, PredictionFormat format,
                               std::int64_t rows, std::int64_t positions, std::int64_t classes)
    : format_(format), rows_(rows), positions_(positions), classes_(classes) {
  if (rows < 0 || positions < 1 || classes < 1 || format.top_k < 0 || format.top_k > classes)
    throw std::invalid_argument("PredictionFile: bad sizes");
  shape_ = {rows};
  if (format.all_positions && positions > 1) shape_.push_back(positions);
  shape_.push_back(format.top_k > 0 ? format.top_k : classes);
  const std::string descr =
      format.top_k > 0 ? "[('class', '<i4'), ('score', '<f4')]" : std::string("'<f4'");
  file_ = std::make_unique<sdk::AtomicFileWriter>(std::move(out), /*durable=*/false,
                                                  "predictions file");
  const auto header = npy_header(descr, shape_);
  file_->write(header.data(), header.size());
}

PredictionFile::~PredictionFile() = default;

void PredictionFile::append(std::int64_t rows, std::span<const float> logits) {
  const auto per_row = static_cast<std::size_t>(positions_ * classes_);
  if (rows < 0 || written_rows_ + rows > rows_ ||
      logits.size() != static_cast<std::size_t>(rows) * per_row)
    throw std::invalid_argument("PredictionFile::append: " + std::to_string(rows) + " rows of " +
                                std::to_string(logits.size()) + " values");
  const auto C = static_cast<std::size_t>(classes_);
  values_.resize(C);
  const std::int64_t first = format_.all_positions ? 0 : positions_ - 1;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t t = first; t < positions_; ++t) {
      // logits is [rows, positions, classes]: this position's C values.
      const auto position = logits.subspan(
          static_cast<std::size_t>(r) * per_row + static_cast<std::size_t>(t) * C, C);
      if (format_.values == PredictionValues::probabilities)
        softmax(position, values_);
      else
        std::copy(position.begin(), position.end(), values_.begin());
      bytes_.clear();
      auto put = [&](std::uint32_t v) {
        for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
      };
      if (format_.top_k == 0) {
        for (const float v : values_) put(std::bit_cast<std::uint32_t>(v));
      } else {
        for (const auto& [cls, score] : top_k(values_, format_.top_k)) {
          put(static_cast<std::uint32_t>(cls));
          put(std::bit_cast<std::uint32_t>(score));
        }
      }
      file_->write(bytes_.data(), bytes_.size());
    }
  written_rows_ += rows;
}

std::string PredictionFile::commit() {
  if (written_rows_ != rows_)
    throw std::invalid_argument("PredictionFile::commit: " + std::to_string(written_rows_) +
                                " of " + std::to_string(rows_) + " rows written");
  return file_->commit();
}

}  // namespace mixtrain::core
