// Per-channel normalisation (given, or from the training split) and the seeded training-batch
// augmentation (crop with padding, horizontal flip).
#include "data_test_util.h"

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/data/dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace mixtrain::core {
namespace {

DataSettings synthetic_images(std::int64_t channels = 2) {
  DataSettings s;
  s.source = DataSource::synthetic;
  s.synthetic.kind = "images";
  s.synthetic.rows = 200;
  s.synthetic.channels = channels;
  s.synthetic.height = 8;
  s.synthetic.width = 8;
  s.synthetic.max_shift = 1;
  s.synthetic.noise = 0.3;
  s.synthetic.seed = 5;
  s.eval_fraction = 0.25;
  return s;
}

TEST(ChannelStatistics, MeanAndStdPerChannelInDouble) {
  Dataset d;
  d.rows = 2;
  d.features = 4;
  d.classes = 2;
  d.sample_shape = {2, 1, 2};
  d.x = {1, 3, 10, 10, 5, 7, 20, 40};  // channel 0: 1 3 5 7; channel 1: 10 10 20 40
  d.y = {0, 1};
  const auto stats = channel_statistics(d);
  EXPECT_DOUBLE_EQ(stats.mean[0], 4.0);
  EXPECT_DOUBLE_EQ(stats.std[0], std::sqrt(5.0));
  EXPECT_DOUBLE_EQ(stats.mean[1], 20.0);
  EXPECT_DOUBLE_EQ(stats.std[1], std::sqrt(150.0));
  normalize_channels(d, stats);
  EXPECT_FLOAT_EQ(d.x[0], static_cast<float>(-3.0 / std::sqrt(5.0)));
  EXPECT_FLOAT_EQ(d.x[7], static_cast<float>(20.0 / std::sqrt(150.0)));
  const auto after = channel_statistics(d);
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(after.mean[c], 0.0, 1e-7);
    EXPECT_NEAR(after.std[c], 1.0, 1e-7);
  }
  EXPECT_THROW(normalize_channels(d, {{0.0}, {1.0}}), std::invalid_argument);
  EXPECT_THROW(normalize_channels(d, {{0.0, 0.0}, {1.0, 0.0}}), std::invalid_argument);
}

// Given statistics apply to both splits as torchvision's Normalize computes them: mean and std
// rounded to float32, then (x - mean) / std in float32 (the same in double, rounded once, differs
// in the last bit for a share of the pixels: the test tells the two apart).
TEST(Normalize, GivenStatisticsApplyToBothSplitsInFloat32AsTorchvision) {
  const auto plain = load_data(synthetic_images(), 1);
  auto s = synthetic_images();
  s.normalize.mean = {0.4914, 0.4822};  // CIFAR-10's
  s.normalize.std = {0.2470, 0.2435};
  const auto norm = load_data(s, 1);
  EXPECT_EQ(norm.normalization.mean, s.normalize.mean);
  const float m[2] = {0.4914f, 0.4822f}, sd[2] = {0.2470f, 0.2435f};
  EXPECT_EQ(norm.black, (std::vector<float>{(0.0f - m[0]) / sd[0], (0.0f - m[1]) / sd[1]}));
  ASSERT_EQ(norm.eval.rows, plain.eval.rows);
  const std::size_t plane = 64;
  std::size_t differs_from_double = 0;
  for (const auto* pair : {&plain.train, &plain.eval}) {
    const Dataset& raw = *pair;
    const Dataset& got = pair == &plain.train ? norm.train : norm.eval;
    ASSERT_EQ(raw.x.size(), got.x.size());
    for (std::size_t i = 0; i < raw.x.size(); ++i) {
      const std::size_t c = (i % 128) / plane;
      const float centred = raw.x[i] - m[c];
      ASSERT_EQ(got.x[i], centred / sd[c]) << i;
      differs_from_double +=
          got.x[i] != static_cast<float>((static_cast<double>(raw.x[i]) - s.normalize.mean[c]) /
                                         s.normalize.std[c]);
    }
  }
  EXPECT_GT(differs_from_double, 0u);
}

TEST(Normalize, FromTrainingUsesTheTrainingSplitOnlyForBoth) {
  const auto plain = load_data(synthetic_images(), 1);
  auto s = synthetic_images();
  s.normalize.from_training = true;
  const auto norm = load_data(s, 1);
  const auto want = channel_statistics(plain.train);
  EXPECT_EQ(norm.normalization.mean, want.mean);
  EXPECT_EQ(norm.normalization.std, want.std);
  // The eval split's own statistics differ, and were not used.
  const auto eval_stats = channel_statistics(plain.eval);
  EXPECT_NE(eval_stats.mean, want.mean);
  for (std::size_t i = 0; i < plain.eval.x.size(); ++i) {
    const std::size_t c = (i % 128) / 64;
    ASSERT_EQ(norm.eval.x[i], normalized_pixel(plain.eval.x[i], want.mean[c], want.std[c]));
  }
  const auto after = channel_statistics(norm.train);
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(after.mean[c], 0.0, 1e-6);
    EXPECT_NEAR(after.std[c], 1.0, 1e-6);
  }
}

