// numpy's float16 and torch's bfloat16 as independent implementations of the same roundings.
// They import only under Debian's /usr/bin/python3 (the first python3 on PATH is another one);
// where that interpreter or a module is missing the test is skipped and says why.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "formats_test_util.h"

namespace {

using namespace formats_test;
namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";

// Empty when usable, otherwise the reason to skip.
std::string python_missing(const std::string& module) {
  if (!fs::exists(kPython)) return std::string(kPython) + " does not exist";
  const std::string cmd = std::string(kPython) + " -c 'import " + module + "' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) return std::string(kPython) + " cannot import " + module;
  return {};
}

struct TempDir {
  fs::path path = fs::temp_directory_path() /
                  ("mixtrain_formats_" + std::to_string(::getpid()) + "_" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

template <class T>
void write_file(const fs::path& p, const std::vector<T>& v) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  ASSERT_TRUE(out.good()) << p;
}

template <class T>
std::vector<T> read_file(const fs::path& p, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream in(p, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  EXPECT_EQ(static_cast<std::size_t>(in.gcount()), n * sizeof(T)) << p << " is short";
  return v;
}

void run_python(const fs::path& dir, const std::string& script) {
  const fs::path py = dir / "convert.py";
  std::ofstream(py) << script;
  const std::string cmd = std::string(kPython) + " " + py.string() + " " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "failed: " << cmd;
}

// Inputs: the stress sample plus every fp16 / bf16 value and the midpoints next to them.
std::vector<float> inputs() {
  std::vector<float> xs = stress_sample(1'000'000, 0x9E3779B9);
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    xs.push_back(sdk::decode_fp16(static_cast<std::uint16_t>(c)));
    xs.push_back(sdk::decode_bf16(static_cast<std::uint16_t>(c)));
  }
  return xs;
}

TEST(FormatsPython, NumpyFloat16AgreesBitForBit) {
  if (const std::string why = python_missing("numpy"); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::vector<float> xs = inputs();
  std::vector<std::uint16_t> codes(0x10000);
  for (std::uint32_t c = 0; c < codes.size(); ++c) codes[c] = static_cast<std::uint16_t>(c);
  write_file(tmp.path / "x.f32", xs);
  write_file(tmp.path / "codes.u16", codes);
  run_python(tmp.path, R"(import sys, numpy as np
d = sys.argv[1]
x = np.fromfile(d + '/x.f32', dtype=np.float32)
with np.errstate(all='ignore'):
    x.astype(np.float16).view(np.uint16).tofile(d + '/enc.u16')
    np.fromfile(d + '/codes.u16', dtype=np.uint16).view(np.float16).astype(np.float32).tofile(d + '/dec.f32')
)");
  const auto enc = read_file<std::uint16_t>(tmp.path / "enc.u16", xs.size());
  std::size_t bad = 0, nans = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::uint16_t ours = sdk::encode_fp16(xs[i]);
    if (std::isnan(xs[i])) {
      // numpy keeps signalling NaNs signalling; both must still be NaNs of the same sign.
      ++nans;
      if (!is_nan_code(kFp16, enc[i]) || (enc[i] & 0x8000) != (ours & 0x8000)) ++bad;
    } else if (enc[i] != ours && ++bad <= 5) {
      ADD_FAILURE() << "x=0x" << std::hex << bits_of(xs[i]) << " numpy 0x" << enc[i] << " ours 0x" << ours;
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(nans, 0u);
  const auto dec = read_file<float>(tmp.path / "dec.f32", codes.size());
  for (std::uint32_t c = 0; c < codes.size(); ++c) {
    const float ours = sdk::decode_fp16(static_cast<std::uint16_t>(c));
    if (std::isnan(ours)) ASSERT_TRUE(std::isnan(dec[c])) << std::hex << c;
    else ASSERT_EQ(bits_of(dec[c]), bits_of(ours)) << "code 0x" << std::hex << c;
  }
}

TEST(FormatsPython, TorchBfloat16AgreesBitForBit) {
  if (const std::string why = python_missing("torch"); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::vector<float> xs = inputs();
  std::vector<std::uint16_t> codes(0x10000);
  for (std::uint32_t c = 0; c < codes.size(); ++c) codes[c] = static_cast<std::uint16_t>(c);
  write_file(tmp.path / "x.f32", xs);
  write_file(tmp.path / "codes.u16", codes);
  run_python(tmp.path, R"(import sys, numpy as np, torch
d = sys.argv[1]
x = torch.from_numpy(np.fromfile(d + '/x.f32', dtype=np.float32))
x.to(torch.bfloat16).view(torch.int16).numpy().tofile(d + '/enc.u16')
c = torch.from_numpy(np.fromfile(d + '/codes.u16', dtype=np.int16))
c.view(torch.bfloat16).float().numpy().tofile(d + '/dec.f32')
)");
  const auto enc = read_file<std::uint16_t>(tmp.path / "enc.u16", xs.size());
  std::size_t bad = 0, nans = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::uint16_t ours = sdk::encode_bf16(xs[i]);
    if (std::isnan(xs[i])) {
      // torch writes a canonical NaN (sign and payload dropped); only NaN-ness is comparable.
      ++nans;
      if (!is_nan_code(kBf16, enc[i])) ++bad;
    } else if (enc[i] != ours && ++bad <= 5) {
      ADD_FAILURE() << "x=0x" << std::hex << bits_of(xs[i]) << " torch 0x" << enc[i] << " ours 0x" << ours;
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(nans, 0u);
  const auto dec = read_file<float>(tmp.path / "dec.f32", codes.size());
  for (std::uint32_t c = 0; c < codes.size(); ++c) {
    const float ours = sdk::decode_bf16(static_cast<std::uint16_t>(c));
    if (std::isnan(ours)) ASSERT_TRUE(std::isnan(dec[c])) << std::hex << c;
    else ASSERT_EQ(bits_of(dec[c]), bits_of(ours)) << "code 0x" << std::hex << c;
  }
}

}  // namespace
