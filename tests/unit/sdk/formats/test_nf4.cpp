// NF4 (sdk/support/nf4.h) against a second implementation written here from QLoRA's definition
// (Dettmers et al. 2023, section 3: blockwise absmax normalisation to [-1, 1], each value to the
// nearest of the 16 NormalFloat levels), with the header's arithmetic choices (fp32 x · (1/absmax),
// ties to the lower level, a zero block to the 0 level, element 2i in the high nibble) spelled out
// by brute force rather than by midpoints: codes, absmax and the dequantized values must agree bit
// for bit, on normal data, on sizes the block does not divide, on exact ties and on zero blocks.
// The code book itself is checked against its definition (normal quantiles); where Debian's
// /usr/bin/python3 has numpy, a NumPy implementation must agree bit for bit too. Bad inputs:
// non-finite weights, a block < 1, buffers that do not fit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtrain/sdk/support/nf4.h"

namespace {

using mixtrain::sdk::kNf4Codebook;
using mixtrain::sdk::Nf4Tensor;
namespace fs = std::filesystem;

// The 16 levels as bitsandbytes lists them (functional.py, get_4bit_type("nf4")), in double.
constexpr double kListed[16] = {-1.0,
                                -0.6961928009986877,
                                -0.5250730514526367,
                                -0.39491748809814453,
                                -0.28444138169288635,
                                -0.18477343022823334,
                                -0.09105003625154495,
                                0.0,
                                0.07958029955625534,
                                0.16093020141124725,
                                0.24611230194568634,
                                0.33791524171829224,
                                0.44070982933044434,
                                0.5626170039176941,
                                0.7229568362236023,
                                1.0};

// Φ⁻¹(p) by bisection on Φ(x) = erfc(-x/√2)/2, to the last bit of long double.
long double normal_quantile(long double p) {
  long double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const long double mid = (lo + hi) / 2;
    (std::erfc(-mid / std::sqrt(2.0L)) / 2 < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// QLoRA's (and bitsandbytes' create_normal_map's) construction: 8 positive quantiles of N(0, 1)
// at probabilities evenly spaced from δ = 0.9677083 down to 0.5 (excluded), 7 negative ones from
// 8 such steps, and an exact 0, normalised by the largest. The listed fp32 constants were computed
// by scipy with its own rounding steps; they sit within a few fp32 ulps of this exact derivation.
TEST(Nf4, TheCodeBookIsTheNormalQuantilesBitsandbytesLists) {
  const long double delta = 0.9677083L;
  std::vector<long double> levels = {0};
  for (int i = 0; i < 8; ++i) levels.push_back(normal_quantile(delta - (delta - 0.5L) * i / 8));
  for (int i = 0; i < 7; ++i) levels.push_back(-normal_quantile(delta - (delta - 0.5L) * i / 7));
  std::sort(levels.begin(), levels.end());
  const long double top = levels.back();
  for (int k = 0; k < 16; ++k) {
    EXPECT_EQ(kNf4Codebook[k], static_cast<float>(kListed[k])) << k;
    EXPECT_NEAR(static_cast<double>(levels[static_cast<std::size_t>(k)] / top), kListed[k], 2.5e-7)
        << k;
    if (k > 0) {
      EXPECT_LT(kNf4Codebook[k - 1], kNf4Codebook[k]);
    }
  }
  EXPECT_EQ(kNf4Codebook[7], 0.0f);
  EXPECT_EQ(kNf4Codebook[0], -1.0f);
  EXPECT_EQ(kNf4Codebook[15], 1.0f);
}

// The definition, by brute force.
struct Reference {
  std::vector<std::uint8_t> codes;
  std::vector<float> absmax, values;
};

Reference reference_nf4(const std::vector<float>& x, std::int64_t block) {
  const auto n = static_cast<std::int64_t>(x.size());
  Reference r;
  r.codes.assign(static_cast<std::size_t>((n + 1) / 2), 0);
  for (std::int64_t b0 = 0; b0 < n; b0 += block) {
    const std::int64_t end = std::min(n, b0 + block);
    float absmax = 0;
    for (std::int64_t i = b0; i < end; ++i) absmax = std::max(absmax, std::fabs(x[i]));
    r.absmax.push_back(absmax);
    const float scale = 1.0f / absmax;  // fp32, as the kernels compute it
    for (std::int64_t i = b0; i < end; ++i) {
      int best = 7;  // a zero block: every element is the 0 level
      if (absmax > 0) {
        const double v = static_cast<double>(x[i] * scale);
        double best_distance = std::numeric_limits<double>::infinity();
        for (int k = 0; k < 16; ++k) {  // the first of equally near levels: the lower one
          const double d = std::fabs(v - static_cast<double>(kNf4Codebook[k]));
          if (d < best_distance) {
            best_distance = d;
            best = k;
          }
        }
      }
      r.codes[static_cast<std::size_t>(i / 2)] |=
          static_cast<std::uint8_t>(i % 2 == 0 ? best << 4 : best);
      r.values.push_back(kNf4Codebook[best] * absmax);
    }
  }
  return r;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  // Element by element: an empty vector's data() may be null, which memcmp must not get.
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << ", the reference " << b[i];
      return;
    }
}

void expect_matches_reference(const std::vector<float>& x, std::int64_t block,
                              const std::string& what) {
  const Nf4Tensor q = mixtrain::sdk::nf4_quantize(x, block);
  const Reference r = reference_nf4(x, block);
  EXPECT_EQ(q.numel, static_cast<std::int64_t>(x.size())) << what;
  EXPECT_EQ(q.codes, r.codes) << what;
  expect_same_bits(q.absmax, r.absmax, what + " absmax");
  expect_same_bits(mixtrain::sdk::nf4_dequantize(q), r.values, what + " dequantized");
}

std::vector<float> normal_weights(std::size_t n, unsigned seed, float std_dev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, std_dev);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

TEST(Nf4, QuantizeAndDequantizeAreTheDefinitionBitForBit) {
  // Whole blocks, a partial trailing block, an odd count (half a byte), one element, none.
  for (const std::size_t n : {4096u, 64u * 7 + 37u, 101u, 63u, 1u, 0u})
    for (const std::int64_t block : {64, 32, 256, 7})
      expect_matches_reference(normal_weights(n, static_cast<unsigned>(n + block), 0.02f), block,
                               "n = " + std::to_string(n) + ", block " + std::to_string(block));
  // Magnitudes far from 1, and a heavy tail.
  expect_matches_reference(normal_weights(1000, 3, 3e-30f), 64, "tiny weights");
  expect_matches_reference(normal_weights(1000, 4, 1e30f), 64, "huge weights");
  auto x = normal_weights(640, 5, 1.0f);
  for (std::size_t i = 0; i < x.size(); i += 13) x[i] *= 50;
  expect_matches_reference(x, 64, "outliers");
}

TEST(Nf4, ATieTakesTheLowerLevelAndAZeroBlockStoresZeros) {
  // A block whose absmax is 1 normalises by an exact 1, so a value on a midpoint that fp32 holds
  // exactly is a tie: (0 + c8) / 2 is one (halving is exact).
  const float tie = kNf4Codebook[8] / 2;
  std::vector<float> x = {1.0f, tie, std::nextafter(tie, 1.0f), -tie, 0.0f, -1.0f};
  const Nf4Tensor q = mixtrain::sdk::nf4_quantize(x, 64);
  EXPECT_EQ(q.codes[0], 0xF7) << "1 is level 15; the tie goes to level 7 (0), not 8";
  EXPECT_EQ(q.codes[1], 0x87) << "just above the tie is level 8; -tie is nearer 0 than level 6";
  EXPECT_EQ(q.codes[2], 0x70) << "0 is level 7, -1 level 0";
  expect_matches_reference(x, 64, "ties");
  // Every midpoint that fp32 holds exactly, and its neighbours.
  std::vector<float> mids = {1.0f};
  for (int k = 0; k < 15; ++k) {
    const double mid =
        (static_cast<double>(kNf4Codebook[k]) + static_cast<double>(kNf4Codebook[k + 1])) / 2;
    const float f = static_cast<float>(mid);
    mids.insert(mids.end(), {f, std::nextafter(f, -2.0f), std::nextafter(f, 2.0f)});
  }
  expect_matches_reference(mids, 64, "midpoints");
  // A block of zeros (and signed zeros) between two others: absmax 0, level 7 everywhere, +0.
  std::vector<float> z = normal_weights(192, 6, 1.0f);
  for (std::size_t i = 64; i < 128; ++i) z[i] = i % 2 ? -0.0f : 0.0f;
  const Nf4Tensor qz = mixtrain::sdk::nf4_quantize(z, 64);
  EXPECT_EQ(qz.absmax[1], 0.0f);
  for (std::size_t i = 32; i < 64; ++i) EXPECT_EQ(qz.codes[i], 0x77) << i;
  const auto values = mixtrain::sdk::nf4_dequantize(qz);
  for (std::size_t i = 64; i < 128; ++i) EXPECT_FALSE(std::signbit(values[i])) << i;
  expect_matches_reference(z, 64, "zero block");
}

TEST(Nf4, ADequantizedTensorQuantizesBackToItsOwnCodes) {
  // What a checkpoint relies on: it stores the decoded fp32 values, and a resume quantizes them.
  const auto x = normal_weights(64 * 20 + 9, 7, 0.05f);
  const Nf4Tensor q = mixtrain::sdk::nf4_quantize(x, 64);
  const Nf4Tensor again = mixtrain::sdk::nf4_quantize(mixtrain::sdk::nf4_dequantize(q), 64);
  EXPECT_EQ(again.codes, q.codes);
  expect_same_bits(again.absmax, q.absmax, "absmax");
}

TEST(Nf4, BadInputIsRefusedNamingIt) {
  std::vector<float> x(70, 0.5f);
  x[66] = std::numeric_limits<float>::quiet_NaN();
  try {
    (void)mixtrain::sdk::nf4_quantize(x, 64);
    ADD_FAILURE() << "a NaN was quantized";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("element 66"), std::string::npos) << e.what();
  }
  x[66] = std::numeric_limits<float>::infinity();
  EXPECT_THROW((void)mixtrain::sdk::nf4_quantize(x, 64), std::invalid_argument);
  x[66] = 0.5f;
  EXPECT_THROW((void)mixtrain::sdk::nf4_quantize(x, 0), std::invalid_argument);
  Nf4Tensor q = mixtrain::sdk::nf4_quantize(x, 64);
  q.absmax.pop_back();  // 70 elements in blocks of 64 need 2
  try {
    (void)mixtrain::sdk::nf4_dequantize(q);
    ADD_FAILURE() << "a short absmax was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("need 35 code bytes and 2 absmax values, got 35 and 1"),
              std::string::npos)
        << e.what();
  }
}

