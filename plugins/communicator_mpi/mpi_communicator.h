// MpiCommunicator: sdk::Communicator on Open MPI, for tensors in host memory (the CPU backend).
//
// Contract (sdk/communicator.h, plus)
// - The constructor initialises MPI (MPI_THREAD_FUNNELED: only the trainer's thread calls MPI)
//   unless something else did, and works on a duplicate of MPI_COMM_WORLD whose errors return
//   codes (turned into sdk::CommunicationError) instead of aborting. The destructor finalises
//   MPI only if the constructor initialised it.
// - bind() accepts only a backend whose memory is the host's (capabilities().kind == "cpu");
//   anything else is sdk::BackendError pointing at the nccl communicator.
// - Reductions take fp32 (sum, avg, max); gathers and broadcasts move any dtype as bytes.
// - Progress (option `progress`): Open MPI runs no progress thread, so a non-blocking collective
//   advances only inside MPI calls.
//   - "thread" (the default): a communication thread of the plugin's own runs the tensor
//   collectives one after
//     another, in the order started, as MPI's blocking (tuned) collectives on a communicator of
//     their own (MPI_THREAD_MULTIPLE), while the host's thread goes on; host collectives and
//     broadcast stay on the host's thread and communicator.
//   - "test": tensor collectives are MPI's non-blocking ones (libnbc); progress() tests every
//     request in flight, and the host calls it between backward ops.
//   README.md has the measurement behind the default.
// - Every wait polls its request until `timeout_s` (option) has passed, then throws
//   sdk::CommunicationError naming the operation and its size. A handle's deadline counts from
//   its first wait; a later wait (the collective may still complete) keeps it.
// - Destroying a handle whose collective has not completed waits until that deadline, then ends
//   every rank (a line naming the collective, then MPI_Abort): MPI cannot cancel a collective
//   that still writes the caller's buffers, and a stalled peer must not hang this rank forever.
// - Start-up is bounded too: MPI_Init_thread and the communicator duplicates wait for every rank
//   and cannot be interrupted, so a watchdog ends the process after `timeout_s` with one line
//   naming this rank, the call and the option (exit 1; mpirun then ends the others). A rank that
//   exits before it starts MPI would otherwise keep the others waiting forever.
// - abort() is MPI_Abort on the world: mpirun then ends every rank.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::communicators {

class MpiCommunicator final : public sdk::Communicator {
 public:
  MpiCommunicator(const sdk::Options& options, const sdk::PluginContext& context);
  ~MpiCommunicator() override;
  static sdk::OptionSchema option_schema();

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string description() const override;
  void bind(sdk::DeviceBackend& backend) override;

  sdk::CommunicationHandlePtr start_all_reduce(sdk::TensorView data, sdk::ReduceOp op) override;
  sdk::CommunicationHandlePtr start_reduce_scatter(sdk::TensorView send, sdk::TensorView recv,
                                                   sdk::ReduceOp op) override;
  sdk::CommunicationHandlePtr start_all_gather(sdk::TensorView send, sdk::TensorView recv) override;
  void broadcast(sdk::TensorView data, int root) override;
  void progress() override;

  void barrier() override;
  void all_reduce_host(std::span<double> values, sdk::ReduceOp op) override;
  void broadcast_host(std::vector<std::byte>& bytes, int root) override;
  [[noreturn]] void abort(int exit_code) noexcept override;

  // Polls `request` until it completes or the timeout passes (then CommunicationError).
  void wait_for(MPI_Request& request, const std::string& what);
  // The same against a deadline a handle keeps from its first wait.
  void wait_for(MPI_Request& request, const std::string& what,
                std::chrono::steady_clock::time_point deadline);
  // Polls `request` until it completes (true) or `deadline` passes (false); MPI's errors throw.
  bool complete_by(MPI_Request& request, const std::string& what,
                   std::chrono::steady_clock::time_point deadline);
  double timeout_s() const { return timeout_s_; }
  // MPI's error text for `code`, as CommunicationError naming `what`, when code != MPI_SUCCESS.
  void check(int code, const std::string& what) const;

 private:
  class Handle;
  void require_bound(const char* op) const;

  sdk::Logger log_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1;
  bool owns_mpi_ = false;
  bool bound_ = false;
  double timeout_s_ = 300.0;
  std::string library_;
  // progress = "test": requests in flight (weak: a completed or destroyed handle drops out).
  std::vector<std::weak_ptr<MPI_Request>> in_flight_;
  bool test_request(MPI_Request& request, const std::string& what);

  // progress = "thread": the communication thread, its queue of collectives (run in order) and
  // the communicator they run on.
  class ThreadHandle;
  struct Job;
  bool comm_thread_ = false;
  MPI_Comm thread_comm_ = MPI_COMM_NULL;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
  void thread_loop();
  sdk::CommunicationHandlePtr enqueue(std::string what, std::function<int(MPI_Comm)> run,
                                      sdk::TensorView scale_on_completion = {});
};

}  // namespace mixtrain::communicators
