// The Open MPI communicator (plugins/communicator_mpi) on the CPU backend, run by ctest as
// `mpirun -np 2`: every collective against values each rank can predict, the non-blocking forms,
// progress, bad input, and a timeout that names the operation. Tests that need 2 ranks skip, saying
// so, in one process.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <thread>
#include <vector>

#include "cpu_backend.h"
#include "forwarding_backend.h"
#include "mpi_communicator.h"
#include "plugin_test_support.h"

namespace mixtrain::communicators {
namespace {

sdk::Options options(double timeout_s = 60.0, const std::string& progress = "test") {
  return sdk::Options::resolve("distributed.mpi", MpiCommunicator::option_schema(),
                               {{"timeout_s", timeout_s, {}}, {"progress", progress, {}}}, {}, {});
}

// MPI may be initialised once per process: one communicator owns it for the whole test program
// and finalises it after the last test (mpirun calls a rank that exits without it a failure).
class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    backend = std::make_unique<backend_cpu::CpuBackend>(1);
    // The threaded one first: it initialises MPI with MPI_THREAD_MULTIPLE, which serves both.
    threaded = std::make_unique<MpiCommunicator>(options(60.0, "thread"), sdk::PluginContext{});
    threaded->bind(*backend);
    tested = std::make_unique<MpiCommunicator>(options(), sdk::PluginContext{});
    tested->bind(*backend);
  }
  void TearDown() override {
    tested.reset();
    threaded.reset();  // it initialised MPI, so it finalises it
    backend.reset();
  }
  static inline std::unique_ptr<sdk::DeviceBackend> backend;
  static inline std::unique_ptr<MpiCommunicator> tested, threaded;
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

// Every collective under both progress modes: "test" and "thread".
class MpiCommunicatorTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = MpiEnvironment::backend.get();
    comm_ = GetParam() == "thread" ? MpiEnvironment::threaded.get() : MpiEnvironment::tested.get();
    if (comm_->world_size() < 2) GTEST_SKIP() << "needs 2 ranks: run under mpirun -np 2";
  }
  static std::vector<float> host(sdk::TensorView v) {
    std::vector<float> out(static_cast<std::size_t>(v.numel()));
    backend_->copy_to_host(out.data(), v);
    return out;
  }
  struct Buffer {
    void* p;
    sdk::TensorView view;
    ~Buffer() { backend_->deallocate(p); }
  };
  static Buffer make(std::vector<float> values) {
    void* p = backend_->allocate(values.size() * 4);
    sdk::TensorView v{p, sdk::DType::fp32, sdk::Shape{static_cast<std::int64_t>(values.size())}};
    backend_->copy_from_host(v, values.data());
    return {p, v};
  }
  static int rank() { return comm_->rank(); }
  static inline sdk::DeviceBackend* backend_ = nullptr;
  static inline MpiCommunicator* comm_ = nullptr;
};

TEST_P(MpiCommunicatorTest, AllReduceSumAvgMax) {
  const float r = static_cast<float>(rank());
  for (auto [op, expect] : {std::pair{sdk::ReduceOp::sum, std::vector<float>{1, 3, -1}},
                            std::pair{sdk::ReduceOp::avg, std::vector<float>{0.5f, 1.5f, -0.5f}},
                            std::pair{sdk::ReduceOp::max, std::vector<float>{1, 2, 0}}}) {
    auto b = make({r, 1 + r, -r});
    comm_->all_reduce(b.view, op);
    EXPECT_EQ(host(b.view), expect) << sdk::reduce_op_name(op);
  }
}

TEST_P(MpiCommunicatorTest, ReduceScatterGivesEachRankItsPiece) {
  const float r = static_cast<float>(rank());
  auto send = make({r, 10 + r, 100 + r, 1000 + r});
  auto recv = make({0, 0});
  comm_->reduce_scatter(send.view, recv.view, sdk::ReduceOp::sum);
  EXPECT_EQ(host(recv.view),
            rank() == 0 ? (std::vector<float>{1, 21}) : (std::vector<float>{201, 2001}));
}

TEST_P(MpiCommunicatorTest, AllGatherOfFp32AndOfNarrowBytes) {
  const float r = static_cast<float>(rank());
  auto send = make({r, r + 0.5f});
  auto recv = make({0, 0, 0, 0});
  comm_->all_gather(send.view, recv.view);
  EXPECT_EQ(host(recv.view), (std::vector<float>{0, 0.5f, 1, 1.5f}));
  // bf16 moves as bytes: 4 bf16 values in 8 bytes of each buffer.
  std::vector<std::uint16_t> mine = {static_cast<std::uint16_t>(0x3F80 + rank()), 0x4000};
  std::vector<std::uint16_t> all(4, 0);
  const sdk::TensorView s{mine.data(), sdk::DType::bf16, sdk::Shape{2}};
  const sdk::TensorView g{all.data(), sdk::DType::bf16, sdk::Shape{4}};
  comm_->all_gather(s, g);
  EXPECT_EQ(all, (std::vector<std::uint16_t>{0x3F80, 0x4000, 0x3F81, 0x4000}));
}

