// Small .npy files for the integration tests, written and read without the code under test:
// float32 and int64 arrays in NumPy's format 1.0 (header padded to 64 bytes), and float32 arrays
// read back with their shape.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace mixtrain::test {

template <class T>
void write_npy(const std::filesystem::path& path, const std::string& descr,
               const std::vector<std::int64_t>& shape, const std::vector<T>& values) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i)
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
  dict += "), }";
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::ofstream out(path, std::ios::binary);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(reinterpret_cast<const char*>(magic), 8);
  const unsigned char len[2] = {static_cast<unsigned char>(dict.size() & 0xFF),
                                static_cast<unsigned char>(dict.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out << dict;
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(T)));
}

// `rows` uint8 images [rows, 32, 32, 3] in torchvision's CIFAR-10 layout (channels last) at
// `images`, and their int64 labels [rows] at `labels`: class c is a colour of its own (its
// channel values differ by class) under uniform noise, so a small CNN learns it in a few steps.
inline void write_cifar_layout_images(const std::filesystem::path& images,
                                      const std::filesystem::path& labels, int rows,
                                      int classes = 10) {
  std::vector<std::uint8_t> pixels;
  std::vector<std::int64_t> y;
  std::uint32_t state = 12345;
  auto noise = [&state] {
    state = state * 1664525u + 1013904223u;  // a fixed LCG: the same files on every machine
    return static_cast<int>(state >> 26);    // 0..63
  };
  for (int r = 0; r < rows; ++r) {
    const int c = r % classes;
    y.push_back(c);
    const int base[3] = {(c * 97) % 192, (c * 53 + 40) % 192, (c * 29 + 80) % 192};
    for (int p = 0; p < 32 * 32; ++p)
      for (int ch = 0; ch < 3; ++ch)
        pixels.push_back(static_cast<std::uint8_t>(base[ch] + noise()));
  }
  write_npy(images, "|u1", {rows, 32, 32, 3}, pixels);
  write_npy(labels, "<i8", {rows}, y);
}

struct NpyFloats {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
  std::string descr;
};

// A float32 .npy (little-endian hosts); shape empty when the file is not one.
inline NpyFloats read_npy_floats(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  NpyFloats out;
  if (bytes.size() < 10 || bytes.compare(1, 5, "NUMPY") != 0) return out;
  const std::size_t header =
      10 + (static_cast<unsigned char>(bytes[8]) |
            static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  const std::string dict = bytes.substr(10, header - 10);
  const auto d = dict.find("'descr': ");
  out.descr = dict.substr(d + 9, dict.find(", 'fortran_order'") - d - 9);
  auto p = dict.find("'shape': (") + 10;
  while (p < dict.size() && dict[p] != ')') {
    std::size_t used = 0;
    out.shape.push_back(std::stoll(dict.substr(p), &used));
    p += used;
    while (p < dict.size() && (dict[p] == ',' || dict[p] == ' ')) ++p;
  }
  out.values.resize((bytes.size() - header) / 4);
  std::memcpy(out.values.data(), bytes.data() + header, out.values.size() * 4);
  return out;
}

}  // namespace mixtrain::test
