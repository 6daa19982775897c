#include "nccl_communicator.h"

#include <chrono>
#include <string>
#include <thread>

#include "mixtrain/sdk/backend_native_stream.h"
#include "mixtrain/sdk/error.h"
#include "nccl_rules.h"

namespace mixtrain::communicator_nccl {
namespace {

using Clock = std::chrono::steady_clock;
using Lock = std::lock_guard<std::recursive_mutex>;
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);

class NcclHandle final : public sdk::CommunicationHandle {
 public:
  NcclHandle(NcclCommunicator& owner, std::shared_ptr<NcclCommunicator::Pending> pending)
      : owner_(owner), pending_(std::move(pending)) {}
  ~NcclHandle() override {
    // Stream-ordered: the backend's later ops (and the allocator's reuse of these buffers, which
    // runs on that stream) come after the transfer.
    if (!pending_->ordered) {
      try {
        owner_.wait(*pending_);
      } catch (...) {  // NOLINT(bugprone-empty-catch): the contract swallows it here
      }
    }
  }
  bool test() override { return owner_.test(*pending_); }
  void wait() override { owner_.wait(*pending_); }

 private:
  NcclCommunicator& owner_;
  std::shared_ptr<NcclCommunicator::Pending> pending_;
};

}  // namespace

NcclCommunicator::Pending::~Pending() {
  // Safe while the event is pending: CUDA releases it once it completes.
  if (done != nullptr) cudaEventDestroy(done);
}

NcclCommunicator::NcclCommunicator(double timeout_s, sdk::Logger logger)
    : timeout_s_(timeout_s), logger_(std::move(logger)) {
  mpi_ = std::make_unique<MpiChannel>(timeout_s_, logger_);
  // A host collective's wait also watches NCCL; a failure there aborts NCCL as ours do.
  mpi_->set_hooks([this](const char* op) { poll_async(op); },
                  [this](const std::string& text) { abort_with(text, true); });
  try {
    int count = 0;
    std::string why;
    if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
      (void)cudaGetLastError();
      why = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
      count = 0;
    }
    device_ = choose_device(mpi_->local_rank(), count, why);
    activate();
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, device_) == cudaSuccess) device_name_ = props.name;
    ncclGetVersion(&nccl_version_);

    if (mpi_->rank() == 0) {
      if (const ncclResult_t r = ncclGetUniqueId(&id_); r != ncclSuccess)
        fail("setup", std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    }
    mpi_->broadcast(&id_, static_cast<int>(sizeof id_), 0, "setup (broadcast of the ncclUniqueId)");
    logger_.debug("rank " + std::to_string(mpi_->rank()) + " of " + std::to_string(mpi_->size()) +
                  ", local rank " + std::to_string(mpi_->local_rank()) + " on device " +
                  std::to_string(device_) + " (" + device_name_ + ")");
  } catch (...) {
    release();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  release();
}

void NcclCommunicator::release() noexcept {
  stop_watchdog();
  if (nccl_ != nullptr && !aborted_) {
    activate();
    // Let the enqueued collectives finish (timed: a dead peer would hold them forever), then
    // finalise; otherwise abort, which makes NCCL's kernels return.
    bool clean = false;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    int polls = 0;
    for (;;) {
      const cudaError_t s = comm_stream_ ? cudaStreamQuery(comm_stream_) : cudaSuccess;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(nccl_, &async);
      if (async != ncclSuccess && async != ncclInProgress) break;
      if (s == cudaSuccess) {
        clean = true;
        break;
      }
      if (s != cudaErrorNotReady || Clock::now() > deadline) break;
      pause_poll(polls);
    }
    const ncclResult_t finalize = clean ? ncclCommFinalize(nccl_) : ncclInternalError;
    if (finalize == ncclSuccess || finalize == ncclInProgress) {
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(nccl_, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() <= deadline)
        pause_poll(polls);
      clean = state == ncclSuccess;
    } else {
      clean = false;
    }
    if (clean)
      ncclCommDestroy(nccl_);
    else
      ncclCommAbort(nccl_);
    nccl_ = nullptr;
  }
  in_flight_.clear();
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
  ready_ = nullptr;
  comm_stream_ = nullptr;
  // After a failure, freeing MPI's communicator and finalising could wait on the peer that
  // failed: the process is ending with CommunicationError anyway, and no call may block forever.
  if (aborted_ && mpi_) mpi_->mark_failed();
  mpi_.reset();
}

