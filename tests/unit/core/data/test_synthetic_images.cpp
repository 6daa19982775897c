// The synthetic "images" source: shape, determinism, class balance, bounds, and that it is a
// shift-invariance task (a matched filter that tries every shift beats a linear classifier).
#include "data_test_util.h"

#include "mixtrain/core/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace mixtrain::core {
namespace {

SyntheticSpec image_spec() {
  SyntheticSpec s;
  s.kind = "images";
  s.rows = 1200;
  s.channels = 1;
  s.height = 16;
  s.width = 16;
  s.max_shift = 3;
  s.noise = 0.4;
  s.classes = 10;
  s.seed = 7;
  return s;
}

TEST(SyntheticImages, ShapeAndSampleShape) {
  auto spec = image_spec();
  spec.channels = 3;
  spec.height = 8;
  spec.width = 12;
  spec.max_shift = 2;
  spec.rows = 30;
  const Dataset d = make_synthetic(spec);
  EXPECT_EQ(d.rows, 30);
  EXPECT_EQ(d.features, 3 * 8 * 12);
  EXPECT_EQ(d.sample_shape, (std::vector<std::int64_t>{3, 8, 12}));
  EXPECT_EQ(d.x.size(), 30u * 288u);
  EXPECT_NO_THROW(check_dataset(d, "images"));
}

TEST(SyntheticImages, TwoCallsGiveIdenticalBytesAndSeedsDiffer) {
  const Dataset a = make_synthetic(image_spec()), b = make_synthetic(image_spec());
  ASSERT_EQ(a.x.size(), b.x.size());
  EXPECT_EQ(std::memcmp(a.x.data(), b.x.data(), a.x.size() * sizeof(float)), 0);
  EXPECT_EQ(a.y, b.y);
  auto other = image_spec();
  other.seed = 8;
  EXPECT_NE(make_synthetic(other).x, a.x);
}

TEST(SyntheticImages, ClassesAreBalanced) {
  const Dataset d = make_synthetic(image_spec());
  std::vector<int> count(10, 0);
  for (auto y : d.y) ++count[static_cast<std::size_t>(y)];
  for (int c = 0; c < 10; ++c) {
    EXPECT_GT(count[static_cast<std::size_t>(c)], 80) << "class " << c;
    EXPECT_LT(count[static_cast<std::size_t>(c)], 160) << "class " << c;
  }
}

TEST(SyntheticImages, NoiselessPixelsAreTemplateValuesOrZero) {
  auto spec = image_spec();
  spec.noise = 0.0;
  spec.rows = 50;
  const Dataset d = make_synthetic(spec);
  std::size_t lit = 0;
  for (float v : d.x) {
    ASSERT_TRUE(v == 0.0f || (v >= 0.75f && v < 1.0f)) << v;
    lit += v > 0.0f;
  }
  EXPECT_GT(lit, d.x.size() / 20);  // strokes, not a blank canvas
  EXPECT_LT(lit, d.x.size() / 2);
}

double dist2(const float* a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t j = 0; j < b.size(); ++j) s += (a[j] - b[j]) * (a[j] - b[j]);
  return s;
}

// Class means of `d` (which, without shifts, are the templates plus averaged noise).
std::vector<std::vector<double>> class_means(const Dataset& d) {
  const auto f = static_cast<std::size_t>(d.features);
  std::vector<std::vector<double>> m(static_cast<std::size_t>(d.classes),
                                     std::vector<double>(f, 0.0));
  std::vector<double> n(m.size(), 0.0);
  for (std::size_t r = 0; r < static_cast<std::size_t>(d.rows); ++r) {
    const auto c = static_cast<std::size_t>(d.y[r]);
    n[c] += 1;
    for (std::size_t j = 0; j < f; ++j) m[c][j] += d.x[r * f + j];
  }
  for (std::size_t c = 0; c < m.size(); ++c)
    for (auto& v : m[c]) v /= std::max(n[c], 1.0);
  return m;
}

// Shifted copy of a 16×16 one-channel template.
std::vector<double> shifted(const std::vector<double>& t, int sy, int sx) {
  std::vector<double> out(256, 0.0);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x) {
      const int ty = y - sy, tx = x - sx;
      if (ty >= 0 && ty < 16 && tx >= 0 && tx < 16)
        out[static_cast<std::size_t>(y * 16 + x)] = t[static_cast<std::size_t>(ty * 16 + tx)];
    }
  return out;
}

// The structure (templates) does not depend on max_shift, so unshifted data give the templates.
// A classifier that tries every shift of them (what convolution and pooling can learn) is near
// perfect, while the nearest class mean of the shifted data (a linear classifier) is far behind.
TEST(SyntheticImages, ShiftsMakeItATaskForConvolutionsNotForALinearModel) {
  auto unshifted = image_spec();
  unshifted.max_shift = 0;
  const auto templates = class_means(make_synthetic(unshifted));
  auto [train, eval] = split_holdout(make_synthetic(image_spec()), 0.25, 1);
  const auto means = class_means(train);
  int linear = 0, matched = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(eval.rows); ++r) {
    const float* x = eval.x.data() + r * 256;
    std::size_t best_linear = 0, best_matched = 0;
    double bl = std::numeric_limits<double>::infinity(), bm = bl;
    for (std::size_t c = 0; c < 10; ++c) {
      if (const double d = dist2(x, means[c]); d < bl) {
        bl = d;
        best_linear = c;
      }
      for (int sy = -3; sy <= 3; ++sy)
        for (int sx = -3; sx <= 3; ++sx)
          if (const double d = dist2(x, shifted(templates[c], sy, sx)); d < bm) {
            bm = d;
            best_matched = c;
          }
    }
    linear += static_cast<std::int32_t>(best_linear) == eval.y[r];
    matched += static_cast<std::int32_t>(best_matched) == eval.y[r];
  }
  const double n = static_cast<double>(eval.rows);
  EXPECT_GT(matched / n, 0.95);
  EXPECT_LT(linear / n, 0.8);
  EXPECT_GT(linear / n, 0.15);  // still far above chance: the templates are there
}

TEST(SyntheticImages, BadSpecsAreDataErrors) {
  auto spec = image_spec();
  spec.max_shift = 8;
  test::expect_data_error([&] { make_synthetic(spec); }, "max_shift");
  spec = image_spec();
  spec.height = 3;
  test::expect_data_error([&] { make_synthetic(spec); }, "height");
  spec = image_spec();
  spec.channels = 0;
  test::expect_data_error([&] { make_synthetic(spec); }, "channels");
}

}  // namespace
}  // namespace mixtrain::core