TEST(Normalize, WrongCountOrPlainFeaturesPointAtTheConfig) {
  auto s = synthetic_images();
  s.normalize.mean = {0.5, 0.5, 0.5};
  s.normalize.std = {1, 1, 1};
  s.normalize.mean_where = {"run.toml", 12, 8};
  try {
    load_data(s, 1);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const sdk::ConfigError& e) {
    EXPECT_EQ(e.where().to_string(), "run.toml:12:8");
    EXPECT_NE(std::string(e.what()).find("3 values"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 channels"), std::string::npos) << e.what();
  }
  DataSettings plain;
  plain.source = DataSource::synthetic;
  plain.synthetic.rows = 50;
  plain.normalize.from_training = true;
  plain.normalize.where = {"run.toml", 20, 1};
  EXPECT_THROW(load_data(plain, 1), sdk::ConfigError);
  plain.normalize.from_training = false;
  plain.augment.spec.horizontal_flip = true;
  EXPECT_THROW(load_data(plain, 1), sdk::ConfigError);
}

// A 1×3×4 image whose pixel (y, x) is 10·y + x + 1 (so 0 only ever means padding).
std::vector<float> numbered_image() {
  std::vector<float> v(12);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 4; ++x)
      v[static_cast<std::size_t>(y * 4 + x)] = static_cast<float>(10 * y + x + 1);
  return v;
}

// What augment_batch must give for one sample, from its documented draws.
std::vector<float> expected_window(const std::vector<float>& image, std::int64_t pad, bool flip_on,
                                   std::uint64_t seed, std::uint64_t batch, std::uint64_t position,
                                   float fill, bool& flipped, std::int64_t& oy, std::int64_t& ox) {
  DataRng rng(seed, augment_stream(batch, position));
  oy = pad > 0 ? static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(2 * pad + 1))) - pad
               : 0;
  ox = pad > 0 ? static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(2 * pad + 1))) - pad
               : 0;
  flipped = flip_on && rng.uniform() < 0.5;
  std::vector<float> out(12);
  for (std::int64_t y = 0; y < 3; ++y)
    for (std::int64_t x = 0; x < 4; ++x) {
      const std::int64_t sy = y + oy, sx = (flipped ? 3 - x : x) + ox;
      out[static_cast<std::size_t>(y * 4 + x)] = (sy < 0 || sy >= 3 || sx < 0 || sx >= 4)
                                                     ? fill
                                                     : image[static_cast<std::size_t>(sy * 4 + sx)];
    }
  return out;
}

TEST(Augment, CropWithPaddingIsTheDocumentedWindowFilledWithBlack) {
  const std::vector<std::int64_t> shape = {1, 3, 4};
  const std::vector<float> fill = {-7.5f};  // a normalised black
  AugmentSpec spec;
  spec.crop_padding = 2;
  bool saw_padding = false, saw_identity = false;
  for (std::uint64_t batch = 0; batch < 40; ++batch) {
    std::vector<float> x = numbered_image();
    augment_batch(spec, shape, fill, x.data(), 1, 11, batch);
    bool flipped = false;
    std::int64_t oy = 0, ox = 0;
    const auto want =
        expected_window(numbered_image(), 2, false, 11, batch, 0, fill[0], flipped, oy, ox);
    ASSERT_EQ(x, want) << "batch " << batch;
    EXPECT_TRUE(oy >= -2 && oy <= 2 && ox >= -2 && ox <= 2);
    if (oy == 0 && ox == 0) saw_identity = true;
    if (oy != 0 || ox != 0) saw_padding = std::count(x.begin(), x.end(), -7.5f) > 0 || saw_padding;
  }
  EXPECT_TRUE(saw_padding);
  (void)saw_identity;
  // Pinned by hand: the window one row down and two columns left of the image.
  std::vector<float> x = numbered_image();
  const float f = -7.5f;
  // Find a batch whose draw is (oy, ox) = (1, -2) and check it literally.
  for (std::uint64_t batch = 0; batch < 1000; ++batch) {
    DataRng rng(11, augment_stream(batch, 0));
    if (static_cast<std::int64_t>(rng.below(5)) - 2 != 1 ||
        static_cast<std::int64_t>(rng.below(5)) - 2 != -2)
      continue;
    augment_batch(spec, shape, fill, x.data(), 1, 11, batch);
    EXPECT_EQ(x, (std::vector<float>{f, f, 11, 12, f, f, 21, 22, f, f, f, f}));
    return;
  }
  ADD_FAILURE() << "no batch drew (1, -2)";
}

