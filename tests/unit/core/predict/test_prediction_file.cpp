// PredictionFile (`mixtrain predict`'s output): the .npy it streams reads back through the core's
// own .npy loader value for value; positions, probabilities and top-k select what they say; an
// uncommitted or short file never appears.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mixtrain/core/data/dataset.h"
#include "mixtrain/core/predict/prediction_file.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;

class PredictionFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mixtrain_prediction_file_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string bytes_of(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  fs::path dir_;
};

std::vector<float> logits_of(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * 0.7f) * 3.0f;
  return v;
}

TEST_F(PredictionFileTest, LogitsReadBackThroughTheNpyLoaderInTwoBatches) {
  const auto out = dir_ / "p.npy";
  const auto logits = logits_of(5 * 4);
  PredictionFile file(out, {}, 5, 1, 4);
  EXPECT_EQ(file.shape(), (std::vector<std::int64_t>{5, 4}));
  file.append(3, std::span(logits).first(12));
  EXPECT_FALSE(fs::exists(out)) << "visible before it is complete";
  file.append(2, std::span(logits).subspan(12));
  file.commit();
  const auto bytes = bytes_of(out);
  const std::size_t header =
      10 + static_cast<std::size_t>(static_cast<unsigned char>(bytes[8]) |
                                    static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ(header % 64, 0u) << "numpy aligns the data to 64 bytes";
  const Dataset back = load_npy_features(out);
  EXPECT_EQ(back.rows, 5);
  EXPECT_EQ(back.features, 4);
  EXPECT_EQ(back.x, logits);
}

TEST_F(PredictionFileTest, ProbabilitiesOfTheLastPositionSumToOne) {
  const auto out = dir_ / "p.npy";
  // 2 rows × 3 positions × 4 classes; keep each row's last position.
  const auto logits = logits_of(2 * 3 * 4);
  PredictionFile file(out, {PredictionValues::probabilities, 0, false}, 2, 3, 4);
  EXPECT_EQ(file.shape(), (std::vector<std::int64_t>{2, 4}));
  file.append(2, logits);
  file.commit();
  const Dataset back = load_npy_features(out);
  ASSERT_EQ(back.x.size(), 8u);
  for (std::size_t r = 0; r < 2; ++r) {
    const float* last = logits.data() + r * 12 + 8;
    double z = 0.0;
    for (int c = 0; c < 4; ++c) z += std::exp(static_cast<double>(last[c]));
    double sum = 0.0;
    for (std::size_t c = 0; c < 4; ++c) {
      EXPECT_NEAR(back.x[r * 4 + c], std::exp(static_cast<double>(last[c])) / z, 1e-7);
      sum += back.x[r * 4 + c];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST_F(PredictionFileTest, AllPositionsKeepEveryPosition) {
  const auto out = dir_ / "p.npy";
  const auto logits = logits_of(2 * 3 * 4);
  PredictionFile file(out, {PredictionValues::logits, 0, true}, 2, 3, 4);
  EXPECT_EQ(file.shape(), (std::vector<std::int64_t>{2, 3, 4}));
  file.append(2, logits);
  file.commit();
  const Dataset back = load_npy_features(out);
  EXPECT_EQ(back.x, logits);
}

TEST_F(PredictionFileTest, TopKIsAStructuredArrayOfClassAndScoreLargestFirst) {
  const auto out = dir_ / "p.npy";
  // Row 0 has a tie between classes 1 and 3: the lower class comes first.
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 9.0f, 0.0f, 3.0f};
  PredictionFile file(out, {PredictionValues::logits, 2, false}, 2, 1, 4);
  EXPECT_EQ(file.shape(), (std::vector<std::int64_t>{2, 2}));
  file.append(2, logits);
  file.commit();
  const auto bytes = bytes_of(out);
  EXPECT_NE(bytes.find("'descr': [('class', '<i4'), ('score', '<f4')]"), std::string::npos);
  EXPECT_NE(bytes.find("'shape': (2, 2)"), std::string::npos);
  const std::size_t header =
      10 + static_cast<std::size_t>(static_cast<unsigned char>(bytes[8]) |
                                    static_cast<unsigned char>(bytes[9]) << 8);
  ASSERT_EQ(bytes.size(), header + 2 * 2 * 8);
  auto field = [&](std::size_t record, std::size_t offset) {
    std::uint32_t v = 0;
    std::memcpy(&v, bytes.data() + header + record * 8 + offset, 4);
    return v;
  };
  const std::vector<std::pair<std::uint32_t, float>> expected = {
      {1, 2.0f}, {3, 2.0f}, {1, 9.0f}, {3, 3.0f}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(field(i, 0), expected[i].first) << "record " << i;
    EXPECT_EQ(std::bit_cast<float>(field(i, 4)), expected[i].second) << "record " << i;
  }
}

TEST_F(PredictionFileTest, AFileMissingRowsIsNeverCommittedAndBadSizesAreRefused) {
  const auto out = dir_ / "p.npy";
  {
    PredictionFile file(out, {}, 3, 1, 2);
    const auto logits = logits_of(4);
    file.append(2, logits);
    EXPECT_THROW(file.commit(), std::invalid_argument);
    EXPECT_THROW(file.append(2, logits), std::invalid_argument);  // past the rows
    EXPECT_THROW(file.append(1, logits), std::invalid_argument);  // wrong value count
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(dir_)) << "a temporary file was left behind";
  EXPECT_THROW(PredictionFile(out, {PredictionValues::logits, 3, false}, 1, 1, 2),
               std::invalid_argument);
}

TEST(TopK, KeepsTheKLargestWithTiesToTheLowerIndex) {
  const std::vector<float> v = {1.0f, 3.0f, 3.0f, -2.0f, 5.0f};
  const auto best = top_k(v, 3);
  ASSERT_EQ(best.size(), 3u);
  EXPECT_EQ(best[0], (std::pair<std::int32_t, float>{4, 5.0f}));
  EXPECT_EQ(best[1], (std::pair<std::int32_t, float>{1, 3.0f}));
  EXPECT_EQ(best[2], (std::pair<std::int32_t, float>{2, 3.0f}));
  EXPECT_EQ(top_k(v, 9).size(), v.size());
}

// A NaN among the logits (a diverged head) ranks as eval's top-k accuracy ranks it: last, unless
// it is class 0, which the argmax scan takes first. The old comparator let a NaN break the sort's
// ordering, so the largest class could go missing from the result.
TEST(TopK, RanksANaNAsEvalsTopKAccuracyDoes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t at = 1; at < 12; ++at) {
    std::vector<float> v = {0.1f,   0.2f,  0.3f,  0.05f, 0.15f, 0.25f,
                            0.667f, 0.35f, 0.01f, 0.02f, 0.4f,  0.03f};
    v[at] = nan;
    const auto best = top_k(v, 11);
    ASSERT_EQ(best.size(), 11u);
    EXPECT_EQ(best[0].first, at == 6 ? 10 : 6) << "NaN at " << at;
    for (std::size_t i = 0; i < best.size(); ++i)
      EXPECT_NE(best[i].first, static_cast<std::int32_t>(at)) << "NaN at " << at << " ranked " << i;
    for (std::size_t i = 1; i < best.size(); ++i)
      EXPECT_GE(best[i - 1].second, best[i].second) << "NaN at " << at;
    const auto all = top_k(v, 12);
    EXPECT_EQ(all.back().first, static_cast<std::int32_t>(at));
  }
  std::vector<float> first = {nan, 1.0f, 2.0f};
  const auto best = top_k(first, 2);
  EXPECT_EQ(best[0].first, 0);
  EXPECT_EQ(best[1].first, 2);
}

TEST(NpyHeader, OneDimensionalShapesKeepTheirComma) {
  const auto h = npy_header("'<f4'", std::vector<std::int64_t>{7});
  const std::string text(reinterpret_cast<const char*>(h.data()) + 10, h.size() - 10);
  EXPECT_NE(text.find("'shape': (7,)"), std::string::npos) << text;
  EXPECT_EQ(h.size() % 64, 0u);
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace mixtrain::core
