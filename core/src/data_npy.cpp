// Loaders for NumPy .npy and MNIST IDX files.
//
// Every size is checked against the file size before anything is allocated or read, and every
// failure names the file, what was expected and what was found.
#include "mixtrain/core/dataset.h"

#include "mixtrain/sdk/error.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <system_error>

namespace mixtrain::core {
namespace {

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

// A whole-file-size-aware reader: read(n) fails with "truncated" instead of reading past the end.
class FileReader {
 public:
  explicit FileReader(const fs::path& path) : path_(path) {
    std::error_code ec;
    const auto status = fs::status(path, ec);
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

  std::uint64_t size() const { return size_; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t remaining() const { return size_ - offset_; }

  void read(void* out, std::uint64_t n, std::string_view what) {
    if (n > remaining())
      fail(path_,
           "truncated while reading " + std::string(what) + ": needs " + std::to_string(n) +
               " bytes at offset " + std::to_string(offset_) + ", the file has only " +
               std::to_string(remaining()) + " left",
           "the file is incomplete; download or write it again");
    stream_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    if (static_cast<std::uint64_t>(stream_.gcount()) != n)
      fail(path_, "read error at offset " + std::to_string(offset_) + " while reading " +
                      std::string(what),
           "the file may have changed while it was read, or the disk has an error");
    offset_ += n;
  }

  std::vector<unsigned char> read_bytes(std::uint64_t n, std::string_view what) {
    if (n > remaining()) read(nullptr, n, what);  // reports the truncation, allocates nothing
    std::vector<unsigned char> bytes(static_cast<std::size_t>(n));
    if (n > 0) read(bytes.data(), n, what);
    return bytes;
  }

 private:
  fs::path path_;
  std::ifstream stream_;
  std::uint64_t size_ = 0, offset_ = 0;
};

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

// Product of dims with overflow reported as "too large".
std::optional<std::uint64_t> checked_product(std::span<const std::uint64_t> dims,
                                             std::uint64_t start = 1) {
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

// ---- .npy header ----------------------------------------------------------------------------

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::uint64_t> shape;
};

// Parses the header dict, a Python literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (100, 32), }
// accepting exactly the grammar NumPy writes (plus any whitespace and either quote).
class NpyHeaderParser {
 public:
  NpyHeaderParser(const fs::path& file, std::string_view text) : file_(file), text_(text) {}

  NpyHeader parse() {
    NpyHeader header;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{', "the start of the header dict");
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string("a dict key");
      expect(':', "':' after key '" + key + "'");
      if (key == "descr") {
        if (seen_descr) error("key 'descr' appears twice");
        skip_space();
        if (peek() == '[')
          error("'descr' is a list, i.e. a structured (record) dtype",
                "save a plain numeric array: np.save(path, arr.astype(np.float32))");
        header.descr = parse_string("the 'descr' string");
        seen_descr = true;
      } else if (key == "fortran_order") {
        if (seen_order) error("key 'fortran_order' appears twice");
        header.fortran_order = parse_bool();
        seen_order = true;
      } else if (key == "shape") {
        if (seen_shape) error("key 'shape' appears twice");
        header.shape = parse_shape();
        seen_shape = true;
      } else {
        error("unexpected key '" + key + "', expected only 'descr', 'fortran_order', 'shape'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        error("expected ',' or '}' after the value of '" + key + "', found " + found());
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size())
      error("unexpected text after the header dict: " + quoted(text_.substr(pos_)));
    if (!seen_descr || !seen_order || !seen_shape)
      error(std::string("the header dict lacks ") +
            (!seen_descr ? "'descr'" : !seen_order ? "'fortran_order'" : "'shape'"));
    return header;
  }

 private:
  [[noreturn]] void error(const std::string& what,
                          std::string hint = "write the file with numpy.save()") const {
    fail(file_, "malformed .npy header: " + what + " (header: " + quoted(text_) + ")", hint);
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  std::string found() const {
    return pos_ < text_.size() ? quoted(text_.substr(pos_, 1)) : std::string("the end");
  }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c, const std::string& what) {
    skip_space();
    if (peek() != c) error("expected " + what + ", found " + found());
    ++pos_;
  }

  std::string parse_string(const std::string& what) {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') error("expected " + what + " in quotes, found " + found());
    const std::size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) error("unterminated string in " + what);
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    if (s.find('\\') != std::string::npos) error("escape sequences are not supported in " + what);
    pos_ = end + 1;
    return s;
  }

  bool parse_bool() {
    skip_space();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    error("'fortran_order' must be True or False, found " + found());
  }

  std::vector<std::uint64_t> parse_shape() {
    std::vector<std::uint64_t> dims;
    expect('(', "'(' opening the 'shape' tuple");
    skip_space();
    while (peek() != ')') {
      if (peek() < '0' || peek() > '9')
        error("'shape' entries must be non-negative integers, found " + found());
      std::uint64_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        const auto digit = static_cast<std::uint64_t>(peek() - '0');
        if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10)
          error("a 'shape' entry is too large");
        value = value * 10 + digit;
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long literal, still in old files
      dims.push_back(value);
      if (dims.size() > 32) error("'shape' has more than 32 dimensions");
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        error("expected ',' or ')' in 'shape', found " + found());
      }
    }
    ++pos_;
    return dims;
  }

  const fs::path& file_;
  std::string_view text_;
  std::size_t pos_ = 0;
};

struct NpyDtype {
  char kind;               // 'f' float, 'i' signed, 'u' unsigned, 'b' bool
  std::size_t item_size;
};

NpyDtype parse_descr(const fs::path& file, const std::string& descr, bool for_labels) {
  const std::string accepted = for_labels
                                   ? "an integer dtype ('|u1', '|i1', '<i2', '<u2', '<i4', '<u4', "
                                     "'<i8', '<u8')"
                                   : "float32 ('<f4') or float64 ('<f8')";
  const std::string hint = for_labels ? "save integer class indices: np.save(path, y.astype(np.int64))"
                                      : "save float features: np.save(path, x.astype(np.float32))";
  if (descr.size() < 3)
    fail(file, "unsupported dtype '" + descr + "', expected " + accepted, hint);
  const char order = descr[0];
  const char kind = descr[1];
  const std::string size_text = descr.substr(2);
  if (size_text.find_first_not_of("0123456789") != std::string::npos || size_text.size() > 2)
    fail(file, "unsupported dtype '" + descr + "', expected " + accepted, hint);
  const auto item_size = static_cast<std::size_t>(std::stoul(size_text));
  if (order == '>' && item_size > 1)
    fail(file, "dtype '" + descr + "' is big-endian, expected little-endian",
         "convert it in NumPy: np.save(path, arr.astype(arr.dtype.newbyteorder('<')))");
  if (order != '<' && order != '|' && order != '=' && order != '>')
    fail(file, "unsupported byte order in dtype '" + descr + "'", hint);
  const bool ok = for_labels ? ((kind == 'i' || kind == 'u') &&
                                (item_size == 1 || item_size == 2 || item_size == 4 ||
                                 item_size == 8))
                             : (kind == 'f' && (item_size == 4 || item_size == 8));
  if (!ok) {
    std::string found = "'" + descr + "'";
    if (kind == 'O') found += " (pickled Python objects)";
    if (kind == 'f' && for_labels) found += " (floating point)";
    fail(file, "unsupported dtype " + found + ", expected " + accepted, hint);
  }
  return {kind, item_size};
}

struct NpyArray {
  NpyDtype dtype;
  std::vector<std::uint64_t> shape;
  std::vector<unsigned char> bytes;  // little-endian elements, C order
};

NpyArray read_npy(const fs::path& file, bool for_labels) {
  FileReader in(file);
  unsigned char preamble[8];
  if (in.size() < 10)
    fail(file, "too small to be a .npy file (" + std::to_string(in.size()) + " bytes)",
         "write it with numpy.save()");
  in.read(preamble, 8, "the .npy magic");
  static constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (std::memcmp(preamble, kMagic, 6) != 0) {
    std::string hint = "write the features / labels with numpy.save(); .npz archives and text "
                       "files are not .npy";
    if (preamble[0] == 'P' && preamble[1] == 'K') hint = "this looks like a .npz (zip) archive; "
                                                         "save each array with numpy.save()";
    fail(file, "bad magic: expected \"\\x93NUMPY\", found " +
                   quoted(std::string_view(reinterpret_cast<const char*>(preamble), 6)),
         hint);
  }
  const int major = preamble[6];
  const int minor = preamble[7];
  if (major < 1 || major > 3 || minor != 0)
    fail(file, "unsupported .npy format version " + std::to_string(major) + "." +
                   std::to_string(minor) + ", expected 1.0, 2.0 or 3.0",
         "re-save it with a current numpy.save()");
  std::uint64_t header_len = 0;
  if (major == 1) {
    unsigned char len[2];
    in.read(len, 2, "the header length");
    header_len = load_le(len, 2);
  } else {
    unsigned char len[4];
    in.read(len, 4, "the header length");
    header_len = load_le(len, 4);
  }
  const auto header_bytes = in.read_bytes(header_len, "the header");
  std::string_view header_text(reinterpret_cast<const char*>(header_bytes.data()),
                               header_bytes.size());
  // The header ends with '\n' and is padded with spaces; trailing NULs appear in some writers.
  while (!header_text.empty() && (header_text.back() == '\n' || header_text.back() == ' ' ||
                                  header_text.back() == '\0'))
    header_text.remove_suffix(1);
  NpyHeader header = NpyHeaderParser(file, header_text).parse();
  NpyDtype dtype = parse_descr(file, header.descr, for_labels);
  if (header.fortran_order)
    fail(file, "array is stored in Fortran (column-major) order, expected C order",
         "save a C-ordered copy: np.save(path, np.ascontiguousarray(arr))");

  // Sizes that overflow 64 bits are reported as truncation, like any size beyond the file.
  const auto count = checked_product(header.shape);
  const bool representable =
      count.has_value() && *count <= std::numeric_limits<std::uint64_t>::max() / dtype.item_size;
  const std::uint64_t data_bytes = representable ? *count * dtype.item_size : 0;
  if (!representable || data_bytes > in.remaining())
    fail(file,
         "truncated: shape " + shape_string(header.shape) + " of '" + header.descr + "' needs " +
             (representable ? std::to_string(data_bytes) : std::string("more than 2^64")) +
             " bytes of data, the file has " + std::to_string(in.remaining()) +
             " after the header",
         "the file is incomplete or its header is wrong; write it again with numpy.save()");
  if (data_bytes < in.remaining())
    fail(file,
         "has " + std::to_string(in.remaining() - data_bytes) +
             " unexpected bytes after the data of shape " + shape_string(header.shape) + " of '" +
             header.descr + "'",
         "the header does not describe the data; write the file again with numpy.save()");
  NpyArray array{dtype, std::move(header.shape), {}};
  array.bytes = in.read_bytes(data_bytes, "the array data");
  return array;
}

// ---- label handling shared by both formats ------------------------------------------------

void check_row_counts(const fs::path& features, std::uint64_t feature_rows,
                      const fs::path& labels, std::uint64_t label_rows) {
  if (feature_rows != label_rows)
    throw sdk::DataError("data files '" + features.string() + "' and '" + labels.string() +
                             "': the features have " + std::to_string(feature_rows) +
                             " rows but the labels have " + std::to_string(label_rows),
                         "the two files must describe the same samples in the same order");
}

void set_classes(const fs::path& labels, Dataset& data, std::int32_t classes) {
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
      fail(labels,
           "label " + std::to_string(max_label) + " (row " + std::to_string(at) +
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

}  // namespace

// ---- .npy -----------------------------------------------------------------------------------

Dataset load_npy(const fs::path& features, const fs::path& labels, std::int32_t classes) {
  NpyArray fx = read_npy(features, /*for_labels=*/false);
  if (fx.shape.size() < 2)
    fail(features,
         "features have rank " + std::to_string(fx.shape.size()) + " (shape " +
             shape_string(fx.shape) + "), expected [N, D] or [N, d1, d2, ...]",
         fx.shape.size() == 1 ? "one feature per sample? save x.reshape(-1, 1)"
                              : "save an array with one row per sample");
  require_rows(features, fx.shape[0]);
  const std::uint64_t width =
      checked_product(std::span<const std::uint64_t>(fx.shape).subspan(1)).value_or(0);
  if (width == 0)
    fail(features, "shape " + shape_string(fx.shape) + " has zero features per row",
         "each sample needs at least one feature");

  NpyArray fy = read_npy(labels, /*for_labels=*/true);
  if (!(fy.shape.size() == 1 || (fy.shape.size() == 2 && fy.shape[1] == 1)))
    fail(labels,
         "labels have shape " + shape_string(fy.shape) + ", expected [N] (or [N, 1])",
         "save one integer class index per sample: np.save(path, y.reshape(-1))");
  require_rows(labels, fy.shape[0]);
  check_row_counts(features, fx.shape[0], labels, fy.shape[0]);

  Dataset data;
  data.rows = static_cast<std::int64_t>(fx.shape[0]);
  data.features = static_cast<std::int64_t>(width);
  const std::size_t values = static_cast<std::size_t>(fx.shape[0] * width);
  data.x.resize(values);
  const unsigned char* src = fx.bytes.data();
  if (fx.dtype.item_size == 4) {
    for (std::size_t i = 0; i < values; ++i)
      data.x[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load_le(src + 4 * i, 4)));
  } else {
    for (std::size_t i = 0; i < values; ++i)
      data.x[i] = static_cast<float>(std::bit_cast<double>(load_le(src + 8 * i, 8)));
  }
  for (std::size_t i = 0; i < values; ++i) {
    if (!std::isfinite(data.x[i]))
      fail(features,
           std::string("feature [") + std::to_string(i / width) + ", " +
               std::to_string(i % width) + "] is " +
               (std::isnan(data.x[i]) ? "NaN" : "infinite (or a float64 beyond the float32 range)") +
               ", expected a finite number",
           "clean or impute the data before saving it (e.g. numpy.nan_to_num)");
  }

  data.y.resize(static_cast<std::size_t>(data.rows));
  const std::size_t item = fy.dtype.item_size;
  const bool is_signed = fy.dtype.kind == 'i';
  for (std::size_t i = 0; i < data.y.size(); ++i) {
    const std::uint64_t raw = load_le(fy.bytes.data() + i * item, item);
    std::int64_t value = 0;
    bool too_large = false;
    if (is_signed) {
      const unsigned shift = static_cast<unsigned>(64 - 8 * item);
      value = static_cast<std::int64_t>(raw << shift) >> shift;  // sign-extend
    } else if (raw > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      too_large = true;
    } else {
      value = static_cast<std::int64_t>(raw);
    }
    if (value < 0)
      fail(labels, "label " + std::to_string(value) + " of row " + std::to_string(i) +
                       " is negative, expected a class index >= 0",
           "labels must be class indices 0, 1, 2, ...");
    if (too_large || value > std::numeric_limits<std::int32_t>::max() - 1)
      fail(labels, "label of row " + std::to_string(i) + " is " +
                       (too_large ? std::to_string(raw) : std::to_string(value)) +
                       ", too large for a class index",
           "labels must be class indices 0, 1, 2, ...");
    data.y[i] = static_cast<std::int32_t>(value);
  }
  set_classes(labels, data, classes);
  finish(features, labels, data);
  return data;
}

// ---- IDX ------------------------------------------------------------------------------------

namespace {

struct IdxArray {
  std::vector<std::uint64_t> shape;
  std::vector<unsigned char> bytes;
};

IdxArray read_idx(const fs::path& file, bool for_labels) {
  FileReader in(file);
  unsigned char magic[4];
  if (in.size() < 4)
    fail(file, "too small to be an IDX file (" + std::to_string(in.size()) + " bytes)",
         "download the uncompressed MNIST-style IDX file again");
  in.read(magic, 4, "the IDX magic");
  if (magic[0] == 0x1f && magic[1] == 0x8b)
    fail(file, "is gzip-compressed, expected an uncompressed IDX file",
         "decompress it first: gunzip '" + file.string() + "'");
  const std::string expected =
      for_labels ? "0x00000801 (u8 labels [N])" : "0x00000803 (u8 images [N, H, W])";
  char found_hex[16];
  std::snprintf(found_hex, sizeof found_hex, "0x%02x%02x%02x%02x", magic[0], magic[1], magic[2],
                magic[3]);
  if (magic[0] != 0 || magic[1] != 0)
    fail(file, std::string("bad magic: expected ") + expected + ", found " + found_hex,
         "is this an IDX file? the MNIST files are train-images-idx3-ubyte / "
         "train-labels-idx1-ubyte");
  if (magic[2] != 0x08)
    fail(file, std::string("element type in magic ") + found_hex +
                   " is not unsigned byte (0x08), expected " + expected,
         "only u8 IDX files (MNIST, Fashion-MNIST, EMNIST) are supported");
  const int rank = magic[3];
  const bool rank_ok = for_labels ? rank == 1 : (rank >= 2 && rank <= 4);
  if (!rank_ok)
    fail(file, std::string("magic ") + found_hex + " declares rank " + std::to_string(rank) +
                   ", expected " + expected,
         "did you swap the images and labels files?");
  IdxArray array;
  for (int d = 0; d < rank; ++d) {
    unsigned char dim[4];
    in.read(dim, 4, "the dimension sizes");
    array.shape.push_back(load_be(dim, 4));
  }
  require_rows(file, array.shape[0]);
  const auto product = checked_product(array.shape);
  const std::uint64_t total = product.value_or(0);
  if (!product.has_value() || total > in.remaining())
    fail(file,
         "truncated: shape " + shape_string(array.shape) + " needs " +
             (product.has_value() ? std::to_string(total) : std::string("more than 2^64")) +
             " bytes of data, the file has " + std::to_string(in.remaining()) +
             " after the header",
         "the file is incomplete; download or decompress it again");
  if (total < in.remaining())
    fail(file,
         "has " + std::to_string(in.remaining() - total) +
             " unexpected bytes after the data of shape " + shape_string(array.shape),
         "the header does not describe the data; download the file again");
  if (total == 0)
    fail(file, "shape " + shape_string(array.shape) + " holds no values",
         "each sample needs at least one pixel");
  array.bytes = in.read_bytes(total, "the pixel data");
  return array;
}

}  // namespace

Dataset load_idx(const fs::path& images, const fs::path& labels, std::int32_t classes) {
  IdxArray fx = read_idx(images, /*for_labels=*/false);
  IdxArray fy = read_idx(labels, /*for_labels=*/true);
  check_row_counts(images, fx.shape[0], labels, fy.shape[0]);
  Dataset data;
  data.rows = static_cast<std::int64_t>(fx.shape[0]);
  data.features = static_cast<std::int64_t>(fx.bytes.size() / fx.shape[0]);
  data.x.resize(fx.bytes.size());
  for (std::size_t i = 0; i < fx.bytes.size(); ++i)
    data.x[i] = static_cast<float>(fx.bytes[i]) / 255.0f;
  data.y.assign(fy.bytes.begin(), fy.bytes.end());
  set_classes(labels, data, classes);
  finish(images, labels, data);
  return data;
}

}  // namespace mixtrain::core