TEST(Augment, FlipMirrorsAboutHalfTheSamples) {
  const std::vector<std::int64_t> shape = {1, 3, 4};
  AugmentSpec spec;
  spec.horizontal_flip = true;
  const std::vector<float> zero = {0.0f};
  const std::int64_t rows = 400;
  std::vector<float> batch;
  for (std::int64_t i = 0; i < rows; ++i) {
    const auto img = numbered_image();
    batch.insert(batch.end(), img.begin(), img.end());
  }
  augment_batch(spec, shape, zero, batch.data(), rows, 3, 9);
  const std::vector<float> mirrored = {4, 3, 2, 1, 14, 13, 12, 11, 24, 23, 22, 21};
  int flips = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::vector<float> got(batch.begin() + i * 12, batch.begin() + (i + 1) * 12);
    if (got == mirrored) {
      ++flips;
    } else {
      ASSERT_EQ(got, numbered_image()) << "sample " << i;
    }
  }
  EXPECT_GT(flips, 150);
  EXPECT_LT(flips, 250);
}

TEST(Augment, ABatchIsAPureFunctionOfSeedBatchNumberAndPosition) {
  const auto data = load_data(synthetic_images(3), 1).train;
  const std::vector<float> fill = {0.0f, 0.0f, 0.0f};
  AugmentSpec spec;
  spec.crop_padding = 2;
  spec.horizontal_flip = true;
  const std::vector<std::int64_t> rows = {5, 9, 2, 77, 31, 8};
  auto batch = [&](std::uint64_t seed, std::uint64_t number) {
    std::vector<float> x(rows.size() * static_cast<std::size_t>(data.features));
    gather_batch(data, rows, x.data(), nullptr);
    augment_batch(spec, data.sample_shape, fill, x.data(), static_cast<std::int64_t>(rows.size()),
                  seed, number);
    return x;
  };
  const auto a = batch(4, 17);
  // Another batch in between (a resumed run has drawn none) changes nothing.
  (void)batch(4, 16);
  EXPECT_EQ(a, batch(4, 17));
  EXPECT_NE(a, batch(4, 18));
  EXPECT_NE(a, batch(5, 17));
  // Sample i depends only on (seed, number, i): the first rows of a longer batch agree.
  std::vector<float> one(static_cast<std::size_t>(data.features));
  const std::vector<std::int64_t> first = {5};
  gather_batch(data, first, one.data(), nullptr);
  augment_batch(spec, data.sample_shape, fill, one.data(), 1, 4, 17);
  EXPECT_TRUE(std::equal(one.begin(), one.end(), a.begin()));
  // A data-parallel rank's share, rows 3..5 of the drawn batch, augments as those rows of the
  // whole batch: its first_row, not its own row 0, keys each sample.
  const std::vector<std::int64_t> share(rows.begin() + 3, rows.end());
  std::vector<float> part(share.size() * static_cast<std::size_t>(data.features));
  gather_batch(data, share, part.data(), nullptr);
  augment_batch(spec, data.sample_shape, fill, part.data(), 3, 4, 17, /*first_row=*/3);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), a.begin() + 3 * data.features));
}

TEST(Augment, OffOrBadArguments) {
  std::vector<float> x = numbered_image();
  const std::vector<std::int64_t> shape = {1, 3, 4};
  const std::vector<float> fill = {0.0f};
  augment_batch({}, shape, fill, x.data(), 1, 1, 1);
  EXPECT_EQ(x, numbered_image());
  AugmentSpec spec;
  spec.horizontal_flip = true;
  const std::vector<std::int64_t> flat = {12};
  EXPECT_THROW(augment_batch(spec, flat, fill, x.data(), 1, 1, 1), std::invalid_argument);
  const std::vector<float> two = {0.0f, 0.0f};
  EXPECT_THROW(augment_batch(spec, shape, two, x.data(), 1, 1, 1), std::invalid_argument);
}

TEST(Augment, LoadingNeverAugmentsAndEvalStaysUntouched) {
  auto s = synthetic_images();
  const auto plain = load_data(s, 1);
  s.augment.spec.crop_padding = 2;
  s.augment.spec.horizontal_flip = true;
  const auto with = load_data(s, 1);
  EXPECT_EQ(plain.train.x, with.train.x);
  EXPECT_EQ(plain.eval.x, with.eval.x);
  EXPECT_EQ(with.black, (std::vector<float>{0.0f, 0.0f}));
}

}  // namespace
}  // namespace mixtrain::core
