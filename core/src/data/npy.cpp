// Loader for NumPy .npy files.
//
// Every size is checked against the file size before anything is allocated or read, and every
// failure names the file, what was expected and what was found.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "data/byte_images.h"
#include "data/file_support.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;
using namespace data_files;

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
      error(std::string("the header dict lacks ") + (!seen_descr   ? "'descr'"
                                                     : !seen_order ? "'fortran_order'"
                                                                   : "'shape'"));
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
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
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
  char kind;  // 'f' float, 'i' signed, 'u' unsigned, 'b' bool
  std::size_t item_size;
};

NpyDtype parse_descr(const fs::path& file, const std::string& descr, bool for_labels) {
  const std::string accepted = for_labels
                                   ? "an integer dtype ('|u1', '|i1', '<i2', '<u2', '<i4', '<u4', "
                                     "'<i8', '<u8')"
                                   : "float32 ('<f4'), float64 ('<f8') or uint8 ('|u1')";
  const std::string hint = for_labels
                               ? "save integer class indices: np.save(path, y.astype(np.int64))"
                               : "save float features: np.save(path, x.astype(np.float32))";
  if (descr.size() < 3) fail(file, "unsupported dtype '" + descr + "', expected " + accepted, hint);
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
  const bool ok = for_labels ? ((kind == 'i' || kind == 'u') && (item_size == 1 || item_size == 2 ||
                                                                 item_size == 4 || item_size == 8))
                             : ((kind == 'f' && (item_size == 4 || item_size == 8)) ||
                                (kind == 'u' && item_size == 1));
  if (!ok) {
    std::string found = "'" + descr + "'";
    if (kind == 'O') found += " (pickled Python objects)";
    if (kind == 'f' && for_labels) found += " (floating point)";
    // Integer pixels (16-bit PNGs read as int32 or uint16): a plain cast to float would feed
    // the model values 255 or 65535 times those of the [0, 1] pixels it learns from.
    const bool integers = !for_labels && (kind == 'i' || kind == 'u' || kind == 'b');
    fail(file, "unsupported dtype " + found + ", expected " + accepted,
         integers ? "for 8-bit images save uint8 (np.save(path, x.astype(np.uint8)): mixtrain "
                    "scales them to [0, 1] as ToTensor does); for other integers save float32 "
                    "features scaled as the model should see them (16-bit images: "
                    "np.save(path, (x / 65535).astype(np.float32)))"
                  : hint);
  }
  return {kind, item_size};
}

struct NpyArray {
  NpyDtype dtype;
  std::vector<std::uint64_t> shape;
  std::vector<unsigned char> bytes;  // little-endian elements, C order
  std::uint64_t data_offset = 0;     // where the elements start in the file
};


// A Fortran-ordered (column-major) array's bytes in C (row-major) order: numpy.save writes an
// F-contiguous array that way (np.asfortranarray, a transposed view), and numpy.load reads it
// back with the same element at each index. Element (i0, ..., ik) sits at i0 + d0·(i1 + d1·(...))
// in the file; walking the C order with an odometer keeps that offset as a running sum.
std::vector<unsigned char> to_c_order(const std::vector<unsigned char>& fortran,
                                      const std::vector<std::uint64_t>& shape,
                                      std::size_t item_size) {
  if (shape.size() < 2) return fortran;  // one axis: the same bytes
  const std::size_t axes = shape.size();
  std::vector<std::uint64_t> stride(axes, 1), index(axes, 0);
  for (std::size_t j = 1; j < axes; ++j) stride[j] = stride[j - 1] * shape[j - 1];
  std::vector<unsigned char> out(fortran.size());
  const std::uint64_t count = fortran.size() / item_size;
  std::uint64_t from = 0;
  for (std::uint64_t c = 0; c < count; ++c) {
    std::memcpy(out.data() + c * item_size, fortran.data() + from * item_size, item_size);
    for (std::size_t j = axes; j-- > 0;) {
      from += stride[j];
      if (++index[j] < shape[j]) break;
      from -= stride[j] * shape[j];
      index[j] = 0;
    }
  }
  return out;
}

