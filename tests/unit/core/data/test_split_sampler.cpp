#include "data_test_util.h"

#include "mixtrain/core/data/batch_sampler.h"
#include "mixtrain/core/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>

namespace mixtrain::core {
namespace {

// A dataset whose first feature is the row id, so rows can be traced through a split.
Dataset numbered(std::int64_t rows, std::int64_t features = 3) {
  Dataset d;
  d.rows = rows;
  d.features = features;
  d.classes = 4;
  for (std::int64_t i = 0; i < rows; ++i) {
    d.y.push_back(static_cast<std::int32_t>(i % 4));
    for (std::int64_t j = 0; j < features; ++j)
      d.x.push_back(static_cast<float>(j == 0 ? i : i * 10 + j));
  }
  return d;
}

std::vector<std::int64_t> ids(const Dataset& d) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < d.rows; ++i)
    out.push_back(static_cast<std::int64_t>(d.x[static_cast<std::size_t>(i * d.features)]));
  return out;
}

TEST(SplitHoldout, SizesAndDisjointness) {
  auto [train, eval] = split_holdout(numbered(1000), 0.15, 3);
  EXPECT_EQ(train.rows, 850);
  EXPECT_EQ(eval.rows, 150);
  EXPECT_EQ(train.features, 3);
  EXPECT_EQ(eval.classes, 4);
  EXPECT_EQ(train.x.size(), 850u * 3u);
  EXPECT_EQ(eval.y.size(), 150u);
  std::set<std::int64_t> seen;
  for (auto id : ids(train)) EXPECT_TRUE(seen.insert(id).second);
  for (auto id : ids(eval)) EXPECT_TRUE(seen.insert(id).second) << "row " << id << " in both";
  EXPECT_EQ(seen.size(), 1000u);
  // Rows stay whole: features and label travel together.
  for (std::int64_t i = 0; i < eval.rows; ++i) {
    const auto id = ids(eval)[static_cast<std::size_t>(i)];
    EXPECT_EQ(eval.y[static_cast<std::size_t>(i)], id % 4);
    EXPECT_EQ(eval.x[static_cast<std::size_t>(i * 3 + 2)], static_cast<float>(id * 10 + 2));
  }
}

