// Loader for the CIFAR-10 binary batches (https://www.cs.toronto.edu/~kriz/cifar.html, "binary
// version"): data_batch_1.bin … data_batch_5.bin and test_batch.bin, each a plain sequence of
// 3073-byte records — one label byte, then the 32×32 red, green and blue planes, row-major.
//
// Every file's size is checked before anything is allocated; the records are then read in pieces,
// so memory holds the float images and one piece, never a second copy of the files.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "data/byte_images.h"
#include "data/file_support.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;
using namespace data_files;

constexpr std::uint64_t kSide = 32, kChannels = 3;
constexpr std::uint64_t kPixels = kChannels * kSide * kSide;  // 3072
constexpr std::uint64_t kRecord = 1 + kPixels;                // 3073
constexpr std::int32_t kClasses = 10;
constexpr std::uint64_t kPieceRecords = 1024;  // about 3 MiB read at a time

const char* const kCifarHint =
    "use the \"CIFAR-10 binary version\" (cifar-10-binary.tar.gz): data_batch_1.bin … "
    "data_batch_5.bin and test_batch.bin, each 10000 records of 3073 bytes";

// The number of whole records in `file`, or a DataError for a size that is not one.
std::uint64_t record_count(const fs::path& file, const FileReader& in) {
  const std::uint64_t size = in.size();
  if (size == 0) fail(file, "is empty, expected 3073-byte CIFAR-10 records", kCifarHint);
  // Files of the neighbouring formats are named for what they are, not called truncated.
  if (size % kRecord != 0 && size % (kRecord + 1) == 0)
    fail(file,
         "holds " + std::to_string(size) + " bytes, a whole number of 3074-byte records: the "
             "CIFAR-100 binary format (a coarse and a fine label byte per record), which this "
             "source does not read",
         kCifarHint);
  if (size % kRecord != 0 && size >= 2) {
    FileReader peek(file);
    const auto head = peek.read_bytes(2, "the first bytes");
    if (head[0] == 0x80 && head[1] >= 2 && head[1] <= 5)
      fail(file,
           "is a Python pickle (the \"CIFAR-10 python version\", cifar-10-python.tar.gz), not "
           "the binary records this source reads",
           kCifarHint);
  }
  if (size % kRecord != 0) {
    const std::uint64_t whole = size / kRecord;
    fail(file,
         "truncated: " + std::to_string(size) + " bytes are not a whole number of " +
             std::to_string(kRecord) + "-byte records; record " + std::to_string(whole) +
             " starts at byte offset " + std::to_string(whole * kRecord) + " and has only " +
             std::to_string(size - whole * kRecord) + " bytes",
         "the file is incomplete; download and unpack cifar-10-binary.tar.gz again");
  }
  return size / kRecord;
}

}  // namespace

Dataset load_cifar10(std::span<const fs::path> files, bool keep_bytes) {
  if (files.empty())
    throw sdk::DataError("CIFAR-10: no batch files given",
                         "set data.cifar10.path to the cifar-10-batches-bin folder, or list the "
                         "files in data.cifar10.train");
  std::vector<std::uint64_t> counts;
  std::uint64_t total = 0;
  for (const auto& file : files) {
    FileReader in(file);
    counts.push_back(record_count(file, in));
    total += counts.back();
  }
  Dataset data;
  data.rows = static_cast<std::int64_t>(total);
  data.features = static_cast<std::int64_t>(kPixels);
  data.classes = kClasses;
  data.sample_shape = {static_cast<std::int64_t>(kChannels), static_cast<std::int64_t>(kSide),
                       static_cast<std::int64_t>(kSide)};
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(total * kPixels));
  data.y.resize(static_cast<std::size_t>(total));
  std::vector<unsigned char> piece;
  std::uint64_t row = 0;
  for (std::size_t f = 0; f < files.size(); ++f) {
    FileReader in(files[f]);
    // The size was checked above; a file that changed since is caught by read()'s own checks.
    for (std::uint64_t start = 0; start < counts[f]; start += kPieceRecords) {
      const std::uint64_t n = std::min(kPieceRecords, counts[f] - start);
      piece.resize(static_cast<std::size_t>(n * kRecord));
      in.read(piece.data(), n * kRecord, "CIFAR-10 records");
      for (std::uint64_t k = 0; k < n; ++k, ++row) {
        const unsigned char* record = piece.data() + k * kRecord;
        const std::uint64_t index = start + k;
        if (record[0] >= kClasses)
          fail(files[f],
               "record " + std::to_string(index) + " (byte offset " +
                   std::to_string(index * kRecord) + ") has label " + std::to_string(record[0]) +
                   ", expected a class in [0, 10)",
               "this is not a CIFAR-10 file (CIFAR-100's binary records have two label bytes); " +
                   std::string(kCifarHint));
        data.y[static_cast<std::size_t>(row)] = record[0];
        std::memcpy(pixels.data() + row * kPixels, record + 1, kPixels);
      }
    }
  }
  store_image_bytes(data, std::move(pixels), keep_bytes);
  check_dataset(data,
                "CIFAR-10 file '" + files.front().string() + "'" +
                    (files.size() > 1 ? " + " + std::to_string(files.size() - 1) + " more files"
                                      : std::string()));
  return data;
}

namespace {

void check_cifar_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw sdk::DataError("CIFAR-10 folder '" + dir.string() +
                             "': " + (fs::exists(dir, ec) ? "is not a folder" : "no such folder"),
                         "set data.cifar10.path to the cifar-10-batches-bin folder unpacked from "
                         "cifar-10-binary.tar.gz");
}

std::vector<fs::path> held_out_batch(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "test_batch.bin", ec))
    throw sdk::DataError(
        "CIFAR-10 folder '" + dir.string() + "': no test_batch.bin (the held-out batch)",
        std::string(kCifarHint) +
            "; or list the files in data.cifar10.train and data.cifar10.eval");
  return {dir / "test_batch.bin"};
}

}  // namespace

std::vector<fs::path> cifar10_held_out_files(const fs::path& dir) {
  check_cifar_folder(dir);
  return held_out_batch(dir);
}

std::pair<std::vector<fs::path>, std::vector<fs::path>> cifar10_files(const fs::path& dir) {
  check_cifar_folder(dir);
  std::error_code ec;
  std::vector<fs::path> train;
  std::string looked_for;
  for (int i = 1; i <= 5; ++i) {
    const auto name = "data_batch_" + std::to_string(i) + ".bin";
    looked_for += (i > 1 ? ", " : "") + name;
    if (fs::is_regular_file(dir / name, ec)) train.push_back(dir / name);
  }
  if (train.empty())
    throw sdk::DataError("CIFAR-10 folder '" + dir.string() +
                             "': holds none of the training "
                             "batches (looked for " +
                             looked_for + ")",
                         kCifarHint);
  return {std::move(train), held_out_batch(dir)};
}

}  // namespace mixtrain::core
