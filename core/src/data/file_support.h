// What the .npy and IDX loaders share (internal to the core): the DataError they raise, a
// size-aware file reader, byte decoding, and the checks that need both features and labels.
//
// Contract: every failure is an sdk::DataError naming the file, what was expected and what was
// found, with a hint. FileReader never reads past the end of the file and read_bytes() never
// allocates more than the file still holds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core::data_files {

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& what,
                       const std::string& hint);

// `s` in double quotes, with control and non-ASCII bytes as \xNN.
std::string quoted(std::string_view s);

// A whole-file-size-aware reader: read(n) fails with "truncated" instead of reading past the end.
class FileReader {
 public:
  explicit FileReader(const std::filesystem::path& path);

  std::uint64_t size() const { return size_; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t remaining() const { return size_ - offset_; }

  void read(void* out, std::uint64_t n, std::string_view what);
  std::vector<unsigned char> read_bytes(std::uint64_t n, std::string_view what);

 private:
  std::filesystem::path path_;
  std::ifstream stream_;
  std::uint64_t size_ = 0, offset_ = 0;
};

std::uint64_t load_le(const unsigned char* p, std::size_t bytes);
std::uint64_t load_be(const unsigned char* p, std::size_t bytes);

// Product of dims (times `start`); nullopt when it overflows 64 bits.
std::optional<std::uint64_t> checked_product(std::span<const std::uint64_t> dims,
                                             std::uint64_t start = 1);
// NumPy's spelling: "(5,)", "(5, 3)".
std::string shape_string(std::span<const std::uint64_t> dims);

void require_rows(const std::filesystem::path& file, std::uint64_t rows);
void check_row_counts(const std::filesystem::path& features, std::uint64_t feature_rows,
                      const std::filesystem::path& labels, std::uint64_t label_rows);
// data.classes from `classes` (0: max label + 1), checking every label is below it. With
// item_size > 0, an error names the label's byte offset: data_offset + row · item_size.
void set_classes(const std::filesystem::path& labels, Dataset& data, std::int32_t classes,
                 std::uint64_t data_offset = 0, std::uint64_t item_size = 0);
// check_dataset() of the assembled data, naming both files.
void finish(const std::filesystem::path& features, const std::filesystem::path& labels,
            Dataset& data);

}  // namespace mixtrain::core::data_files
