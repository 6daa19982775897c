// The communicator conformance kit (contract in communicator_conformance.h): its registry, the
// communicators it makes once per process, and the collectives' tests (the training tests are in
// communicator_training_conformance.cpp).
#include "mixtrain/conformance/communicator_conformance.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "communicator_fixture.h"
#include "component_training.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::conformance {

namespace {

std::vector<CommunicatorUnderTest>& communicators() {
  static std::vector<CommunicatorUnderTest> list;
  return list;
}

struct Made {
  internal::MadeCommunicator main, short_timeout;
  bool short_tried = false;
};
// By test name; `order` remembers the making, for releasing in reverse.
std::map<std::string, Made>& made() {
  static std::map<std::string, Made> m;
  return m;
}
std::vector<internal::MadeCommunicator*>& order() {
  static std::vector<internal::MadeCommunicator*> o;
  return o;
}

// After the last test: communicators before their backends, the last made first (MPI is
// finalised by the communicator that initialised it, the first).
class ReleaseCommunicators : public ::testing::Environment {
 public:
  void TearDown() override {
    for (auto it = order().rbegin(); it != order().rend(); ++it) (*it)->comm.reset();
    for (auto it = order().rbegin(); it != order().rend(); ++it) (*it)->backend.reset();
    order().clear();
  }
};

void make_into(internal::MadeCommunicator& m, const CommunicatorUnderTest& c,
               const CommunicatorFactory& make,
               const std::shared_ptr<sdk::DeviceBackend>& backend) {
  try {
    if (backend) {
      m.backend = backend;
    } else {
      // The backend the training tests' config makes: the communicator and the trainer must
      // share the one object it was bound to.
      auto session = internal::tiny_session(internal::TinyModel::mlp, c.options.config_overrides,
                                            std::filesystem::temp_directory_path());
      m.backend = session.components.backend;
    }
    m.comm = make();
    if (!m.comm) throw std::runtime_error("the factory returned no communicator");
    m.comm->bind(*m.backend);
  } catch (const std::exception& e) {
    m.comm.reset();
    m.error = internal::failure_text(e);
  }
  order().push_back(&m);
}

}  // namespace

void add_communicator(std::string name, CommunicatorFactory make, CommunicatorKitOptions options) {
  internal::link_communicator_training();
  std::vector<std::string> taken;
  for (const auto& c : communicators()) taken.push_back(c.name);
  internal::check_test_name("communicator", name, taken);
  if (communicators().empty()) ::testing::AddGlobalTestEnvironment(new ReleaseCommunicators);
  communicators().push_back({std::move(name), std::move(make), std::move(options)});
}
const std::vector<CommunicatorUnderTest>& registered_communicators() {
  return communicators();
}

CommunicatorFactory communicator_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                             std::string name,
                                             std::map<std::string, sdk::OptionValue> options) {
  // One registry per factory, kept by it: the library stays loaded while the communicator lives.
  auto registry = std::make_shared<core::PluginRegistry>(&core::host_log_sink());
  registry->scan(folders_or_files);
  return [registry, name = std::move(name), options = std::move(options)] {
    const core::LoadedComponent& c = registry->require(sdk::ComponentKind::communicator, name);
    std::vector<sdk::RawOption> raw;
    for (const auto& [key, value] : options) raw.push_back({key, value, {}});
    return registry->create<sdk::Communicator>(
        c, sdk::Options::resolve("distributed." + name, c.info.options, raw, {}));
  };
}

