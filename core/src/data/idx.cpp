// Loader for MNIST IDX files, plain or gzip-compressed (as MNIST ships them).
//
// Sizes are checked before anything is allocated: a plain file's data against the file size, a
// compressed file's against what deflate can expand its size to; then exactly the declared bytes
// are decompressed, so a decompression bomb is cut off at what its header declares.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "data/byte_images.h"
#include "data/file_support.h"
#include "data/gzip_reader.h"
#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;
using namespace data_files;

// deflate's largest expansion (runs of one byte): about 1032 output bytes per input byte.
constexpr std::uint64_t kMaxDeflateRatio = 1032;
// Decompressed data is appended in pieces of this size, so memory follows the real data, not
// only the header's claim.
constexpr std::uint64_t kGzipPiece = std::uint64_t{16} << 20;

struct IdxArray {
  std::vector<std::uint64_t> shape;
  std::vector<unsigned char> bytes;
};

// The bytes of one IDX file as read_idx() consumes them: the header, then exactly the data.
class IdxInput {
 public:
  virtual ~IdxInput() = default;
  // Exactly n bytes of the header, or a "truncated" DataError.
  virtual void header(void* out, std::uint64_t n, std::string_view what) = 0;
  // Exactly `total` data bytes, which must end the file (shape is for messages).
  virtual std::vector<unsigned char> data(std::uint64_t total, const std::string& shape) = 0;
};

class PlainIdx final : public IdxInput {
 public:
  explicit PlainIdx(const fs::path& file) : file_(file), in_(file) {
    if (in_.size() < 4)
      fail(file, "too small to be an IDX file (" + std::to_string(in_.size()) + " bytes)",
           "download the MNIST-style IDX file again");
  }
  void header(void* out, std::uint64_t n, std::string_view what) override {
    in_.read(out, n, what);
  }
  std::vector<unsigned char> data(std::uint64_t total, const std::string& shape) override {
    if (total > in_.remaining())
      fail(file_,
           "truncated: shape " + shape + " needs " + std::to_string(total) +
               " bytes of data, the file has " + std::to_string(in_.remaining()) +
               " after the header",
           "the file is incomplete; download or decompress it again");
    if (total < in_.remaining())
      fail(file_,
           "has " + std::to_string(in_.remaining() - total) +
               " unexpected bytes after the data of shape " + shape,
           "the header does not describe the data; download the file again");
    return in_.read_bytes(total, "the pixel data");
  }

 private:
  fs::path file_;
  FileReader in_;
};

class GzipIdx final : public IdxInput {
 public:
  GzipIdx(const fs::path& file, std::uint64_t compressed_size)
      : file_(file), compressed_size_(compressed_size), in_(file) {}

  void header(void* out, std::uint64_t n, std::string_view what) override {
    const std::uint64_t got = in_.read(out, n, what);
    if (got < n)
      fail(file_,
           "truncated while reading " + std::string(what) + ": the decompressed data ends after " +
               std::to_string(in_.offset()) + " bytes",
           "the file is incomplete; download it again");
  }

  std::vector<unsigned char> data(std::uint64_t total, const std::string& shape) override {
    const std::uint64_t header_bytes = in_.offset();
    const std::uint64_t most =
        compressed_size_ > std::numeric_limits<std::uint64_t>::max() / kMaxDeflateRatio
            ? std::numeric_limits<std::uint64_t>::max()
            : compressed_size_ * kMaxDeflateRatio;
    if (total > most - std::min(most, header_bytes))
      fail(file_,
           "shape " + shape + " declares " + std::to_string(total) +
               " bytes of data, more than a gzip file of " + std::to_string(compressed_size_) +
               " bytes can decompress to",
           "the header is damaged or the file is incomplete; download it again");
    std::vector<unsigned char> bytes;
    while (bytes.size() < total) {
      const std::uint64_t at = bytes.size();
      const std::uint64_t piece = std::min(total - at, kGzipPiece);
      bytes.resize(static_cast<std::size_t>(at + piece));
      const std::uint64_t got = in_.read(bytes.data() + at, piece, "the pixel data");
      if (got < piece)
        fail(file_,
             "truncated: shape " + shape + " needs " + std::to_string(total) +
                 " bytes of data, the decompressed file has " + std::to_string(at + got) +
                 " after the header",
             "the file is incomplete; download it again");
    }
    unsigned char extra = 0;
    if (in_.read(&extra, 1, "the end of the data") != 0)
      fail(file_, "has unexpected bytes after the data of shape " + shape,
           "the header does not describe the data; download the file again");
    return bytes;
  }

 private:
  fs::path file_;
  std::uint64_t compressed_size_;
  GzipReader in_;
};