std::string NcclCommunicator::description() const {
  return describe(nccl_version_, world_size(), device_, device_name_);
}

void NcclCommunicator::activate() const {
  cudaSetDevice(device_);
}

void NcclCommunicator::require_bound(const char* op) const {
  const Lock lock(mutex_);
  if (nccl_ == nullptr && !aborted_)
    throw sdk::BackendError(
        "nccl." + std::string(op) + ": the communicator is not bound to a backend",
        "call bind(backend) once, before any tensor collective");
}

void NcclCommunicator::check_usable(const char* op) const {
  const Lock lock(mutex_);
  if (aborted_)
    throw sdk::CommunicationError(
        "nccl." + std::string(op) +
            ": the communicator was aborted after a failure: " + abort_reason_,
        failure_hint());
}

void NcclCommunicator::abort_with(const std::string& text, bool log) {
  const Lock lock(mutex_);
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = text;
  if (nccl_ != nullptr) {
    ncclCommAbort(nccl_);  // NCCL's kernels return; a stream waiting on them drains
    nccl_ = nullptr;
  }
  if (log) logger_.error(text + "; the NCCL communicator is aborted");
}

void NcclCommunicator::fail(const char* op, const std::string& why) {
  const std::string text = failure_message(op, rank(), world_size(), why);
  abort_with(text, true);
  throw sdk::CommunicationError(text, failure_hint());
}

void NcclCommunicator::check_cuda(cudaError_t status, const char* op, const char* call) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  fail(op, std::string(call) + " failed: " + cudaGetErrorName(status) + ": " +
               cudaGetErrorString(status));
}

void NcclCommunicator::poll_async(const char* op) {
  const Lock lock(mutex_);
  if (nccl_ == nullptr) return;
  ncclResult_t async = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(nccl_, &async);
  if (r != ncclSuccess) async = r;
  if (async == ncclSuccess || async == ncclInProgress) return;
  const char* last = ncclGetLastError(nccl_);
  fail(op, std::string("NCCL reports ") + ncclGetErrorString(async) +
               (last != nullptr && *last != '\0' ? std::string(": ") + last : std::string()));
}

void NcclCommunicator::timed_out(const char* op, const char* waiting_for) {
  fail(op, "timed out after " + seconds_text(timeout_s_) + " s waiting for " + waiting_for);
}

void NcclCommunicator::wait_nccl_ready(const char* op) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  int polls = 0;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(nccl_, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) poll_async(op);  // throws with NCCL's text
    if (Clock::now() > deadline) timed_out(op, "the other ranks (NCCL)");
    pause_poll(polls);
  }
}

std::optional<std::pair<const char*, std::string>> NcclCommunicator::scan_in_flight(
    const char* seen_by) {
  const Lock lock(mutex_);
  const auto now = Clock::now();
  for (const auto& p : in_flight_) {
    if (p->complete) continue;
    const cudaError_t s = cudaEventQuery(p->done);
    if (s == cudaSuccess) {
      p->complete = true;
    } else if (s != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return std::pair{p->op, std::string("cudaEventQuery failed: ") + cudaGetErrorName(s) + ": " +
                                  cudaGetErrorString(s)};
    } else if (now - p->started > std::chrono::duration<double>(timeout_s_)) {
      return std::pair{p->op, "timed out after " + seconds_text(timeout_s_) +
                                  " s waiting for its NCCL kernel (seen by " + seen_by + ")"};
    }
  }
  return std::nullopt;
}

void NcclCommunicator::sweep(const char* op) {
  const Lock lock(mutex_);
  if (const auto failed = scan_in_flight(op)) fail(failed->first, failed->second);
  std::erase_if(in_flight_, [](const std::shared_ptr<Pending>& p) { return p->complete; });
}

void NcclCommunicator::start_watchdog() {
  stop_ = false;
  watchdog_ = std::thread([this] { watch(); });
}