namespace internal {

MadeCommunicator& made_communicator(const CommunicatorUnderTest& c) {
  Made& m = made()[c.name];
  if (!m.main.comm && m.main.error.empty()) make_into(m.main, c, c.make, nullptr);
  return m.main;
}

MadeCommunicator& made_short_timeout_communicator(const CommunicatorUnderTest& c) {
  MadeCommunicator& main = made_communicator(c);
  Made& m = made()[c.name];
  if (!m.short_tried && c.options.short_timeout && main.comm) {
    m.short_tried = true;
    make_into(m.short_timeout, c, c.options.short_timeout, main.backend);
  }
  return m.short_timeout;
}

void CommBuffer::write(const std::vector<std::byte>& bytes) {
  if (bytes.size() != view().bytes()) throw std::logic_error("CommBuffer::write: size");
  b_->copy_from_host(view(), bytes.data());
}
void CommBuffer::write_floats(const std::vector<float>& values) {
  if (values.size() * 4 != view().bytes()) throw std::logic_error("CommBuffer::write_floats: size");
  b_->copy_from_host(view(), values.data());
}
std::vector<std::byte> CommBuffer::read() const {
  std::vector<std::byte> out(view().bytes());
  b_->copy_to_host(out.data(), view());
  return out;
}
std::vector<float> CommBuffer::read_floats() const {
  std::vector<float> out(view().bytes() / 4);
  b_->copy_to_host(out.data(), view());
  return out;
}

std::vector<std::byte> seeded_bytes(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(count);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xFF);
  return out;
}

void CommunicatorConformance::SetUp() {
  made_ = &made_communicator(GetParam());
  if (!made_->comm)
    FAIL() << "communicator '" << GetParam().name << "' could not be made: " << made_->error;
  rank_ = made_->comm->rank();
  world_ = made_->comm->world_size();
  if (world_ < 2)
    FAIL() << "communicator '" << GetParam().name << "' sees a world of " << world_
           << " rank: the kit needs 2 or more. Launch the test program as the plugin's ranks are "
              "launched (`mpirun -np 2 PROGRAM` for an MPI-based communicator)";
}

}  // namespace internal

namespace {

using internal::CommBuffer;
using internal::CommunicatorConformance;
using sdk::DType;
using sdk::ReduceOp;

// Small integers (|x| ≤ 15): every rank's sum is exact in fp32, so the expected values are too.
float element(int rank, std::int64_t i) {
  return static_cast<float>((i * 7 + rank * 13) % 31) - 15.0f;
}

// Whether `got` is within one rounding of `want` (the average's division may round either way).
bool within_one_rounding(float got, double want) {
  const float nearest = static_cast<float>(want);
  return got == nearest || got == std::nextafter(nearest, std::numeric_limits<float>::infinity()) ||
         got == std::nextafter(nearest, -std::numeric_limits<float>::infinity());
}

TEST_P(CommunicatorConformance, RanksAreDistinctAndEveryRankSeesTheSameWorld) {
  EXPECT_GE(rank(), 0);
  EXPECT_LT(rank(), world());
  EXPECT_FALSE(comm().description().empty()) << "description() is the line the logs show";
  // One slot per rank, set by its owner: the sum is 1 everywhere only if each rank is one.
  std::vector<double> seen(static_cast<std::size_t>(world()), 0.0);
  seen[static_cast<std::size_t>(rank())] = 1.0;
  comm().all_reduce_host(seen, ReduceOp::sum);
  for (int r = 0; r < world(); ++r)
    EXPECT_EQ(seen[static_cast<std::size_t>(r)], 1.0)
        << "rank " << r << " is claimed by " << seen[static_cast<std::size_t>(r)];
  double sizes[2] = {static_cast<double>(world()), -static_cast<double>(world())};
  comm().all_reduce_host(sizes, ReduceOp::max);
  EXPECT_EQ(sizes[0], world()) << "the ranks disagree on the world size";
  EXPECT_EQ(-sizes[1], world()) << "the ranks disagree on the world size";
}

TEST_P(CommunicatorConformance, AllReduceSumsAveragesAndTakesTheMaxOfFp32) {
  for (const std::int64_t n :
       {std::int64_t{1}, std::int64_t{3}, std::int64_t{1000}, std::int64_t{(1 << 20) + 3}}) {
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      std::vector<float> mine(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = element(rank(), i);
      CommBuffer b(backend(), DType::fp32, n);
      b.write_floats(mine);
      comm().all_reduce(b.view(), op);
      const auto got = b.read_floats();
      std::int64_t wrong = 0, first = -1;
      for (std::int64_t i = 0; i < n; ++i) {
        double sum = 0, max = -1e30;
        for (int r = 0; r < world(); ++r) {
          sum += element(r, i);
          max = std::max<double>(max, element(r, i));
        }
        const float g = got[static_cast<std::size_t>(i)];
        const bool ok = op == ReduceOp::sum   ? g == static_cast<float>(sum)
                        : op == ReduceOp::max ? g == static_cast<float>(max)
                                              : within_one_rounding(g, sum / world());
        if (!ok && wrong++ == 0) first = i;
      }
      EXPECT_EQ(wrong, 0) << sdk::reduce_op_name(op) << " of " << n << " fp32 elements: " << wrong
                          << " wrong, the first at " << first;
    }
  }
}

TEST_P(CommunicatorConformance, AllReduceCarriesInfAndNanAsIeeeDoes) {
  // Rank 0 overflowed in two elements; the host must see that on every rank.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    CommBuffer b(backend(), DType::fp32, 4);
    b.write_floats(rank() == 0 ? std::vector<float>{inf, 1.0f, nan, -inf}
                               : std::vector<float>{1.0f, 1.0f, 1.0f, 1.0f});
    comm().all_reduce(b.view(), op);
    const auto got = b.read_floats();
    EXPECT_EQ(got[0], inf) << sdk::reduce_op_name(op) << " of inf and finite values";
    if (op != ReduceOp::max) {  // IEEE's maxNum may return the number beside a NaN
      EXPECT_TRUE(std::isnan(got[2])) << sdk::reduce_op_name(op) << " of NaN gave " << got[2];
      EXPECT_EQ(got[3], -inf) << sdk::reduce_op_name(op) << " of -inf and finite values";
    }
  }
}