// gzip by its magic bytes (1f 8b), whatever the file is called.
std::unique_ptr<IdxInput> open_idx(const fs::path& file) {
  FileReader probe(file);
  unsigned char magic[2] = {0, 0};
  if (probe.size() >= 2) probe.read(magic, 2, "the magic");
  if (magic[0] == 0x1f && magic[1] == 0x8b) return std::make_unique<GzipIdx>(file, probe.size());
  return std::make_unique<PlainIdx>(file);
}

IdxArray read_idx(const fs::path& file, bool for_labels) {
  auto in = open_idx(file);
  unsigned char magic[4];
  in->header(magic, 4, "the IDX magic");
  const std::string expected =
      for_labels ? "0x00000801 (u8 labels [N])" : "0x00000803 (u8 images [N, H, W])";
  char found_hex[16];
  std::snprintf(found_hex, sizeof found_hex, "0x%02x%02x%02x%02x", magic[0], magic[1], magic[2],
                magic[3]);
  if (magic[0] != 0 || magic[1] != 0)
    fail(file, std::string("bad magic: expected ") + expected + ", found " + found_hex,
         "is this an IDX file? the MNIST files are train-images-idx3-ubyte / "
         "train-labels-idx1-ubyte (optionally .gz)");
  if (magic[2] != 0x08)
    fail(file,
         std::string("element type in magic ") + found_hex +
             " is not unsigned byte (0x08), expected " + expected,
         "only u8 IDX files (MNIST, Fashion-MNIST, EMNIST) are supported");
  const int rank = magic[3];
  const bool rank_ok = for_labels ? rank == 1 : (rank >= 2 && rank <= 4);
  if (!rank_ok)
    fail(file,
         std::string("magic ") + found_hex + " declares rank " + std::to_string(rank) +
             ", expected " + expected,
         "did you swap the images and labels files?");
  IdxArray array;
  for (int d = 0; d < rank; ++d) {
    unsigned char dim[4];
    in->header(dim, 4, "the dimension sizes");
    array.shape.push_back(load_be(dim, 4));
  }
  require_rows(file, array.shape[0]);
  const auto product = checked_product(array.shape);
  if (!product.has_value())
    fail(file,
         "truncated: shape " + shape_string(array.shape) + " needs more than 2^64 bytes of data",
         "the header is damaged; download the file again");
  if (*product == 0)
    fail(file, "shape " + shape_string(array.shape) + " holds no values",
         "each sample needs at least one pixel");
  array.bytes = in->data(*product, shape_string(array.shape));
  return array;
}

// The images of `fx`, channels-first (y left empty): bytes (keep_bytes) or float32 in [0, 1].
Dataset idx_images(const IdxArray& fx, bool keep_bytes) {
  Dataset data;
  data.rows = static_cast<std::int64_t>(fx.shape[0]);
  data.features = static_cast<std::int64_t>(fx.bytes.size() / fx.shape[0]);
  const auto& shape = fx.shape;
  std::vector<std::uint8_t> pixels(fx.bytes.begin(), fx.bytes.end());
  if (shape.size() == 4) {
    // [N, H, W, C] channels-last → [N, C, H, W]: pixel (h, w, c) moves to c·H·W + h·W + w.
    const auto H = shape[1], W = shape[2], C = shape[3];
    data.sample_shape = {static_cast<std::int64_t>(C), static_cast<std::int64_t>(H),
                         static_cast<std::int64_t>(W)};
    const std::size_t width = static_cast<std::size_t>(data.features);
    for (std::size_t r = 0; r < static_cast<std::size_t>(data.rows); ++r) {
      const unsigned char* in = fx.bytes.data() + r * width;
      std::uint8_t* out = pixels.data() + r * width;
      for (std::uint64_t h = 0; h < H; ++h)
        for (std::uint64_t w = 0; w < W; ++w)
          for (std::uint64_t c = 0; c < C; ++c) out[(c * H + h) * W + w] = in[(h * W + w) * C + c];
    }
  } else if (shape.size() == 3) {
    data.sample_shape = {1, static_cast<std::int64_t>(shape[1]),
                         static_cast<std::int64_t>(shape[2])};
  }
  store_image_bytes(data, std::move(pixels), keep_bytes);
  return data;
}

}  // namespace

Dataset load_idx_images(const fs::path& images, bool keep_bytes) {
  return idx_images(read_idx(images, /*for_labels=*/false), keep_bytes);
}

Dataset load_idx(const fs::path& images, const fs::path& labels, std::int32_t classes,
                 bool keep_bytes) {
  IdxArray fx = read_idx(images, /*for_labels=*/false);
  IdxArray fy = read_idx(labels, /*for_labels=*/true);
  check_row_counts(images, fx.shape[0], labels, fy.shape[0]);
  Dataset data = idx_images(fx, keep_bytes);
  data.y.assign(fy.bytes.begin(), fy.bytes.end());
  set_classes(labels, data, classes);
  finish(images, labels, data);
  return data;
}

}  // namespace mixtrain::core