void NcclCommunicator::stop_watchdog() noexcept {
  if (!watchdog_.joinable()) return;
  {
    const std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  watchdog_.join();
}

void NcclCommunicator::watch() noexcept {
  cudaSetDevice(device_);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(stop_mutex_);
      if (stop_cv_.wait_for(lock, kWatchdogPeriod, [this] { return stop_; })) return;
    }
    try {
      const Lock lock(mutex_);
      if (aborted_ || nccl_ == nullptr) return;
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(nccl_, &async) != ncclSuccess) continue;
      const char* oldest = "watchdog";  // the op an async error is blamed on: the oldest running
      for (const auto& p : in_flight_)
        if (!p->complete) {
          oldest = p->op;
          break;
        }
      if (async != ncclSuccess && async != ncclInProgress) {
        const char* last = ncclGetLastError(nccl_);
        // Not logged here: the host's sink is the host thread's; the next call throws it.
        abort_with(failure_message(oldest, rank(), world_size(),
                                   std::string("NCCL reports ") + ncclGetErrorString(async) +
                                       (last != nullptr && *last != '\0' ? std::string(": ") + last
                                                                         : std::string())),
                   false);
        return;
      }
      if (const auto failed = scan_in_flight("the watchdog")) {
        abort_with(failure_message(failed->first, rank(), world_size(), failed->second), false);
        return;
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): a failed string allocation; try next tick
    }
  }
}

void NcclCommunicator::bind(sdk::DeviceBackend& backend) {
  const Lock lock(mutex_);
  check_usable("bind");
  auto* facet = sdk::facet<sdk::NativeStreamFacet>(backend);
  if (facet == nullptr)
    throw sdk::BackendError("the nccl communicator needs the CUDA backend; backend '" +
                                backend.capabilities().kind +
                                "' offers no native_stream facet (no CUDA stream to order "
                                "collectives against)",
                            "set [backend] type = \"cuda\", or [distributed] type = \"mpi\" for "
                            "a CPU backend");
  auto* stream = static_cast<cudaStream_t>(facet->native_stream());
  if (nccl_ != nullptr) {
    if (stream == backend_stream_) return;
    throw sdk::BackendError("nccl.bind: the communicator is already bound to another backend",
                            "bind one backend, once");
  }
  int stream_device = device_;
  if (cudaStreamGetDevice(stream, &stream_device) == cudaSuccess && stream_device != device_) {
    logger_.warn("local rank " + std::to_string(mpi_->local_rank()) + " would use device " +
                 std::to_string(device_) + " but the CUDA backend runs on device " +
                 std::to_string(stream_device) +
                 ": NCCL follows the backend (two ranks on one GPU fail in NCCL's setup)");
    device_ = stream_device;
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, device_) == cudaSuccess) device_name_ = props.name;
  }
  (void)cudaGetLastError();
  backend_stream_ = stream;
  activate();
  // Highest priority: during backward, the reductions' kernels are scheduled ahead of the
  // compute kernels already queued, so communication overlaps instead of trailing.
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "bind",
             "cudaDeviceGetStreamPriorityRange");
  check_cuda(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest), "bind",
             "cudaStreamCreateWithPriority");
  check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "bind",
             "cudaEventCreateWithFlags");
  // Non-blocking init: ncclCommInitRank waits for every rank, and a rank that never comes must
  // end in a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&nccl_, world_size(), id_, rank(), &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string text = ncclGetErrorString(r);
    if (nccl_ != nullptr) {
      const char* last = ncclGetLastError(nccl_);
      fail("bind (ncclCommInitRank)", text + (last && *last ? std::string(": ") + last : ""));
    }
    fail("bind (ncclCommInitRank)", text);
  }
  wait_nccl_ready("bind (ncclCommInitRank)");
  start_watchdog();
  logger_.info(description());
}

