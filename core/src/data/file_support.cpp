#include "data/file_support.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <system_error>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core::data_files {

namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& file, const std::string& what, const std::string& hint) {
  throw sdk::DataError("data file '" + file.string() + "': " + what, hint);
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

FileReader::FileReader(const fs::path& path) : path_(path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec == std::errc::too_many_symbolic_link_levels)
    fail(path, "is a loop of symbolic links", "point the path at the file itself");
  if (!fs::exists(status))
    fail(path, "no such file", "check the path in the [data] section of the config");
  if (fs::is_directory(status))
    fail(path, "is a directory, expected a file", "point the [data] path at the file itself");
  size_ = fs::file_size(path, ec);
  if (ec) fail(path, "cannot determine the file size (" + ec.message() + ")", "");
  errno = 0;
  stream_.open(path, std::ios::binary);
  if (!stream_) {
    const int err = errno;
    fail(path, std::string("cannot open: ") + (err != 0 ? std::strerror(err) : "unknown error"),
         "check that the file exists and is readable by this user");
  }
}

void FileReader::read(void* out, std::uint64_t n, std::string_view what) {
  if (n > remaining())
    fail(path_,
         "truncated while reading " + std::string(what) + ": needs " + std::to_string(n) +
             " bytes at offset " + std::to_string(offset_) + ", the file has only " +
             std::to_string(remaining()) + " left",
         "the file is incomplete; download or write it again");
  stream_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
  if (static_cast<std::uint64_t>(stream_.gcount()) != n)
    fail(path_,
         "read error at offset " + std::to_string(offset_) + " while reading " + std::string(what),
         "the file may have changed while it was read, or the disk has an error");
  offset_ += n;
}

std::vector<unsigned char> FileReader::read_bytes(std::uint64_t n, std::string_view what) {
  if (n > remaining()) read(nullptr, n, what);  // reports the truncation, allocates nothing
  std::vector<unsigned char> bytes(static_cast<std::size_t>(n));
  if (n > 0) read(bytes.data(), n, what);
  return bytes;
}

std::uint64_t load_le(const unsigned char* p, std::size_t bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = bytes; i > 0; --i) v = (v << 8) | p[i - 1];
  return v;
}

std::uint64_t load_be(const unsigned char* p, std::size_t bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v = (v << 8) | p[i];
  return v;
}

std::optional<std::uint64_t> checked_product(std::span<const std::uint64_t> dims,
                                             std::uint64_t start) {
  std::uint64_t p = start;
  for (auto d : dims) {
    if (d != 0 && p > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
    p *= d;
  }
  return p;
}

std::string shape_string(std::span<const std::uint64_t> dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    s += std::to_string(dims[i]);
    if (dims.size() == 1 || i + 1 < dims.size()) s += ",";
    if (i + 1 < dims.size()) s += " ";
  }
  return s + ")";
}

void check_row_counts(const fs::path& features, std::uint64_t feature_rows, const fs::path& labels,
                      std::uint64_t label_rows) {
  if (feature_rows != label_rows)
    throw sdk::DataError("data files '" + features.string() + "' and '" + labels.string() +
                             "': the features have " + std::to_string(feature_rows) +
                             " rows but the labels have " + std::to_string(label_rows),
                         "the two files must describe the same samples in the same order");
}

void set_classes(const fs::path& labels, Dataset& data, std::int32_t classes,
                 std::uint64_t data_offset, std::uint64_t item_size) {
  if (classes < 0)
    fail(labels, "the number of classes must be >= 0, found " + std::to_string(classes),
         "give 0 to infer it from the labels");
  const std::int32_t max_label =
      data.y.empty() ? -1 : *std::max_element(data.y.begin(), data.y.end());
  if (classes == 0) {
    data.classes = max_label + 1;
  } else {
    data.classes = classes;
    if (max_label >= classes) {
      const auto at = std::find(data.y.begin(), data.y.end(), max_label) - data.y.begin();
      const std::string offset =
          item_size == 0
              ? std::string()
              : ", byte offset " +
                    std::to_string(data_offset + static_cast<std::uint64_t>(at) * item_size);
      fail(labels,
           "label " + std::to_string(max_label) + " (row " + std::to_string(at) + offset +
               ") is not below the declared " + std::to_string(classes) + " classes",
           "raise the number of classes in the config or fix the labels");
    }
  }
}

void finish(const fs::path& features, const fs::path& labels, Dataset& data) {
  // Rows and ranges were checked per file; this catches what needs both (and NaN / inf).
  check_dataset(data, "data files '" + features.string() + "' / '" + labels.string() + "'");
}

void require_rows(const fs::path& file, std::uint64_t rows) {
  if (rows == 0)
    fail(file, "contains zero rows, expected at least one sample", "write a non-empty array");
  if (rows > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    fail(file, "has too many rows", "");
}

}  // namespace mixtrain::core::data_files