// The split is the seeded permutation cut in two: eval takes its head, train its tail, in order
// (the training rows are permuted in place, so this pins that the cycles are followed right).
TEST(SplitHoldout, TrainingRowsFollowTheSeededPermutationWholeRowsIncluded) {
  const std::int64_t rows = 997;  // prime: long permutation cycles
  auto [train, eval] = split_holdout(numbered(rows), 0.1, 7);
  std::vector<std::int64_t> order(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  DataRng rng(7);
  seeded_shuffle(order, rng);
  const std::vector<std::int64_t> want_eval(order.begin(), order.begin() + eval.rows);
  const std::vector<std::int64_t> want_train(order.begin() + eval.rows, order.end());
  EXPECT_EQ(ids(eval), want_eval);
  EXPECT_EQ(ids(train), want_train);
  for (std::int64_t i = 0; i < train.rows; ++i) {
    const auto id = want_train[static_cast<std::size_t>(i)];
    EXPECT_EQ(train.y[static_cast<std::size_t>(i)], id % 4);
    EXPECT_EQ(train.x[static_cast<std::size_t>(i * 3 + 1)], static_cast<float>(id * 10 + 1));
  }
  EXPECT_EQ(train.x.size(), static_cast<std::size_t>(train.rows * 3));
}

TEST(SplitHoldout, SeededShuffleBeforeTheSplit) {
  const auto a = split_holdout(numbered(500), 0.2, 1);
  const auto b = split_holdout(numbered(500), 0.2, 1);
  const auto c = split_holdout(numbered(500), 0.2, 2);
  EXPECT_EQ(ids(a.second), ids(b.second));
  EXPECT_NE(ids(a.second), ids(c.second));
  // Not simply the tail or head of the file.
  auto eval_ids = ids(a.second);
  std::sort(eval_ids.begin(), eval_ids.end());
  EXPECT_LT(eval_ids.front(), 100);
  EXPECT_GT(eval_ids.back(), 400);
}

TEST(SplitHoldout, EdgeFractions) {
  auto [all, none] = split_holdout(numbered(10), 0.0, 1);
  EXPECT_EQ(all.rows, 10);
  EXPECT_EQ(none.rows, 0);
  EXPECT_TRUE(none.x.empty());
  auto [train, one] = split_holdout(numbered(10), 0.01, 1);  // rounds to 0, but at least one
  EXPECT_EQ(one.rows, 1);
  EXPECT_EQ(train.rows, 9);
  test::expect_data_error([] { split_holdout(numbered(10), 1.0, 1); }, "held-out split");
  test::expect_data_error([] { split_holdout(numbered(10), -0.1, 1); }, "held-out split");
  test::expect_data_error([] { split_holdout(numbered(1), 0.5, 1); }, "held-out split",
                          {"no training rows"});
}

TEST(GatherBatch, CopiesRowsAndRejectsBadIndices) {
  const Dataset d = numbered(6, 2);
  const std::vector<std::int64_t> rows = {4, 0, 4};
  std::vector<float> x(6);
  std::vector<std::int32_t> y(3);
  gather_batch(d, rows, x.data(), y.data());
  EXPECT_EQ(x, (std::vector<float>{4, 41, 0, 1, 4, 41}));
  EXPECT_EQ(y, (std::vector<std::int32_t>{0, 0, 0}));
  gather_batch(d, rows, x.data(), nullptr);
  const std::vector<std::int64_t> bad = {6};
  EXPECT_THROW(gather_batch(d, bad, x.data(), y.data()), std::out_of_range);
}

std::vector<std::int64_t> take(BatchSampler& s, std::int64_t batches) {
  std::vector<std::int64_t> out;
  for (std::int64_t b = 0; b < batches; ++b) {
    const auto batch = s.next();
    out.insert(out.end(), batch.begin(), batch.end());
  }
  return out;
}

TEST(BatchSampler, EveryEpochIsAPermutationAndEpochsDiffer) {
  BatchSampler s(103, 10, /*shuffle=*/true, 5);
  EXPECT_EQ(s.batches_per_epoch(), 10);
  std::vector<std::vector<std::int64_t>> epochs;
  for (int e = 0; e < 4; ++e) {
    const auto seq = take(s, s.batches_per_epoch());
    ASSERT_EQ(seq.size(), 100u);
    std::set<std::int64_t> unique(seq.begin(), seq.end());
    EXPECT_EQ(unique.size(), 100u) << "epoch " << e << " repeats a row";
    for (auto r : seq) ASSERT_TRUE(r >= 0 && r < 103);
    epochs.push_back(seq);
    EXPECT_EQ(s.cursor(), (BatchSampler::Cursor{e, 10}));
  }
  for (std::size_t a = 0; a < epochs.size(); ++a)
    for (std::size_t b = a + 1; b < epochs.size(); ++b) EXPECT_NE(epochs[a], epochs[b]);
}

TEST(BatchSampler, RowsDroppedByThePartialBatchVaryAcrossEpochs) {
  BatchSampler s(103, 10, true, 5);
  std::set<std::int64_t> ever_seen;
  for (int e = 0; e < 20; ++e)
    for (auto r : take(s, s.batches_per_epoch())) ever_seen.insert(r);
  EXPECT_EQ(ever_seen.size(), 103u);
}

TEST(BatchSampler, SameSeedSameOrderOtherSeedOther) {
  BatchSampler a(64, 8, true, 9), b(64, 8, true, 9), c(64, 8, true, 10);
  const auto sa = take(a, 30), sb = take(b, 30), sc = take(c, 30);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(BatchSampler, NoShuffleIsSequential) {
  BatchSampler s(10, 3, false, 1);
  EXPECT_EQ(take(s, 4), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2}));
}