template <class Enqueue>
sdk::CommunicationHandlePtr NcclCommunicator::launch(const char* op, Enqueue&& enqueue) {
  const Lock lock(mutex_);
  check_usable(op);  // the watchdog may have aborted since the caller's check
  activate();
  sweep(op);
  check_cuda(cudaEventRecord(ready_, backend_stream_), op, "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(comm_stream_, ready_, 0), op, "cudaStreamWaitEvent");
  const ncclResult_t r = enqueue();
  if (r == ncclInProgress) {
    wait_nccl_ready(op);  // enqueued only once NCCL says so: the done event must follow it
  } else if (r != ncclSuccess) {
    poll_async(op);
    fail(op, std::string("NCCL refused it: ") + ncclGetErrorString(r));
  }
  auto pending = std::make_shared<Pending>();
  pending->op = op;
  pending->started = Clock::now();
  check_cuda(cudaEventCreateWithFlags(&pending->done, cudaEventDisableTiming), op,
             "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(pending->done, comm_stream_), op, "cudaEventRecord");
  in_flight_.push_back(pending);
  return std::make_unique<NcclHandle>(*this, std::move(pending));
}

bool NcclCommunicator::test(Pending& pending) {
  const Lock lock(mutex_);
  if (pending.complete) return true;
  check_usable(pending.op);
  activate();
  const cudaError_t s = cudaEventQuery(pending.done);
  if (s == cudaSuccess) {
    pending.complete = true;
    return true;
  }
  if (s != cudaErrorNotReady) check_cuda(s, pending.op, "cudaEventQuery");
  poll_async(pending.op);
  if (Clock::now() - pending.started > std::chrono::duration<double>(timeout_s_))
    timed_out(pending.op, "its NCCL kernel");
  return false;
}

void NcclCommunicator::wait(Pending& pending) {
  const Lock lock(mutex_);
  if (pending.ordered) return;
  check_usable(pending.op);
  activate();
  poll_async(pending.op);
  // No host block: the backend's later work waits on the device. A collective that never ends
  // is caught by the watchdog (and progress()/test()), whose abort ends NCCL's kernels and so
  // releases the waiting stream.
  if (!pending.complete)
    check_cuda(cudaStreamWaitEvent(backend_stream_, pending.done, 0), pending.op,
               "cudaStreamWaitEvent");
  pending.ordered = true;
}

sdk::CommunicationHandlePtr NcclCommunicator::start_all_reduce(sdk::TensorView data,
                                                               sdk::ReduceOp op) {
  constexpr const char* name = "all_reduce";
  require_bound(name);
  check_usable(name);
  const std::size_t count = check_all_reduce(data);
  const ncclDataType_t type = reduce_type(data.dtype, name);
  return launch(name, [&] {
    return ncclAllReduce(data.data, data.data, count, type, nccl_op(op), nccl_, comm_stream_);
  });
}

sdk::CommunicationHandlePtr NcclCommunicator::start_reduce_scatter(sdk::TensorView send,
                                                                   sdk::TensorView recv,
                                                                   sdk::ReduceOp op) {
  constexpr const char* name = "reduce_scatter";
  require_bound(name);
  check_usable(name);
  const std::size_t count = check_reduce_scatter(send, recv, world_size());
  const ncclDataType_t type = reduce_type(recv.dtype, name);
  return launch(name, [&] {
    return ncclReduceScatter(send.data, recv.data, count, type, nccl_op(op), nccl_, comm_stream_);
  });
}

sdk::CommunicationHandlePtr NcclCommunicator::start_all_gather(sdk::TensorView send,
                                                               sdk::TensorView recv) {
  constexpr const char* name = "all_gather";
  require_bound(name);
  check_usable(name);
  const std::size_t count = check_all_gather(send, recv, world_size());
  return launch(name, [&] {
    return ncclAllGather(send.data, recv.data, count, move_type(send.dtype), nccl_, comm_stream_);
  });
}

void NcclCommunicator::broadcast(sdk::TensorView data, int root) {
  constexpr const char* name = "broadcast";
  require_bound(name);
  check_usable(name);
  const std::size_t count = check_broadcast(data, root, world_size());
  launch(name, [&] {
    return ncclBroadcast(data.data, data.data, count, move_type(data.dtype), root, nccl_,
                         comm_stream_);
  })->wait();
}

void NcclCommunicator::progress() {
  const Lock lock(mutex_);
  check_usable("progress");
  if (nccl_ == nullptr) return;
  activate();
  poll_async("progress");
  sweep("progress");
}

void NcclCommunicator::barrier() {
  check_usable("barrier");
  mpi_->barrier();
}

void NcclCommunicator::all_reduce_host(std::span<double> values, sdk::ReduceOp op) {
  check_usable("all_reduce_host");
  mpi_->all_reduce(values, op);
}

void NcclCommunicator::broadcast_host(std::vector<std::byte>& bytes, int root) {
  check_usable("broadcast_host");
  mpi_->broadcast(bytes, root);
}

}  // namespace mixtrain::communicator_nccl
