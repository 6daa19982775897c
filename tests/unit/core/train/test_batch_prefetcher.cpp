// The loader thread of the training batches (train/batch_prefetcher.h): a taken job hands over its
// buffers, any other job is waited for and dropped, failures reach the caller only for the batch
// it asked for, and nothing is left running.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <stdexcept>
#include <thread>
#include <vector>

#include "train/batch_prefetcher.h"

namespace mixtrain::core {
namespace {

template <class T>
void assign(HostArray<T>& a, std::initializer_list<T> values) {
  a.resize(values.size());
  std::copy(values.begin(), values.end(), a.data());
}

template <class T>
std::vector<T> values(const HostArray<T>& a) {
  return {a.data(), a.data() + a.size()};
}

PrefetchJob job(std::vector<std::int64_t> rows, std::uint64_t number) {
  PrefetchJob j;
  j.rows = std::move(rows);
  j.number = number;
  return j;
}

TEST(BatchPrefetcher, TheJobAskedForHandsOverItsBuffers) {
  BatchPrefetcher loader{HostBatch{}};
  HostBatch into;
  EXPECT_FALSE(loader.take(job({1, 2}, 0), into)) << "nothing was started";
  loader.start(job({4, 7}, 3), [](HostBatch& out) {
    assign(out.x, {1.5f, 2.5f});
    assign(out.y, {4, 7});
  });
  ASSERT_TRUE(loader.take(job({4, 7}, 3), into));
  EXPECT_EQ(values(into.x), (std::vector<float>{1.5f, 2.5f}));
  EXPECT_EQ(values(into.y), (std::vector<std::int32_t>{4, 7}));
  EXPECT_FALSE(loader.in_flight());
  EXPECT_EQ(loader.taken(), 1);
  EXPECT_EQ(loader.dropped(), 0);
}

TEST(BatchPrefetcher, AnotherJobIsWaitedForAndDroppedLeavingTheCallersBuffers) {
  for (const PrefetchJob& asked : {job({4, 8}, 3), job({4, 7}, 4)}) {
    BatchPrefetcher loader{HostBatch{}};
    std::atomic<bool> finished{false};
    loader.start(job({4, 7}, 3), [&](HostBatch& out) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      assign(out.x, {9.0f});
      finished = true;
    });
    HostBatch into;
    assign(into.x, {1.0f});
    EXPECT_FALSE(loader.take(asked, into));
    EXPECT_TRUE(finished) << "take() returned while the dropped job still wrote";
    EXPECT_EQ(values(into.x), (std::vector<float>{1.0f}));
    EXPECT_EQ(loader.dropped(), 1);
  }
}

TEST(BatchPrefetcher, AFailureReachesTheCallerOnlyForTheBatchItAskedFor) {
  BatchPrefetcher loader{HostBatch{}};
  HostBatch into;
  const auto fail = [](HostBatch&) { throw std::runtime_error("row 12 is unreadable"); };
  loader.start(job({12}, 0), fail);
  EXPECT_FALSE(loader.take(job({13}, 0), into)) << "another batch's failure is not this one's";
  loader.start(job({12}, 0), fail);
  try {
    loader.take(job({12}, 0), into);
    FAIL() << "the failure of the batch asked for was swallowed";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "row 12 is unreadable");
  }
  EXPECT_FALSE(loader.in_flight());
}

// One loader thread serves every job: the k-th job runs on a thread that has run k of them.
TEST(BatchPrefetcher, OneLoaderThreadServesEveryJob) {
  BatchPrefetcher loader{HostBatch{}};
  HostBatch into;
  std::vector<int> calls_on_its_thread;
  const auto caller = std::this_thread::get_id();
  for (std::uint64_t n = 0; n < 4; ++n) {
    loader.start(job({1}, n), [&](HostBatch&) {
      thread_local int calls = 0;
      calls_on_its_thread.push_back(++calls);
      EXPECT_NE(std::this_thread::get_id(), caller);
    });
    ASSERT_TRUE(loader.take(job({1}, n), into));
  }
  EXPECT_EQ(calls_on_its_thread, (std::vector<int>{1, 2, 3, 4}));
}

TEST(BatchPrefetcher, StartingAgainOrDestroyingWaitsForTheJobInFlight) {
  std::atomic<int> finished{0};
  const auto slow = [&](HostBatch&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ++finished;
  };
  {
    BatchPrefetcher loader{HostBatch{}};
    loader.start(job({1}, 0), slow);
    loader.start(job({2}, 1), slow);  // the first is dropped, after it finished
    EXPECT_EQ(finished, 1);
    EXPECT_EQ(loader.dropped(), 1);
  }
  EXPECT_EQ(finished, 2) << "destruction left a job running";
}

}  // namespace
}  // namespace mixtrain::core