TEST(BatchSampler, CursorResumeReproducesTheUninterruptedSequence) {
  const std::int64_t total = 40;  // 4 epochs of 7 batches plus some
  BatchSampler reference(50, 7, true, 123);
  std::vector<std::vector<std::int64_t>> expected;
  std::vector<BatchSampler::Cursor> cursors;
  for (std::int64_t i = 0; i < total; ++i) {
    cursors.push_back(reference.cursor());
    const auto batch = reference.next();
    expected.emplace_back(batch.begin(), batch.end());
  }
  // Resume from every point, including exactly at an epoch end ({e, 7}) and start ({e, 0}).
  for (std::int64_t start = 0; start < total; ++start) {
    BatchSampler resumed(50, 7, true, 123);
    resumed.next();  // some unrelated history that set_cursor must override
    resumed.set_cursor(cursors[static_cast<std::size_t>(start)]);
    for (std::int64_t i = start; i < total; ++i) {
      const auto batch = resumed.next();
      ASSERT_EQ(std::vector<std::int64_t>(batch.begin(), batch.end()),
                expected[static_cast<std::size_t>(i)])
          << "resumed at " << start << ", batch " << i;
    }
  }
  // A cursor at the end of an epoch and the start of the next are equivalent.
  BatchSampler at_end(50, 7, true, 123), at_start(50, 7, true, 123);
  at_end.set_cursor({1, 7});
  at_start.set_cursor({2, 0});
  const auto e = at_end.next();
  const auto first_of_end = std::vector<std::int64_t>(e.begin(), e.end());
  const auto s = at_start.next();
  EXPECT_EQ(first_of_end, std::vector<std::int64_t>(s.begin(), s.end()));
  EXPECT_EQ(at_end.cursor(), (BatchSampler::Cursor{2, 1}));
}

TEST(BatchSampler, PeekIsTheNextBatchAndMovesNothing) {
  // Across epoch ends (7 batches of 7 in 50 rows), from a fresh sampler and after set_cursor.
  BatchSampler s(50, 7, true, 9);
  for (int i = 0; i < 23; ++i) {
    const auto before = s.cursor();
    const std::vector<std::int64_t> peeked = s.peek();
    EXPECT_EQ(s.cursor(), before) << i;
    EXPECT_EQ(s.peek(), peeked) << i;
    const auto batch = s.next();
    ASSERT_EQ(std::vector<std::int64_t>(batch.begin(), batch.end()), peeked) << "batch " << i;
  }
  BatchSampler jumped(50, 7, true, 9);
  jumped.set_cursor({3, 7});
  const std::vector<std::int64_t> peeked = jumped.peek();
  const auto batch = jumped.next();
  EXPECT_EQ(std::vector<std::int64_t>(batch.begin(), batch.end()), peeked);
}

TEST(BatchSampler, BadArgumentsThrowDataError) {
  test::expect_data_error([] { BatchSampler(0, 1, true, 0); }, "batch sampler");
  test::expect_data_error([] { BatchSampler(10, 0, true, 0); }, "batch sampler");
  test::expect_data_error([] { BatchSampler(10, 11, true, 0); }, "batch sampler", {"11", "10"});
  BatchSampler s(10, 3, true, 0);
  test::expect_data_error([&] { s.set_cursor({0, 4}); }, "batch sampler");
  test::expect_data_error([&] { s.set_cursor({-1, 0}); }, "batch sampler");
}

TEST(BatchSampler, AnEpochCounterAtItsMaximumThrowsInsteadOfOverflowing) {
  BatchSampler s(10, 3, false, 0);
  s.set_cursor({std::numeric_limits<std::int64_t>::max() - 1, 3});
  s.next();  // the last epoch that exists
  EXPECT_EQ(s.cursor().epoch, std::numeric_limits<std::int64_t>::max());
  s.set_cursor({std::numeric_limits<std::int64_t>::max(), 3});
  test::expect_data_error([&] { s.next(); }, "epoch counter");
}

}  // namespace
}  // namespace mixtrain::core