TEST_P(CommunicatorConformance, AnotherDtypeReducesExactlyOrIsABackendErrorNamingIt) {
  for (const DType dtype : {DType::fp16, DType::bf16}) {
    // 2.0 on every rank: the sum (2 · world) is exact in both formats.
    std::vector<std::uint16_t> values(5, 0x4000);  // 2.0 in both formats
    std::vector<std::byte> bytes(values.size() * 2);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    CommBuffer b(backend(), dtype, 5);
    b.write(bytes);
    try {
      comm().all_reduce(b.view(), ReduceOp::sum);
    } catch (const sdk::BackendError& e) {
      EXPECT_NE(std::string(e.what()).find(sdk::dtype_name(dtype)), std::string::npos)
          << "a refusal names the dtype: " << e.what();
      continue;
    }
    const auto out = b.read();
    std::vector<std::uint16_t> got(5);
    std::memcpy(got.data(), out.data(), out.size());
    // 2 · world as the format's bits: both put 2^k at exponent bias + k.
    const float want = 2.0f * static_cast<float>(world());
    for (std::size_t i = 0; i < got.size(); ++i) {
      float g = 0;
      if (dtype == DType::bf16) {
        const std::uint32_t w = static_cast<std::uint32_t>(got[i]) << 16;
        std::memcpy(&g, &w, 4);
      } else {
        const int exponent = (got[i] >> 10) & 0x1F;
        const int mantissa = got[i] & 0x3FF;
        g = std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, exponent - 15);
        if (got[i] & 0x8000) g = -g;
      }
      EXPECT_EQ(g, want) << sdk::dtype_name(dtype) << " sum, element " << i;
    }
  }
}

