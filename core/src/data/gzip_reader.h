// GzipReader: the decompressed bytes of a gzip file, through zlib, in pieces the caller sizes
// (internal to the core; the IDX loader reads MNIST's .gz files with it).
//
// Contract: read() decompresses at most the bytes asked for (plus zlib's fixed-size buffers), so
// a caller that bounds its requests bounds the memory a decompression bomb can take. It returns
// fewer bytes only at the end of the compressed data; a stream cut short, corrupt data or a
// CRC / length mismatch in the trailer throws sdk::DataError naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

namespace mixtrain::core::data_files {

class GzipReader {
 public:
  explicit GzipReader(const std::filesystem::path& path);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Up to n decompressed bytes into out; `what` names them in errors ("the pixel data").
  std::uint64_t read(void* out, std::uint64_t n, std::string_view what);
  std::uint64_t offset() const { return offset_; }  // decompressed bytes read so far

 private:
  std::filesystem::path path_;
  void* file_ = nullptr;  // gzFile
  std::uint64_t offset_ = 0;
};

}  // namespace mixtrain::core::data_files
