// The bucket plan and the shard pieces of data parallel (distributed/gradient_buckets.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "distributed/gradient_buckets.h"

namespace mixtrain::core {
namespace {

TEST(GradientBuckets, PacksParametersInReverseOrderUpToTheCap) {
  const std::vector<std::int64_t> numels = {16, 16, 32, 48};  // forward order
  const auto buckets = plan_buckets(numels, 64, 1);
  ASSERT_EQ(buckets.size(), 2u);
  // Backward finishes the last parameters first: 48 + 32 fill one bucket? 80 > 64, so 48 alone.
  EXPECT_EQ(buckets[0].params, (std::vector<std::size_t>{3}));
  EXPECT_EQ(buckets[1].params, (std::vector<std::size_t>{2, 1, 0}));
  EXPECT_EQ(buckets[1].offsets, (std::vector<std::int64_t>{0, 32, 48}));
  EXPECT_EQ(buckets[1].numel, 64);
}

// Each parameter starts on a 16-element boundary; the gaps count against the cap, and the padded
// size lets every rank's shard start on one too.
TEST(GradientBuckets, OffsetsAndShardsStartAligned) {
  const std::vector<std::int64_t> numels = {3, 17, 5};
  const auto one = plan_buckets(numels, 1000, 3);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].offsets, (std::vector<std::int64_t>{0, 16, 48}));  // 5, then 17, then 3
  EXPECT_EQ(one[0].sizes, (std::vector<std::int64_t>{5, 17, 3}));
  EXPECT_EQ(one[0].numel, 51);
  EXPECT_EQ(one[0].padded, 96);  // a multiple of 3 · 16
  EXPECT_EQ(one[0].shard() % kBucketAlignElements, 0);
  // 5 + gap + 17 = 33 fits a cap of 33, but not the 3 that would start at 48.
  const auto two = plan_buckets(numels, 33, 1);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].params, (std::vector<std::size_t>{2, 1}));
  EXPECT_EQ(two[1].params, (std::vector<std::size_t>{0}));
}

TEST(GradientBuckets, AParameterLargerThanTheCapGetsABucketOfItsOwn) {
  const std::vector<std::int64_t> numels = {5, 1000, 5};
  const auto buckets = plan_buckets(numels, 100, 1);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[1].params, (std::vector<std::size_t>{1}));
  EXPECT_EQ(buckets[1].numel, 1000);
}

TEST(GradientBuckets, EveryParameterLandsInExactlyOneBucket) {
  std::vector<std::int64_t> numels;
  for (int i = 0; i < 37; ++i) numels.push_back(1 + (i * 7919) % 300);
  for (std::int64_t cap : {1, 50, 299, 300, 1000, 1 << 20}) {
    const auto buckets = plan_buckets(numels, cap, 3);
    std::vector<int> seen(numels.size(), 0);
    for (const auto& b : buckets) {
      std::int64_t end = 0;
      for (std::size_t j = 0; j < b.params.size(); ++j) {
        EXPECT_EQ(b.offsets[j] % kBucketAlignElements, 0);
        EXPECT_GE(b.offsets[j], end);
        EXPECT_LT(b.offsets[j] - end, kBucketAlignElements);
        EXPECT_EQ(b.sizes[j], numels[b.params[j]]);
        end = b.offsets[j] + b.sizes[j];
        ++seen[b.params[j]];
      }
      EXPECT_EQ(b.numel, end);
      EXPECT_TRUE(b.params.size() == 1 || b.numel <= cap) << "cap " << cap;
      EXPECT_EQ(b.padded % (3 * kBucketAlignElements), 0);
      EXPECT_GE(b.padded, b.numel);
      EXPECT_LT(b.padded - b.numel, 3 * kBucketAlignElements);
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

// The shards of all ranks tile each bucket's parameters exactly once, each piece in place.
TEST(GradientBuckets, ShardPiecesOfAllRanksCoverEveryElementOnce) {
  const std::vector<std::int64_t> numels = {7, 13, 1, 29, 4};
  for (int world : {1, 2, 3, 4, 8}) {
    const auto buckets = plan_buckets(numels, 25, world);
    for (const auto& b : buckets) {
      std::vector<int> covered(static_cast<std::size_t>(b.numel), 0);
      for (int r = 0; r < world; ++r) {
        std::int64_t last_shard_end = 0;
        for (const auto& p : shard_pieces(b, r)) {
          EXPECT_GT(p.count, 0);
          EXPECT_GE(p.shard_offset, last_shard_end);
          last_shard_end = p.shard_offset + p.count;
          EXPECT_LE(last_shard_end, b.shard());
          const auto j = static_cast<std::size_t>(
              std::find(b.params.begin(), b.params.end(), p.param) - b.params.begin());
          ASSERT_LT(j, b.params.size());
          const std::int64_t at = b.offsets[j] + p.param_offset;
          // The piece's place in the bucket is the rank's shard start plus its shard offset.
          EXPECT_EQ(at, r * b.shard() + p.shard_offset);
          EXPECT_LE(p.param_offset + p.count, numels[p.param]);
          for (std::int64_t k = 0; k < p.count; ++k) ++covered[static_cast<std::size_t>(at + k)];
        }
      }
      // Each parameter's elements once; the alignment gaps belong to no parameter.
      std::vector<int> expected(static_cast<std::size_t>(b.numel), 0);
      for (std::size_t j = 0; j < b.params.size(); ++j)
        std::fill_n(expected.begin() + b.offsets[j], b.sizes[j], 1);
      EXPECT_EQ(covered, expected) << "world " << world;
    }
  }
}

TEST(GradientBuckets, RefusesAZeroCapOrWorld) {
  const std::vector<std::int64_t> numels = {1};
  EXPECT_THROW(plan_buckets(numels, 0, 1), std::invalid_argument);
  EXPECT_THROW(plan_buckets(numels, 10, 0), std::invalid_argument);
}

}  // namespace
}  // namespace mixtrain::core