TEST_P(CommunicatorConformance, ReduceScatterGivesEachRankTheReductionOfItsPiece) {
  for (const std::int64_t piece : {std::int64_t{1}, std::int64_t{1000}}) {
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const std::int64_t n = piece * world();
      std::vector<float> mine(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = element(rank(), i);
      CommBuffer send(backend(), DType::fp32, n), recv(backend(), DType::fp32, piece);
      send.write_floats(mine);
      recv.write_floats(std::vector<float>(static_cast<std::size_t>(piece), -99.0f));
      comm().reduce_scatter(send.view(), recv.view(), op);
      const auto got = recv.read_floats();
      std::int64_t wrong = 0, first = -1;
      for (std::int64_t i = 0; i < piece; ++i) {
        double sum = 0;
        for (int r = 0; r < world(); ++r) sum += element(r, rank() * piece + i);
        const float g = got[static_cast<std::size_t>(i)];
        const bool ok = op == ReduceOp::sum ? g == static_cast<float>(sum)
                                            : within_one_rounding(g, sum / world());
        if (!ok && wrong++ == 0) first = i;
      }
      EXPECT_EQ(wrong, 0) << sdk::reduce_op_name(op) << " reduce-scatter of pieces of " << piece
                          << ": rank " << rank() << " got " << wrong
                          << " wrong elements of its piece, the first at " << first;
    }
  }
}

TEST_P(CommunicatorConformance, AllGatherPutsEachRanksSendAtItsPieceInEveryDtype) {
  for (const DType dtype : sdk::kAllDTypes) {
    for (const std::int64_t piece : {std::int64_t{1}, std::int64_t{5}, std::int64_t{4099}}) {
      const std::size_t bytes = static_cast<std::size_t>(piece) * sdk::dtype_size(dtype);
      const auto seed = [&](int r) {
        return static_cast<std::uint32_t>(1000 * r + 10 * static_cast<int>(dtype) + piece);
      };
      CommBuffer send(backend(), dtype, piece), recv(backend(), dtype, piece * world());
      send.write(internal::seeded_bytes(bytes, seed(rank())));
      recv.write(std::vector<std::byte>(bytes * static_cast<std::size_t>(world()), std::byte{0}));
      comm().all_gather(send.view(), recv.view());
      const auto got = recv.read();
      for (int r = 0; r < world(); ++r) {
        const auto want = internal::seeded_bytes(bytes, seed(r));
        EXPECT_EQ(std::memcmp(got.data() + bytes * static_cast<std::size_t>(r), want.data(), bytes),
                  0)
            << "all-gather of " << piece << " " << sdk::dtype_name(dtype)
            << " elements per rank: piece " << r << " is not rank " << r << "'s send, bit for bit";
      }
    }
  }
}

TEST_P(CommunicatorConformance, BroadcastCopiesTheRootsDataInEveryDtype) {
  for (const DType dtype : sdk::kAllDTypes) {
    for (int root = 0; root < world(); ++root) {
      const std::int64_t n = 4099;
      const std::size_t bytes = static_cast<std::size_t>(n) * sdk::dtype_size(dtype);
      const auto seed = [&](int r) {
        return static_cast<std::uint32_t>(77 * r + 3 * static_cast<int>(dtype));
      };
      CommBuffer b(backend(), dtype, n);
      b.write(internal::seeded_bytes(bytes, seed(rank())));
      comm().broadcast(b.view(), root);
      EXPECT_EQ(b.read(), internal::seeded_bytes(bytes, seed(root)))
          << "broadcast of " << n << " " << sdk::dtype_name(dtype) << " elements from rank " << root
          << " to rank " << rank();
    }
  }
}

TEST_P(CommunicatorConformance, HostCollectivesReduceDoublesAndBroadcastBytes) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.25 * static_cast<double>(rank() + 1) + i;
  v[7] = rank() == 0 ? inf : 1.0;  // Σg² of an overflowed rank
  v[8] = rank() == world() - 1 ? std::nan("") : 1.0;
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    auto got = v;
    comm().all_reduce_host(got, op);
    double sum0 = 0;
    for (int r = 0; r < world(); ++r) sum0 += 0.25 * (r + 1);
    const double want0 = op == ReduceOp::sum   ? sum0
                         : op == ReduceOp::avg ? sum0 / world()
                                               : 0.25 * world();
    EXPECT_DOUBLE_EQ(got[0], want0) << sdk::reduce_op_name(op) << " of host doubles";
    EXPECT_EQ(got[7], inf) << sdk::reduce_op_name(op) << " of host doubles with an inf";
    if (op != ReduceOp::max) {
      EXPECT_TRUE(std::isnan(got[8])) << sdk::reduce_op_name(op) << " of host doubles with a NaN";
    }
  }
  for (int root = 0; root < world(); ++root) {
    for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{1} << 20}) {
      // The others start larger and smaller than the root's: broadcast_host resizes them.
      std::vector<std::byte> bytes = rank() == root
                                         ? internal::seeded_bytes(size, 5 + root)
                                         : internal::seeded_bytes(rank() % 2 ? size + 9 : 3, 1);
      comm().broadcast_host(bytes, root);
      EXPECT_EQ(bytes, internal::seeded_bytes(size, 5 + root))
          << "broadcast_host of " << size << " bytes from rank " << root << " to rank " << rank();
    }
  }
  comm().barrier();
}