NpyArray read_npy(const fs::path& file, bool for_labels) {
  FileReader in(file);
  unsigned char preamble[8];
  if (in.size() < 10)
    fail(file, "too small to be a .npy file (" + std::to_string(in.size()) + " bytes)",
         "write it with numpy.save()");
  in.read(preamble, 8, "the .npy magic");
  static constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (std::memcmp(preamble, kMagic, 6) != 0) {
    std::string hint =
        "write the features / labels with numpy.save(); .npz archives and text "
        "files are not .npy";
    if (preamble[0] == 'P' && preamble[1] == 'K')
      hint =
          "this looks like a .npz (zip) archive; "
          "save each array with numpy.save()";
    fail(file,
         "bad magic: expected \"\\x93NUMPY\", found " +
             quoted(std::string_view(reinterpret_cast<const char*>(preamble), 6)),
         hint);
  }
  const int major = preamble[6];
  const int minor = preamble[7];
  if (major < 1 || major > 3 || minor != 0)
    fail(file,
         "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
             ", expected 1.0, 2.0 or 3.0",
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
  while (!header_text.empty() &&
         (header_text.back() == '\n' || header_text.back() == ' ' || header_text.back() == '\0'))
    header_text.remove_suffix(1);
  NpyHeader header = NpyHeaderParser(file, header_text).parse();
  NpyDtype dtype = parse_descr(file, header.descr, for_labels);

  // Sizes that overflow 64 bits are reported as truncation, like any size beyond the file.
  const auto count = checked_product(header.shape);
  const bool representable =
      count.has_value() && *count <= std::numeric_limits<std::uint64_t>::max() / dtype.item_size;
  const std::uint64_t data_bytes = representable ? *count * dtype.item_size : 0;
  if (!representable || data_bytes > in.remaining())
    fail(file,
         "truncated: shape " + shape_string(header.shape) + " of '" + header.descr + "' needs " +
             (representable ? std::to_string(data_bytes) : std::string("more than 2^64")) +
             " bytes of data, the file has " + std::to_string(in.remaining()) + " after the header",
         "the file is incomplete or its header is wrong; write it again with numpy.save()");
  if (data_bytes < in.remaining())
    fail(file,
         "has " + std::to_string(in.remaining() - data_bytes) +
             " unexpected bytes after the data of shape " + shape_string(header.shape) + " of '" +
             header.descr + "'",
         "the header does not describe the data; write the file again with numpy.save()");
  NpyArray array{dtype, std::move(header.shape), {}, in.offset()};
  array.bytes = in.read_bytes(data_bytes, "the array data");
  if (header.fortran_order) array.bytes = to_c_order(array.bytes, array.shape, dtype.item_size);
  return array;
}

// The features of `fx`, checked and converted to float32 (y left empty).
Dataset npy_features(const fs::path& features, const NpyArray& fx, bool keep_bytes) {
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
  Dataset data;
  data.rows = static_cast<std::int64_t>(fx.shape[0]);
  data.features = static_cast<std::int64_t>(width);
  const std::size_t values = static_cast<std::size_t>(fx.shape[0] * width);
  const unsigned char* src = fx.bytes.data();
  if (fx.shape.size() == 3)
    data.sample_shape = {1, static_cast<std::int64_t>(fx.shape[1]),
                         static_cast<std::int64_t>(fx.shape[2])};
  if (fx.shape.size() == 4)
    data.sample_shape = {static_cast<std::int64_t>(fx.shape[1]),
                         static_cast<std::int64_t>(fx.shape[2]),
                         static_cast<std::int64_t>(fx.shape[3])};
  if (fx.dtype.kind == 'u') {
    store_image_bytes(data, std::vector<std::uint8_t>(src, src + values), keep_bytes);
    return data;  // bytes are finite
  }
  data.x.resize(values);
  if (fx.dtype.item_size == 4) {
    for (std::size_t i = 0; i < values; ++i)
      data.x[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load_le(src + 4 * i, 4)));
  } else {
    for (std::size_t i = 0; i < values; ++i)
      data.x[i] = static_cast<float>(std::bit_cast<double>(load_le(src + 8 * i, 8)));
  }
  for (std::size_t i = 0; i < values; ++i) {
    if (!std::isfinite(data.x[i]))
      fail(
          features,
          std::string("feature [") + std::to_string(i / width) + ", " + std::to_string(i % width) +
              "] is " +
              (std::isnan(data.x[i]) ? "NaN" : "infinite (or a float64 beyond the float32 range)") +
              ", expected a finite number",
          "clean or impute the data before saving it (e.g. numpy.nan_to_num)");
  }

  return data;
}

}  // namespace

// ---- .npy -----------------------------------------------------------------------------------

Dataset load_npy_features(const fs::path& features, bool keep_bytes) {
  return npy_features(features, read_npy(features, /*for_labels=*/false), keep_bytes);
}

Dataset load_npy(const fs::path& features, const fs::path& labels, std::int32_t classes,
                 bool channels_last, bool keep_bytes) {
  NpyArray fx = read_npy(features, /*for_labels=*/false);
  Dataset data = npy_features(features, fx, keep_bytes);
  if (channels_last && fx.shape.size() == 4) channels_last_to_first(data);
  NpyArray fy = read_npy(labels, /*for_labels=*/true);
  if (!(fy.shape.size() == 1 || (fy.shape.size() == 2 && fy.shape[1] == 1)))
    fail(labels, "labels have shape " + shape_string(fy.shape) + ", expected [N] (or [N, 1])",
         "save one integer class index per sample: np.save(path, y.reshape(-1))");
  require_rows(labels, fy.shape[0]);
  check_row_counts(features, fx.shape[0], labels, fy.shape[0]);

  data.y.resize(static_cast<std::size_t>(data.rows));
  const std::size_t item = fy.dtype.item_size;
  const bool is_signed = fy.dtype.kind == 'i';
  auto at_offset = [&](std::size_t row) {
    return " (byte offset " + std::to_string(fy.data_offset + row * item) + ")";
  };
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
      fail(labels,
           "label " + std::to_string(value) + " of row " + std::to_string(i) + at_offset(i) +
               " is negative, expected a class index >= 0",
           "labels must be class indices 0, 1, 2, ...");
    if (too_large || value > std::numeric_limits<std::int32_t>::max() - 1)
      fail(labels,
           "label of row " + std::to_string(i) + at_offset(i) + " is " +
               (too_large ? std::to_string(raw) : std::to_string(value)) +
               ", too large for a class index",
           "labels must be class indices 0, 1, 2, ...");
    data.y[i] = static_cast<std::int32_t>(value);
  }
  set_classes(labels, data, classes, fy.data_offset, item);
  finish(features, labels, data);
  return data;
}

}  // namespace mixtrain::core
