// NcclCommunicator: sdk::Communicator over NCCL for the tensor collectives and MPI for setup and
// the host collectives. One rank per GPU.
//
// Contract (in addition to sdk/communicator.h)
// - Construction sets up MPI (mpi_channel.h: initialised when nobody has, MPI_COMM_WORLD
//   duplicated, the local rank), picks device local_rank % device_count, and broadcasts rank 0's
//   ncclUniqueId. No visible device: sdk::BackendError. The host collectives are the channel's.
// - bind() needs the backend's NativeStreamFacet (the CUDA backend): anything else is
//   BackendError. It follows the backend's device when it differs from the local-rank choice
//   (the buffers live there), and creates the NCCL communicator (non-blocking init, timed).
// - Tensor collectives run on a stream of the communicator's own, ordered after the backend's
//   work so far by an event; handle.test() queries the op's done event; handle.wait() makes the
//   backend's stream wait on it and returns without blocking the host.
// - Every host wait is timed (timeout_s): setup, the host collectives over MPI, NCCL's
//   non-blocking calls. A collective still running after timeout_s, or an NCCL async error,
//   aborts the NCCL communicator (its kernels return, so a backend stream waiting on them drains)
//   and makes the next call throw sdk::CommunicationError naming the op; every later call throws
//   it again. A watchdog thread checks this every 100 ms, because the host may be blocked in the
//   backend (copy_to_host) behind a collective that a dead peer never finishes.
// - Threading: one host thread at a time (plus the watchdog, which shares only the NCCL
//   communicator and the in-flight list, under a mutex); each call makes the device current.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/logging.h"
#include "mpi_channel.h"

namespace mixtrain::communicator_nccl {

class NcclCommunicator final : public sdk::Communicator {
 public:
  NcclCommunicator(double timeout_s, sdk::Logger logger);
  ~NcclCommunicator() override;

  int rank() const override { return mpi_->rank(); }
  int world_size() const override { return mpi_->size(); }
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

  int device() const noexcept { return device_; }

  // One enqueued collective: its done event (on the communication stream) and when it started,
  // shared by its handle and the watchdog list.
  struct Pending {
    const char* op = "";
    cudaEvent_t done = nullptr;
    std::chrono::steady_clock::time_point started;
    bool complete = false;  // the event has fired
    bool ordered = false;   // the backend's stream waits on it
    ~Pending();
  };
  bool test(Pending& pending);
  void wait(Pending& pending);

 private:
  template <class Enqueue>
  sdk::CommunicationHandlePtr launch(const char* op, Enqueue&& enqueue);
  void activate() const;
  void require_bound(const char* op) const;
  void check_usable(const char* op) const;
  // Aborts the NCCL communicator (its kernels return), remembers why, throws CommunicationError.
  [[noreturn]] void fail(const char* op, const std::string& why);
  // The abort alone (once; the first reason is kept), for the watchdog, which cannot throw.
  void abort_with(const std::string& text, bool log);
  void check_cuda(cudaError_t status, const char* op, const char* call);
  // Raises NCCL's asynchronous error, if any; never blocks.
  void poll_async(const char* op);
  // Until NCCL's non-blocking call has finished (ncclInProgress → ncclSuccess), timed.
  void wait_nccl_ready(const char* op);
  // Marks completed ops; the first failed or overdue one as (its op, why).
  std::optional<std::pair<const char*, std::string>> scan_in_flight(const char* seen_by);
  // Drops completed ops; fails on one running longer than the timeout.
  void sweep(const char* op);
  void start_watchdog();
  void stop_watchdog() noexcept;
  void watch() noexcept;
  [[noreturn]] void timed_out(const char* op, const char* waiting_for);
  void release() noexcept;

  double timeout_s_;
  sdk::Logger logger_;
  std::unique_ptr<MpiChannel> mpi_;  // MPI's lifetime, setup and the host collectives
  int device_ = 0;
  std::string device_name_;
  int nccl_version_ = 0;
  ncclUniqueId id_{};
  ncclComm_t nccl_ = nullptr;
  bool aborted_ = false;
  std::string abort_reason_;
  cudaStream_t backend_stream_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // the backend's stream so far; reused, waits copy its state
  std::vector<std::shared_ptr<Pending>> in_flight_;

  // Guards nccl_, aborted_, abort_reason_ and in_flight_ between the host thread and the
  // watchdog (recursive: fail() runs inside locked calls and alone).
  mutable std::recursive_mutex mutex_;
  std::thread watchdog_;
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
};

}  // namespace mixtrain::communicator_nccl
