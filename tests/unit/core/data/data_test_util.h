// Helpers for the data tests: a scratch directory and raw file writers that are independent of
// the loaders under test (so a loader bug cannot be hidden by a matching writer bug).
#pragma once

#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace mixtrain::test {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

class ScratchDir {
 public:
  ScratchDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("mixtrain_data_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

template <class T>
void append_le(Bytes& out, T value) {
  unsigned char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // the test hosts are little-endian
  out.insert(out.end(), raw, raw + sizeof(T));
}

inline std::string shape_literal(const std::vector<std::uint64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) s += ", ";
  }
  return s + ")";
}

// A .npy file exactly as numpy.save writes it: magic, version, header padded to 64 bytes.
inline Bytes npy_bytes(const std::string& header_dict, const Bytes& data, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = header_dict;
  const std::size_t total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
  if (major == 1) {
    append_le(out, static_cast<std::uint16_t>(header.size()));
  } else {
    append_le(out, static_cast<std::uint32_t>(header.size()));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline std::string npy_dict(const std::string& descr, const std::vector<std::uint64_t>& shape,
                            bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape_literal(shape) + ", }";
}

template <class T>
Bytes le_array(const std::vector<T>& values) {
  Bytes out;
  for (const T& v : values) append_le(out, v);
  return out;
}

// Runs `body`, expects sdk::DataError, and checks the message names `file` and that the message
// or its hint contains every fragment in `contains`.
inline void expect_data_error(const std::function<void()>& body, const std::string& file,
                              const std::vector<std::string>& contains = {}) {
  try {
    body();
    ADD_FAILURE() << "expected sdk::DataError mentioning " << file;
  } catch (const sdk::DataError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(file), std::string::npos) << "message lacks the file name: " << message;
    const std::string full = e.full_message();
    for (const auto& fragment : contains)
      EXPECT_NE(full.find(fragment), std::string::npos)
          << "message and hint lack \"" << fragment << "\": " << full;
    EXPECT_FALSE(e.hint().empty()) << "no hint for: " << message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected sdk::DataError, got another exception: " << e.what();
  }
}

}  // namespace mixtrain::test
