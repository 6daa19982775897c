// mixtrain's communicator conformance program: the Open MPI communicator, in both of its progress
// modes, through the kit (communicator_conformance.h), run by ctest under `mpirun -np 2`. With
// MIXTRAIN_CONFORMANCE_FAULTS=1 it also registers communicators that break the kit's contract,
// each a wrapper of the MPI one with one fault (faulty_communicators_fail.sh), and one whose
// factory throws.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "mixtrain/conformance/backend_conformance.h"
#include "mixtrain/conformance/communicator_conformance.h"
#include "mixtrain/sdk/error.h"

namespace {

using namespace mixtrain;

class Done : public sdk::CommunicationHandle {
 public:
  bool test() override { return true; }
  void wait() override {}
};

// Forwards every call to a real communicator; a fault overrides one.
class Forwarding : public sdk::Communicator {
 public:
  explicit Forwarding(std::shared_ptr<sdk::Communicator> in) : in_(std::move(in)) {}
  int rank() const override { return in_->rank(); }
  int world_size() const override { return in_->world_size(); }
  std::string description() const override { return "faulty " + in_->description(); }
  void bind(sdk::DeviceBackend& backend) override { in_->bind(backend); }
  sdk::CommunicationHandlePtr start_all_reduce(sdk::TensorView data, sdk::ReduceOp op) override {
    return in_->start_all_reduce(data, op);
  }
  sdk::CommunicationHandlePtr start_reduce_scatter(sdk::TensorView send, sdk::TensorView recv,
                                                   sdk::ReduceOp op) override {
    return in_->start_reduce_scatter(send, recv, op);
  }
  sdk::CommunicationHandlePtr start_all_gather(sdk::TensorView send,
                                               sdk::TensorView recv) override {
    return in_->start_all_gather(send, recv);
  }
  void broadcast(sdk::TensorView data, int root) override { in_->broadcast(data, root); }
  void progress() override { in_->progress(); }
  void barrier() override { in_->barrier(); }
  void all_reduce_host(std::span<double> values, sdk::ReduceOp op) override {
    in_->all_reduce_host(values, op);
  }
  void broadcast_host(std::vector<std::byte>& bytes, int root) override {
    in_->broadcast_host(bytes, root);
  }

 protected:
  std::shared_ptr<sdk::Communicator> in_;
};

// Averages by summing: a wrong number the host would train on (gradients × world).
class AvgIsSum : public Forwarding {
 public:
  using Forwarding::Forwarding;
  sdk::CommunicationHandlePtr start_all_reduce(sdk::TensorView data, sdk::ReduceOp op) override {
    return in_->start_all_reduce(data, op == sdk::ReduceOp::avg ? sdk::ReduceOp::sum : op);
  }
};

// Gives rank r the reduction of piece r + 1: a sharded optimizer would step another rank's
// parameters. Host memory (the CPU backend's), so the pieces are copied with memcpy.
class WrongPiece : public Forwarding {
 public:
  using Forwarding::Forwarding;
  sdk::CommunicationHandlePtr start_reduce_scatter(sdk::TensorView send, sdk::TensorView recv,
                                                   sdk::ReduceOp op) override {
    if (send.numel() != recv.numel() * world_size())
      throw sdk::BackendError("reduce_scatter: sizes");
    std::vector<float> all(static_cast<std::size_t>(send.numel()));
    std::memcpy(all.data(), send.data, send.bytes());
    in_->all_reduce({all.data(), sdk::DType::fp32, sdk::Shape{send.numel()}}, op);
    const int piece = (rank() + 1) % world_size();
    std::memcpy(recv.data, all.data() + static_cast<std::size_t>(piece * recv.numel()),
                recv.bytes());
    return std::make_unique<Done>();
  }
};

// Gathers fp32 only: the host gathers bf16 weight shards.
class GathersFp32Only : public Forwarding {
 public:
  using Forwarding::Forwarding;
  sdk::CommunicationHandlePtr start_all_gather(sdk::TensorView send,
                                               sdk::TensorView recv) override {
    if (send.dtype != sdk::DType::fp32)
      throw sdk::BackendError("all_gather: " + std::string(sdk::dtype_name(send.dtype)) +
                              " is not supported, only fp32");
    return in_->start_all_gather(send, recv);
  }
};

// Leaves a non-root's vector at its own size: the host would read stale or cut metadata.
class HostBroadcastKeepsSize : public Forwarding {
 public:
  using Forwarding::Forwarding;
  void broadcast_host(std::vector<std::byte>& bytes, int root) override {
    const std::size_t had = bytes.size();
    in_->broadcast_host(bytes, root);
    bytes.resize(had);
  }
};

// Reduces nothing over 1000 elements: each rank trains on its own gradients and the replicas
// drift apart.
class SkipsBigBuckets : public Forwarding {
 public:
  using Forwarding::Forwarding;
  sdk::CommunicationHandlePtr start_all_reduce(sdk::TensorView data, sdk::ReduceOp op) override {
    if (data.numel() > 1000) return std::make_unique<Done>();
    return in_->start_all_reduce(data, op);
  }
};

}  // namespace

int main(int argc, char** argv) {
  namespace kit = mixtrain::conformance;
  const std::vector<std::filesystem::path> plugins = {MIXTRAIN_PLUGIN_DIR};
  kit::set_plugin_search_path(plugins);
  // Bounded waits everywhere: a rank stuck on a failed peer ends its test instead of the run.
  const auto mpi = [&](const char* progress, double timeout_s) {
    return kit::communicator_from_plugin(
        plugins, "mpi", {{"progress", std::string(progress)}, {"timeout_s", timeout_s}});
  };
  for (const char* progress : {"thread", "test"})
    kit::add_communicator(
        std::string("mpi_") + progress, mpi(progress, 60.0),
        {.config_overrides = {}, .short_timeout = mpi(progress, 0.5), .short_timeout_s = 0.5});
  if (const char* faults = std::getenv("MIXTRAIN_CONFORMANCE_FAULTS");
      faults != nullptr && std::strcmp(faults, "1") == 0) {
    // A fault can leave one rank waiting in a collective the others never join (the host's
    // checks throw on one rank): a short timeout ends such a run in seconds, by MPI_Abort.
    const auto real = mpi("thread", 5.0);
    kit::add_communicator("faulty_avg_is_sum",
                          [real] { return std::make_shared<AvgIsSum>(real()); });
    kit::add_communicator("faulty_wrong_piece",
                          [real] { return std::make_shared<WrongPiece>(real()); });
    kit::add_communicator("faulty_gathers_fp32_only",
                          [real] { return std::make_shared<GathersFp32Only>(real()); });
    kit::add_communicator("faulty_host_broadcast_keeps_size",
                          [real] { return std::make_shared<HostBroadcastKeepsSize>(real()); });
    kit::add_communicator("faulty_skips_big_buckets",
                          [real] { return std::make_shared<SkipsBigBuckets>(real()); });
    kit::add_communicator("faulty_unknown_name",
                          kit::communicator_from_plugin(plugins, "no_such_communicator"));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
