// The nccl communicator's MPI half (mpi_channel.h) on CPUs, two ranks under mpirun (ctest runs
// it as `mpirun -np 2`): the duplicate communicator, the local rank, the host collectives'
// values, and a host collective that a peer never joins ending in CommunicationError naming the
// operation within the timeout, with the failure hook called (where the communicator aborts NCCL).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/sdk/error.h"
#include "mpi_channel.h"

namespace mixtrain::communicator_nccl {
namespace {

// One channel for the whole process: it initialises MPI before the first test and finalises it
// after the last.
std::unique_ptr<MpiChannel> channel;

class MpiEnvironment final : public ::testing::Environment {
 public:
  void SetUp() override { channel = std::make_unique<MpiChannel>(30.0, sdk::Logger{}); }
  void TearDown() override { channel.reset(); }
};
const auto* const environment = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

class nccl_mpi_channel : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(channel, nullptr);
    if (channel->size() != 2) GTEST_SKIP() << "needs two ranks: run under mpirun -np 2";
  }
  int rank() const { return channel->rank(); }
};

TEST_F(nccl_mpi_channel, RanksAndLocalRanks) {
  EXPECT_TRUE(channel->initialised_mpi());
  EXPECT_TRUE(rank() == 0 || rank() == 1);
  EXPECT_EQ(channel->local_rank(), rank());  // one node: Open MPI's local rank is the rank
  channel->barrier();
}

TEST_F(nccl_mpi_channel, AllReduceSumAvgMax) {
  const auto r = static_cast<double>(rank());
  std::vector<double> v = {r + 1, -r, 0.5};
  channel->all_reduce(v, sdk::ReduceOp::sum);
  EXPECT_EQ(v, (std::vector<double>{3.0, -1.0, 1.0}));
  v = {r + 1, -r, 0.5};
  channel->all_reduce(v, sdk::ReduceOp::avg);
  EXPECT_EQ(v, (std::vector<double>{1.5, -0.5, 0.5}));
  v = {r + 1, -r, 0.5};
  channel->all_reduce(v, sdk::ReduceOp::max);
  EXPECT_EQ(v, (std::vector<double>{2.0, 0.0, 0.5}));
  std::vector<double> none;
  channel->all_reduce(none, sdk::ReduceOp::sum);
}

TEST_F(nccl_mpi_channel, BroadcastResizesTheOtherRanks) {
  std::vector<std::byte> bytes;
  if (rank() == 1) bytes = {std::byte{7}, std::byte{0}, std::byte{255}, std::byte{3}, std::byte{9}};
  channel->broadcast(bytes, 1);
  EXPECT_EQ(bytes, (std::vector<std::byte>{std::byte{7}, std::byte{0}, std::byte{255}, std::byte{3},
                                           std::byte{9}}));
  std::vector<std::byte> empty;
  if (rank() == 0) empty = {};
  channel->broadcast(empty, 0);
  EXPECT_TRUE(empty.empty());
  char id[128] = {};
  if (rank() == 0)
    for (int i = 0; i < 128; ++i) id[i] = static_cast<char>(i);
  channel->broadcast(id, 128, 0, "setup (broadcast of the ncclUniqueId)");
  for (int i = 0; i < 128; ++i) EXPECT_EQ(id[i], static_cast<char>(i));
}

TEST_F(nccl_mpi_channel, RootOutOfRangeIsBackendError) {
  std::vector<std::byte> bytes;
  try {
    channel->broadcast(bytes, 2);
    FAIL() << "no BackendError";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl.broadcast_host: root 2 is not a rank of this run "
                                         "(ranks 0..1)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(nccl_mpi_channel, APeerThatNeverJoinsIsCommunicationErrorWithinTheTimeout) {
  // A channel of its own (its duplicate communicator is left behind by the failure). Rank 0
  // waits 0.5 s for a barrier rank 1 joins only after rank 0 gave up: rank 1 waits in the
  // fixture channel's barrier, which rank 0 enters after its timeout (no sleep orders them).
  MpiChannel late(rank() == 0 ? 0.5 : 30.0, sdk::Logger{});
  int polls = 0, failures = 0;
  std::string hooked;
  late.set_hooks([&](const char*) { ++polls; },
                 [&](const std::string& message) {
                   ++failures;
                   hooked = message;
                 });
  if (rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    try {
      late.barrier();
      ADD_FAILURE() << "the barrier completed without rank 1";
    } catch (const sdk::CommunicationError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("nccl.barrier on rank 0 of 2: timed out after 0.5 s waiting for the "
                          "other ranks"),
                std::string::npos)
          << what;
      EXPECT_NE(e.hint().find("timeout_s"), std::string::npos) << e.hint();
      EXPECT_EQ(hooked, what);
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(waited, 0.5);
    EXPECT_EQ(failures, 1);
    EXPECT_GT(polls, 0);
    channel->barrier();  // rank 1 may join now
  } else {
    channel->barrier();
    late.barrier();  // matches rank 0's abandoned barrier
    EXPECT_EQ(failures, 0);
  }
  channel->barrier();  // both ranks leave the test together
}

}  // namespace
}  // namespace mixtrain::communicator_nccl
