// What the JPEG and PNG readers of data/image_folder/ share (internal): the DataError every failure
// is, the size checks, and two readers with one interface, a file read by parts (a header is read
// without the image) and bytes already in memory, so that each header parser serves both.
//
// Contract: every failure is an sdk::DataError "image file '<name>': <what>" with a hint
// (kRewriteHint for damage, kReplaceHint for what mixtrain does not read); neither reader reads
// past the end (that is "is truncated: it ends inside the <what>").
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "data/image_folder/image_file.h"

namespace mixtrain::core::image_files {

// A compressed image larger than this is no photograph a loader should hold in memory; reading
// it whole would be the allocation the size limits exist to prevent.
inline constexpr std::uint64_t kMaxImageFileBytes = std::uint64_t{1} << 30;

inline constexpr const char* kReplaceHint =
    "convert the file to a JPEG or a PNG (e.g. with ImageMagick: convert in out.png), or "
    "remove it from the image folder";
inline constexpr const char* kRewriteHint =
    "the file is damaged or incomplete; copy or download it again, or remove it from the image "
    "folder";

[[noreturn]] void fail(std::string_view origin, const std::string& what, const std::string& hint);

// Refuses a side of 0 and sizes past kMaxImageSide / kMaxImagePixels, before any pixel exists.
void check_size(std::string_view origin, std::int64_t width, std::int64_t height);

class ImageFileStream {
 public:
  explicit ImageFileStream(const std::filesystem::path& file) : name_(file.string()) {
    std::error_code ec;
    const auto status = std::filesystem::status(file, ec);
    if (!std::filesystem::exists(status))
      fail(name_, "no such file", "check the image folder's path");
    if (std::filesystem::is_directory(status))
      fail(name_, "is a directory, expected an image file", "remove it from the image folder");
    size_ = std::filesystem::file_size(file, ec);
    if (ec)
      fail(name_, "cannot determine the file size (" + ec.message() + ")",
           "check that the file is readable by this user");
    errno = 0;
    stream_.open(file, std::ios::binary);
    if (!stream_) {
      const int err = errno;
      fail(name_, std::string("cannot open: ") + (err != 0 ? std::strerror(err) : "unknown error"),
           "check that the file is readable by this user");
    }
  }

  const std::string& name() const { return name_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t offset() const { return offset_; }

  // Up to n bytes (fewer only at the end of the file).
  std::size_t read_some(std::uint8_t* out, std::size_t n) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(n, size_ - offset_));
    if (want == 0) return 0;
    stream_.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(want));
    const auto got = static_cast<std::size_t>(stream_.gcount());
    if (got != want)
      fail(name_, "read error at offset " + std::to_string(offset_),
           "the file may have changed while it was read, or the disk has an error");
    offset_ += got;
    return got;
  }

  void read_exact(std::uint8_t* out, std::size_t n, std::string_view what) {
    if (read_some(out, n) != n)
      fail(name_, "is truncated: it ends inside the " + std::string(what), kRewriteHint);
  }

  void rewind() {
    stream_.clear();
    stream_.seekg(0);
    offset_ = 0;
  }

  void skip(std::uint64_t n, std::string_view what) {
    if (n > size_ - offset_)
      fail(name_, "is truncated: it ends inside the " + std::string(what), kRewriteHint);
    offset_ += n;
    stream_.seekg(static_cast<std::streamoff>(offset_));
  }

 private:
  std::string name_;
  std::ifstream stream_;
  std::uint64_t size_ = 0, offset_ = 0;
};

// The whole file, refused past kMaxImageFileBytes.
std::vector<std::uint8_t> read_whole(ImageFileStream& in);

// Bytes already in memory with ImageFileStream's reading interface, so the header parser is one
// for files and buffers.
class ByteReader {
 public:
  ByteReader(std::span<const std::uint8_t> bytes, std::string_view name)
      : bytes_(bytes), name_(name) {}
  const std::string& name() const { return name_; }
  std::uint64_t offset() const { return offset_; }
  void read_exact(std::uint8_t* out, std::size_t n, std::string_view what) {
    if (n > bytes_.size() - offset_)
      fail(name_, "is truncated: it ends inside the " + std::string(what), kRewriteHint);
    std::memcpy(out, bytes_.data() + offset_, n);
    offset_ += n;
  }
  void skip(std::uint64_t n, std::string_view what) {
    if (n > bytes_.size() - offset_)
      fail(name_, "is truncated: it ends inside the " + std::string(what), kRewriteHint);
    offset_ += static_cast<std::size_t>(n);
  }

 private:
  std::span<const std::uint8_t> bytes_;
  std::string name_;
  std::size_t offset_ = 0;
};

}  // namespace mixtrain::core::image_files
