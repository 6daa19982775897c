// measure_range against a numpy reference (range_statistics_reference.py under /usr/bin/python3):
// fixed float32 tensors with zeros, fp32 subnormals, the values at and around each format's
// smallest subnormal and largest finite value (ties included), negatives, NaN and inf, and a wide
// log-uniform spread; every count, the amax, the histogram and the per-tensor scales must agree
// exactly. merge() is checked against measuring the concatenation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/core/precision/range_statistics.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using sdk::DType;

constexpr const char* kPython = "/usr/bin/python3";  // Debian's numpy imports only under it

bool numpy_available() {
  return std::system((std::string(kPython) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0;
}

fs::path script() {
  const char* src = std::getenv("MIXTRAIN_SOURCE_DIR");
  return fs::path(src != nullptr ? src : MIXTRAIN_TEST_SOURCE_DIR) / "tests" / "unit" / "core" /
         "precision" / "range_statistics_reference.py";
}

// The edge values of every format, both signs.
std::vector<float> edges() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, 0.1f, 3.0f, std::nanf(""), inf, -inf};
  const std::vector<float> magnitudes = {
      // fp32 subnormals and the smallest normal
      1e-45f, 1e-40f, 1.1754944e-38f,
      // fp16: smallest subnormal 2^-24, its half (a tie to 0) and just above, smallest normal,
      // largest finite, the last value rounding to it, the first overflow, far above
      std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.0f, -25) * 1.0000001f, 3e-8f,
      6e-8f, std::ldexp(1.0f, -14), 65504.0f, 65519.0f, 65520.0f, 70000.0f,
      // bf16: around its largest finite value and its subnormals
      3.3895314e38f, 3.3961776e38f, 3.4e38f, std::ldexp(1.0f, -133), std::ldexp(1.0f, -134),
      // e4m3: smallest subnormal 2^-9, its half, largest finite 448, the tie 464, above
      std::ldexp(1.0f, -9), std::ldexp(1.0f, -10), std::ldexp(1.0f, -10) * 1.001f, 448.0f, 464.0f,
      465.0f, 480.0f,
      // e5m2: smallest subnormal 2^-16, its half, largest finite 57344, the tie 61440
      std::ldexp(1.0f, -16), std::ldexp(1.0f, -17), 57344.0f, 61439.0f, 61440.0f, 1e5f,
      // gradients of a deep network
      1e-10f, 1e-12f, 3.7e-9f};
  for (float m : magnitudes) {
    v.push_back(m);
    v.push_back(-m);
  }
  return v;
}

// A fixed log-uniform spread over [1e-12, 1e6) with random signs (a 64-bit LCG: the same values
// on every machine).
std::vector<float> spread(std::size_t n, double lo_log10, double hi_log10, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  auto next = [&] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(s >> 11) * 0x1.0p-53;
  };
  for (auto& x : v) {
    const double e = lo_log10 + (hi_log10 - lo_log10) * next();
    x = static_cast<float>(std::pow(10.0, e)) * (next() < 0.5 ? -1.0f : 1.0f);
    if (next() < 0.05) x = 0.0f;
  }
  return v;
}

class CalibrationRangeStatisticsReference : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mixtrain-range-statistics-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

void expect_counts(const FormatCounts& ours, const json& theirs, const std::string& what) {
  EXPECT_EQ(ours.flushed, theirs["flushed"].get<std::int64_t>()) << what << " flushed";
  EXPECT_EQ(ours.subnormal, theirs["subnormal"].get<std::int64_t>()) << what << " subnormal";
  EXPECT_EQ(ours.saturated, theirs["saturated"].get<std::int64_t>()) << what << " saturated";
}

