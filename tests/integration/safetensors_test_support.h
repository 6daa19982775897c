// safetensors files as the integration tests read and edit them: the header's metadata and each
// tensor's name, dtype, shape and raw bytes, listed by name (the header is parsed as a sorted
// object). A test helper, not a validating reader: the files come from the test or from mixtrain's
// writer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cli_test_support.h"

namespace mixtrain::test {

struct StTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

struct StFile {
  json metadata = json::object();
  std::vector<StTensor> tensors;

  StTensor* find(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

// An F32 tensor's values (a test failure when it is another dtype).
inline std::vector<float> st_floats(const StTensor& t) {
  EXPECT_EQ(t.dtype, "F32") << t.name;
  std::vector<float> v(t.bytes.size() / sizeof(float));
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

// max |a - b| over max(1, max |b|): a difference relative to the values' scale, absolute for
// values below 1.
inline double scaled_gap(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return 1.0;
  double g = 0, scale = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    g = std::max(g, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return g / scale;
}

inline StFile read_st(const fs::path& path) {
  const std::string blob = slurp(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(blob.at(std::size_t(i)));
  const auto header = json::parse(blob.substr(8, n));
  StFile f;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      f.metadata = v;
      continue;
    }
    const auto b = v["data_offsets"][0].get<std::size_t>(),
               e = v["data_offsets"][1].get<std::size_t>();
    f.tensors.push_back({name, v["dtype"], v["shape"].get<std::vector<std::int64_t>>(),
                         blob.substr(8 + n + b, e - b)});
  }
  return f;
}

inline void write_st(const fs::path& path, const StFile& f) {
  json header = json::object();
  if (!f.metadata.empty()) header["__metadata__"] = f.metadata;
  std::size_t offset = 0;
  std::string data;
  for (const auto& t : f.tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
    data += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string blob(8, '\0');
  for (int i = 0; i < 8; ++i)
    blob[std::size_t(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  std::ofstream(path, std::ios::binary) << blob << text << data;
}

}  // namespace mixtrain::test
