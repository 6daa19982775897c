#include "data/gzip_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "data/file_support.h"

namespace mixtrain::core::data_files {

namespace fs = std::filesystem;

GzipReader::GzipReader(const fs::path& path) : path_(path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    fail(path, std::string("cannot open: ") + (err != 0 ? std::strerror(err) : "out of memory"),
         "check that the file exists and is readable by this user");
  }
  file_ = f;
}

GzipReader::~GzipReader() {
  if (file_ != nullptr) gzclose_r(static_cast<gzFile>(file_));
}

std::uint64_t GzipReader::read(void* out, std::uint64_t n, std::string_view what) {
  auto* f = static_cast<gzFile>(file_);
  auto* dst = static_cast<unsigned char*>(out);
  std::uint64_t done = 0;
  while (done < n) {
    // gzread takes an unsigned and returns an int: ask for at most 1 GiB at a time.
    const auto want = static_cast<unsigned>(std::min<std::uint64_t>(n - done, 1u << 30));
    const int got = gzread(f, dst + done, want);
    int code = Z_OK;
    const char* message = gzerror(f, &code);
    if (got < 0 || (code != Z_OK && code != Z_BUF_ERROR))
      fail(path_,
           "corrupt gzip data while reading " + std::string(what) + " at decompressed offset " +
               std::to_string(offset_ + done) + " (zlib: " + message + ")",
           "the file is damaged; download it again");
    done += static_cast<std::uint64_t>(got);
    if (static_cast<unsigned>(got) < want) {
      // Z_BUF_ERROR at the end: the input stopped inside the gzip stream.
      if (code == Z_BUF_ERROR)
        fail(path_,
             "truncated gzip stream while reading " + std::string(what) +
                 " at decompressed offset " + std::to_string(offset_ + done),
             "the download is incomplete; download the file again");
      break;
    }
  }
  offset_ += done;
  return done;
}

}  // namespace mixtrain::core::data_files