TEST_F(CalibrationRangeStatisticsReference, EveryCountMatchesNumpy) {
  if (!numpy_available())
    GTEST_SKIP() << kPython << " cannot import numpy (Debian: apt install python3-numpy); the "
                 << "range statistics are not compared with the reference";
  const std::vector<std::vector<float>> tensors = {
      edges(),
      spread(20000, -12.0, 6.0, 1),   // amax above fp16's and e5m2's max
      spread(20000, -14.0, -8.0, 2),  // gradient-like: all far below fp16's range
      spread(5000, -3.0, 2.0, 3),     // activation-like
      std::vector<float>(64, 0.0f),   // no non-zero value: amax 0, scale 1
      {},                             // empty
  };
  std::string args;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const fs::path p = dir_ / ("t" + std::to_string(i) + ".f32");
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(tensors[i].data()),
               static_cast<std::streamsize>(tensors[i].size() * sizeof(float)));
    args += " " + p.string();
  }
  const fs::path out = dir_ / "reference.json", err = dir_ / "reference.err";
  const std::string cmd = std::string(kPython) + " " + script().string() + " " + out.string() +
                          args + " 2>" + err.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << std::ifstream(err).rdbuf();
  const json ref = json::parse(std::ifstream(out));
  ASSERT_EQ(ref["tensors"].size(), tensors.size());

  for (std::size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    const json& r = ref["tensors"][i];
    const RangeStatistics s = measure_range(tensors[i], /*loss_scales=*/true);
    EXPECT_EQ(s.count, r["count"].get<std::int64_t>());
    EXPECT_EQ(s.zeros, r["zeros"].get<std::int64_t>());
    EXPECT_EQ(s.nonfinite, r["nonfinite"].get<std::int64_t>());
    EXPECT_EQ(s.nonzero, r["nonzero"].get<std::int64_t>());
    EXPECT_EQ(static_cast<double>(s.amax), r["amax"].get<double>());
    EXPECT_EQ(static_cast<double>(s.min_nonzero), r["min_nonzero"].get<double>());
    ASSERT_EQ(s.step_amax.size(), 1u);
    EXPECT_EQ(s.step_amax[0], s.amax);

    std::int64_t binned = 0;
    for (std::size_t b = 0; b < s.histogram.size(); ++b) {
      const std::string key = std::to_string(static_cast<int>(b) + kHistogramMinLog2);
      const std::int64_t theirs =
          r["histogram"].contains(key) ? r["histogram"][key].get<std::int64_t>() : 0;
      EXPECT_EQ(s.histogram[b], theirs) << "histogram bin 2^" << key;
      binned += s.histogram[b];
    }
    EXPECT_EQ(binned, s.nonzero);

    for (std::size_t f = 0; f < kRangeFormats.size(); ++f) {
      const std::string name(sdk::dtype_name(kRangeFormats[f]));
      expect_counts(s.unscaled[f], r["unscaled"][name], name + " unscaled");
      expect_counts(s.scaled[f], r["scaled"][name], name + " scaled");
      EXPECT_EQ(static_cast<double>(tensor_scale(s.amax, kRangeFormats[f])),
                r["scale"][name].get<double>())
          << name << " scale";
    }
    for (std::size_t k = 0; k < s.fp16_scale_log2.size(); ++k)
      EXPECT_EQ(s.fp16_scale_log2[k], r["fp16_scale_log2"][k].get<std::int64_t>())
          << "fp16 survival at 2^" << k;
    // Flushing at scale 1 is the unscaled fp16 count, by two routes.
    EXPECT_EQ(s.fp16_flushed_at_scale_log2(0), s.unscaled[range_format_index(DType::fp16)].flushed);
  }
}

TEST(CalibrationRangeStatistics, MergeAddsCountsAndKeepsOneAmaxPerMeasurement) {
  const auto a = spread(3000, -9.0, 1.0, 7), b = spread(2000, -4.0, 5.0, 8);
  std::vector<float> both = a;
  both.insert(both.end(), b.begin(), b.end());
  RangeStatistics merged = measure_range(a, true);
  merge(merged, measure_range(b, true));
  const RangeStatistics whole = measure_range(both, true);
  EXPECT_EQ(merged.count, whole.count);
  EXPECT_EQ(merged.nonzero, whole.nonzero);
  EXPECT_EQ(merged.zeros, whole.zeros);
  EXPECT_EQ(merged.amax, whole.amax);
  EXPECT_EQ(merged.min_nonzero, whole.min_nonzero);
  EXPECT_EQ(merged.histogram, whole.histogram);
  EXPECT_EQ(merged.fp16_scale_log2, whole.fp16_scale_log2);
  for (std::size_t f = 0; f < kRangeFormats.size(); ++f) {
    EXPECT_EQ(merged.unscaled[f].flushed, whole.unscaled[f].flushed);
    EXPECT_EQ(merged.unscaled[f].saturated, whole.unscaled[f].saturated);
  }
  ASSERT_EQ(merged.step_amax.size(), 2u);
  EXPECT_EQ(merged.step_amax[0], measure_range(a).amax);
  EXPECT_EQ(merged.step_amax[1], measure_range(b).amax);
}

TEST(CalibrationRangeStatistics, ScaleFollowsTheFp8PluginsFormula) {
  EXPECT_EQ(tensor_scale(0.0f, DType::fp8_e4m3), 1.0f);
  EXPECT_EQ(tensor_scale(std::numeric_limits<float>::infinity(), DType::fp8_e4m3), 1.0f);
  EXPECT_EQ(tensor_scale(448.0f, DType::fp8_e4m3), 1.0f);
  EXPECT_EQ(tensor_scale(2.0f, DType::fp8_e5m2), 28672.0f);
  EXPECT_THROW(range_format_index(DType::fp32), std::invalid_argument);
}

}  // namespace
}  // namespace mixtrain::core