TEST_P(CommunicatorConformance, OperationsStartedTogetherCompleteInAnyOrder) {
  const std::int64_t n = 1 << 16;
  CommBuffer a(backend(), DType::fp32, n), b(backend(), DType::fp32, n),
      rs_send(backend(), DType::fp32, n * world()), rs_recv(backend(), DType::fp32, n),
      ag_send(backend(), DType::bf16, n), ag_recv(backend(), DType::bf16, n * world()),
      dropped(backend(), DType::fp32, n);
  a.write_floats(std::vector<float>(static_cast<std::size_t>(n), 1.0f + rank()));
  b.write_floats(std::vector<float>(static_cast<std::size_t>(n), 2.0f * rank()));
  rs_send.write_floats(std::vector<float>(static_cast<std::size_t>(n * world()), 1.0f));
  ag_send.write(internal::seeded_bytes(static_cast<std::size_t>(n) * 2, 40 + rank()));
  dropped.write_floats(std::vector<float>(static_cast<std::size_t>(n), 3.0f));
  // The host's order during backward: buckets started as gradients are ready, waited later.
  auto ha = comm().start_all_reduce(a.view(), ReduceOp::sum);
  comm().progress();
  auto hb = comm().start_all_reduce(b.view(), ReduceOp::max);
  auto hrs = comm().start_reduce_scatter(rs_send.view(), rs_recv.view(), ReduceOp::sum);
  comm().progress();
  auto hag = comm().start_all_gather(ag_send.view(), ag_recv.view());
  // A handle dropped without a wait completes first (its destructor waits).
  comm().start_all_reduce(dropped.view(), ReduceOp::sum).reset();
  // Wait in the reverse order, polling the first with test() and progress().
  hag->wait();
  hrs->wait();
  hb->wait();
  for (int i = 0; i < 100000 && !ha->test(); ++i) {
    comm().progress();
    if (i > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ha->wait();
  EXPECT_TRUE(ha->test()) << "a completed handle's test() stays true";
  EXPECT_TRUE(hb->test()) << "a completed handle's test() stays true";
  double sum_a = 0;
  for (int r = 0; r < world(); ++r) sum_a += 1.0 + r;
  EXPECT_EQ(a.read_floats(),
            std::vector<float>(static_cast<std::size_t>(n), static_cast<float>(sum_a)))
      << "the first all-reduce (sum), started before the others and waited last";
  EXPECT_EQ(b.read_floats(),
            std::vector<float>(static_cast<std::size_t>(n), 2.0f * static_cast<float>(world() - 1)))
      << "the second all-reduce (max)";
  EXPECT_EQ(rs_recv.read_floats(),
            std::vector<float>(static_cast<std::size_t>(n), static_cast<float>(world())))
      << "the reduce-scatter started among them";
  const auto gathered = ag_recv.read();
  for (int r = 0; r < world(); ++r)
    EXPECT_EQ(std::memcmp(gathered.data() + static_cast<std::size_t>(n) * 2 * r,
                          internal::seeded_bytes(static_cast<std::size_t>(n) * 2, 40 + r).data(),
                          static_cast<std::size_t>(n) * 2),
              0)
        << "the all-gather started among them: piece " << r;
  EXPECT_EQ(dropped.read_floats(),
            std::vector<float>(static_cast<std::size_t>(n), 3.0f * static_cast<float>(world())))
      << "an all-reduce whose handle was dropped unwaited";
}

TEST_P(CommunicatorConformance, MismatchedSizesAndARootOutsideTheWorldAreBackendErrors) {
  CommBuffer three(backend(), DType::fp32, 3), one(backend(), DType::fp32, 1);
  // 3 is not world × 1 elements (world ≥ 2), nor is 1 world × 3.
  EXPECT_THROW(comm().start_reduce_scatter(three.view(), one.view(), ReduceOp::sum),
               sdk::BackendError)
      << "reduce-scatter of 3 elements into 1 on " << world() << " ranks";
  EXPECT_THROW(comm().start_all_gather(three.view(), one.view()), sdk::BackendError)
      << "all-gather of 3 elements into 1";
  EXPECT_THROW(comm().start_all_gather(one.view(), three.view()), sdk::BackendError)
      << "all-gather of 1 element into 3 (" << world() << " ranks)";
  EXPECT_THROW(comm().broadcast(one.view(), world()), sdk::BackendError)
      << "broadcast from rank " << world() << " of " << world();
  EXPECT_THROW(comm().broadcast(one.view(), -1), sdk::BackendError) << "broadcast from rank -1";
  std::vector<std::byte> bytes(3);
  EXPECT_THROW(comm().broadcast_host(bytes, world()), sdk::BackendError)
      << "broadcast_host from rank " << world() << " of " << world();
  // Each rank refused before sending anything: they still agree on what comes next.
  CommBuffer after(backend(), DType::fp32, 1);
  after.write_floats({1.0f});
  comm().all_reduce(after.view(), ReduceOp::sum);
  EXPECT_EQ(after.read_floats(), std::vector<float>{static_cast<float>(world())})
      << "the collective after the refused ones";
}

// The last rank joins late: the others' wait, on the short-timeout communicator, ends with an
// error naming the operation; the last rank joins once they are past it (a barrier of the main
// communicator, which they enter only then: no sleep decides the order on a loaded machine).
TEST_P(CommunicatorConformance, AWaitForALatePeerEndsWithACommunicationErrorNamingIt) {
  const auto& c = GetParam();
  if (!c.options.short_timeout)
    GTEST_SKIP() << "communicator '" << c.name
                 << "': give add_communicator() a short_timeout factory to test that a wait for a "
                    "peer that does not join ends in time";
  auto& short_fuse = internal::made_short_timeout_communicator(c);
  ASSERT_TRUE(short_fuse.comm) << "the short_timeout communicator could not be made: "
                               << short_fuse.error;
  const bool late = rank() == world() - 1;
  CommBuffer b(backend(), DType::fp32, 1);
  b.write_floats({1.0f});
  if (late) comm().barrier();
  auto h = short_fuse.comm->start_all_reduce(b.view(), ReduceOp::sum);
  if (!late) {
    const auto start = std::chrono::steady_clock::now();
    try {
      h->wait();
      ADD_FAILURE() << "the wait for a rank that has not joined should have timed out";
    } catch (const sdk::CommunicationError& e) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string what = e.what();
      EXPECT_NE(what.find("all_reduce"), std::string::npos)
          << "the error names the operation: " << what;
      EXPECT_LE(waited, c.options.short_timeout_s + 10.0)
          << "waited " << waited << " s for a " << c.options.short_timeout_s << " s timeout";
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a timed-out wait throws sdk::CommunicationError, not: " << e.what();
    }
    comm().barrier();  // the late rank may join now
  }
  // The collective still completes once every rank is in it.
  for (int i = 0; i < 60000 && !h->test(); ++i) {
    short_fuse.comm->progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(h->test()) << "the all-reduce did not complete once the late rank joined";
  EXPECT_EQ(b.read_floats(), std::vector<float>{static_cast<float>(world())});
}

INSTANTIATE_TEST_SUITE_P(communicator, CommunicatorConformance,
                         ::testing::ValuesIn(registered_communicators()),
                         [](const auto& info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CommunicatorConformance);

}  // namespace
}  // namespace mixtrain::conformance