TEST_P(MpiCommunicatorTest, BroadcastFromRankOne) {
  auto b = make({static_cast<float>(rank()) * 7, 3});
  comm_->broadcast(b.view, 1);
  EXPECT_EQ(host(b.view), (std::vector<float>{7, 3}));
}

TEST_P(MpiCommunicatorTest, HostCollectives) {
  double v[2] = {static_cast<double>(rank()) + 0.25, -static_cast<double>(rank())};
  comm_->all_reduce_host(v, sdk::ReduceOp::sum);
  EXPECT_EQ(v[0], 1.5);
  EXPECT_EQ(v[1], -1.0);
  std::vector<std::byte> bytes;
  if (rank() == 1) bytes = {std::byte{4}, std::byte{2}};
  comm_->broadcast_host(bytes, 1);
  EXPECT_EQ(bytes, (std::vector<std::byte>{std::byte{4}, std::byte{2}}));
  comm_->barrier();
}

TEST_P(MpiCommunicatorTest, NonBlockingWithProgressBetweenOps) {
  std::vector<float> big(1 << 20, static_cast<float>(rank() + 1));
  auto b = make(big);
  auto h = comm_->start_all_reduce(b.view, sdk::ReduceOp::sum);
  for (int i = 0; i < 100 && !h->test(); ++i) comm_->progress();
  h->wait();
  EXPECT_TRUE(h->test());
  const auto out = host(b.view);
  EXPECT_EQ(out.front(), 3.0f);
  EXPECT_EQ(out.back(), 3.0f);
}

TEST_P(MpiCommunicatorTest, BadInputIsBackendError) {
  auto a = make({1, 2, 3});
  auto c = make({1});
  EXPECT_THROW(comm_->start_reduce_scatter(a.view, c.view, sdk::ReduceOp::sum),
               sdk::BackendError);  // 3 != 1 × 2
  EXPECT_THROW(comm_->start_all_gather(a.view, c.view), sdk::BackendError);
  std::vector<std::uint16_t> half(2, 0);
  const sdk::TensorView h{half.data(), sdk::DType::fp16, sdk::Shape{2}};
  EXPECT_THROW(comm_->start_all_reduce(h, sdk::ReduceOp::sum), sdk::BackendError);
  // Both ranks threw before any MPI call: they still agree on what comes next.
  comm_->barrier();
}

// Rank 1 joins late: rank 0's wait with a short timeout fails naming the operation; it then
// waits again (the request is still live) and completes once rank 1 joins. Rank 1 joins only
// after rank 0's timeout, released by a barrier of the fixture's own communicator that rank 0
// enters then: no sleep decides the order on a loaded machine.
TEST_P(MpiCommunicatorTest, AWaitThatTimesOutNamesTheOperation) {
  MpiCommunicator short_fuse(options(0.5, GetParam()), sdk::PluginContext{});
  short_fuse.bind(*backend_);
  auto b = make({1});
  if (rank() == 1) comm_->barrier();
  auto h = short_fuse.start_all_reduce(b.view, sdk::ReduceOp::sum);
  if (rank() == 0) {
    try {
      h->wait();
      ADD_FAILURE() << "the wait should have timed out";
    } catch (const sdk::CommunicationError& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce (sum) of 1 fp32 elements"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("timeout_s"), std::string::npos) << e.what();
    }
    comm_->barrier();  // rank 1 may join now
  }
  // The collective still completes once both ranks are in it.
  while (!h->test()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(host(b.view), (std::vector<float>{2}));
}

INSTANTIATE_TEST_SUITE_P(Progress, MpiCommunicatorTest, ::testing::Values("test", "thread"));

TEST(MpiCommunicatorBind, RefusesABackendThatIsNotTheHosts) {
  MpiCommunicator comm(options(), sdk::PluginContext{});
  class NotHost : public test::ForwardingBackend {
   public:
    NotHost() : ForwardingBackend(std::make_shared<backend_cpu::CpuBackend>(1)) {}
    sdk::BackendCapabilities capabilities() const override {
      auto c = in_->capabilities();
      c.kind = "cuda";
      return c;
    }
  } gpu;
  try {
    comm.bind(gpu);
    FAIL() << "bind should refuse a cuda backend";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.full_message()).find("nccl"), std::string::npos) << e.full_message();
  }
}

// plugins/communicator_mpi/README.md documents every option exactly as the schema declares it.
TEST(MpiCommunicatorReadme, OptionTableMatchesTheSchema) {
  const std::string readme =
      std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/plugins/communicator_mpi/README.md";
  std::vector<std::string> expected;
  for (const auto& spec : MpiCommunicator::option_schema())
    expected.push_back(test::readme_row(spec));
  EXPECT_EQ(test::readme_rows(readme, "mpi"), expected) << "update the table in " << readme;
}

}  // namespace
}  // namespace mixtrain::communicators