// NumPy, from the same definition: fp32 absmax and reciprocal, np.argmin (the first of equal
// distances) over the levels, the high nibble first.
TEST(Nf4, NumpyAgreesBitForBit) {
  const char* python = "/usr/bin/python3";
  if (!fs::exists(python) ||
      std::system((std::string(python) + " -c 'import numpy' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << python << " with numpy is not available";
  const fs::path dir = fs::temp_directory_path() / ("mixtrain_nf4_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto x = normal_weights(64 * 30 + 21, 8, 0.03f);
  for (std::size_t i = 128; i < 192; ++i) x[i] = 0.0f;  // a zero block
  {
    std::ofstream out(dir / "x.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(x.data()),
              static_cast<std::streamsize>(x.size() * sizeof(float)));
  }
  std::ofstream(dir / "nf4.py") << R"(import sys, numpy as np
d = sys.argv[1]
x = np.fromfile(d + "/x.bin", dtype=np.float32)
levels = np.array([)" <<
      [] {
        std::string s;
        char buf[40];
        for (const double v : kListed) {
          std::snprintf(buf, sizeof buf, "%.17g, ", v);
          s += buf;
        }
        return s;
      }() << R"(], dtype=np.float32)
block = 64
codes, absmax = [], []
for b0 in range(0, len(x), block):
    blk = x[b0:b0 + block]
    a = np.max(np.abs(blk))
    absmax.append(a)
    if a == 0:
        codes += [7] * len(blk)
        continue
    v = blk * (np.float32(1) / a)
    codes += list(np.argmin(np.abs(v.astype(np.float64)[:, None] - levels.astype(np.float64)[None, :]), axis=1))
codes = np.array(codes + [0] * (len(codes) % 2), dtype=np.uint8)
packed = (codes[0::2] << 4) | codes[1::2]
packed.astype(np.uint8).tofile(d + "/codes.bin")
np.array(absmax, dtype=np.float32).tofile(d + "/absmax.bin")
values = levels[codes[:len(x)]] * np.repeat(np.array(absmax, dtype=np.float32), block)[:len(x)]
values.astype(np.float32).tofile(d + "/values.bin")
)";
  const std::string cmd =
      std::string(python) + " " + (dir / "nf4.py").string() + " " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto read = [&](const char* name, std::size_t bytes) {
    std::vector<char> b(bytes);
    std::ifstream in(dir / name, std::ios::binary);
    in.read(b.data(), static_cast<std::streamsize>(bytes));
    EXPECT_EQ(static_cast<std::size_t>(in.gcount()), bytes) << name;
    return b;
  };
  const Nf4Tensor q = mixtrain::sdk::nf4_quantize(x, 64);
  const auto codes = read("codes.bin", q.codes.size());
  EXPECT_EQ(std::memcmp(codes.data(), q.codes.data(), q.codes.size()), 0);
  const auto absmax = read("absmax.bin", q.absmax.size() * 4);
  EXPECT_EQ(std::memcmp(absmax.data(), q.absmax.data(), absmax.size()), 0);
  const auto ours = mixtrain::sdk::nf4_dequantize(q);
  const auto values = read("values.bin", ours.size() * 4);
  EXPECT_EQ(std::memcmp(values.data(), ours.data(), values.size()), 0);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
