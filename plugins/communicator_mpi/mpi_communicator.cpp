#include "mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include "mixtrain/sdk/error.h"

namespace mixtrain::communicators {

namespace {

using Clock = std::chrono::steady_clock;

std::string elements(const sdk::TensorView& v) {
  return std::to_string(v.numel()) + " " + std::string(sdk::dtype_name(v.dtype)) + " elements";
}

int count_of(std::int64_t n, const char* what) {
  if (n > INT_MAX)
    throw sdk::BackendError(std::string(what) + " of " + std::to_string(n) +
                                " elements: MPI counts are int, at most " + std::to_string(INT_MAX),
                            "lower [distributed] bucket_mb");
  return static_cast<int>(n);
}

// A root outside the world is the caller's mistake, refused on every rank before any transfer:
// MPI's own check would report it as a failed collective (CommunicationError), which ends a run.
void require_root(int root, int world, const char* what) {
  if (root < 0 || root >= world)
    throw sdk::BackendError(std::string("mpi.") + what + ": root " + std::to_string(root) +
                                " is not a rank of this run (ranks 0.." +
                                std::to_string(world - 1) + ")",
                            "broadcast from a rank in [0, world_size())");
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// A handle's deadline: timeout_s after its first wait, which a later wait keeps (the collective
// may still complete, but the run waits no longer in all).
class FirstWaitDeadline {
 public:
  explicit FirstWaitDeadline(double timeout_s) : timeout_s_(timeout_s) {}
  Clock::time_point get() {
    if (!at_) at_ = deadline_after(timeout_s_);
    return *at_;
  }

 private:
  double timeout_s_;
  std::optional<Clock::time_point> at_;
};

std::string timed_out_message(int rank, const std::string& what, double timeout_s) {
  return "rank " + std::to_string(rank) + ": " + what + " did not complete within " +
         seconds_text(timeout_s) +
         " s (distributed.mpi.timeout_s): a rank may have died or stopped calling collectives";
}

constexpr const char* kTimedOutHint =
    "look for an earlier error on another rank; raise timeout_s if a step, an evaluation or "
    "rank 0's checkpoint write (the other ranks wait for it at their next collective) "
    "legitimately takes longer";

// Ends every rank when a handle is destroyed while its collective still runs past its deadline.
// MPI cannot cancel a collective, and it still writes the caller's buffers (on the communication
// thread, or inside any later MPI call under "test"), so neither returning nor waiting on is
// safe. The edge would print the timeout and MPI_Abort next anyway: this does the same from here.
[[noreturn]] void end_every_rank(int rank, const std::string& what, double timeout_s) {
  std::fflush(stdout);
  std::fprintf(stderr,
               "\nerror: %s; it is still running when its buffers are released, so every rank "
               "ends now (MPI_Abort)\n  HINT: %s\n",
               timed_out_message(rank, what, timeout_s).c_str(), kTimedOutHint);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; if it did, end this rank anyway
}

// avg's completion: the sum MPI left in `data` (fp32 host memory; empty: nothing to do) × scale.
void scale_in_place(sdk::TensorView data, float scale) {
  float* p = data.as<float>();
  for (std::int64_t i = 0, n = data.empty() ? 0 : data.numel(); i < n; ++i) p[i] *= scale;
}

MPI_Op mpi_op(sdk::ReduceOp op) {
  return op == sdk::ReduceOp::max ? MPI_MAX : MPI_SUM;  // avg: a sum, scaled on completion
}

void require_fp32(const sdk::TensorView& v, const char* op) {
  if (v.dtype != sdk::DType::fp32)
    throw sdk::BackendError(std::string("the mpi communicator's ") + op + " reduces fp32, not " +
                                std::string(sdk::dtype_name(v.dtype)),
                            "reduce gradients in fp32 (the host always does)");
}

}  // namespace

// An MPI request and what completing it still needs (avg's division).
class MpiCommunicator::Handle final : public sdk::CommunicationHandle {
 public:
  Handle(MpiCommunicator& owner, std::string what, sdk::TensorView scale_on_completion = {},
         float scale = 1.0f)
      : owner_(owner),
        what_(std::move(what)),
        scaled_(scale_on_completion),
        scale_(scale),
        request_(std::make_shared<MPI_Request>(MPI_REQUEST_NULL)),
        deadline_(owner.timeout_s()) {}
  // Waits what is left of the deadline (counted from the first wait), then ends every rank: see
  // end_every_rank.
  ~Handle() override {
    if (done_) return;
    try {
      if (!owner_.complete_by(*request_, what_, deadline_.get()))
        end_every_rank(owner_.rank(), what_, owner_.timeout_s());
      finish();
    } catch (...) {  // an MPI error: the request is dead, and the run is failing already
    }
  }
  MPI_Request* request() { return request_.get(); }
  std::weak_ptr<MPI_Request> watch() const { return request_; }

  bool test() override {
    if (done_) return true;
    if (owner_.test_request(*request_, what_)) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    owner_.wait_for(*request_, what_, deadline_.get());
    finish();
  }

 private:
  void finish() {
    done_ = true;
    scale_in_place(scaled_, scale_);
  }
  MpiCommunicator& owner_;
  std::string what_;
  sdk::TensorView scaled_;
  float scale_;
  std::shared_ptr<MPI_Request> request_;
  FirstWaitDeadline deadline_;
  bool done_ = false;
};

// progress = "thread": one collective for the communication thread, and what its handle waits on.
struct MpiCommunicator::Job {
  std::string what;
  std::function<int(MPI_Comm)> run;  // returns MPI's code
  sdk::TensorView scaled;            // avg: multiplied by 1/world once complete
  float scale = 1.0f;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
};

class MpiCommunicator::ThreadHandle final : public sdk::CommunicationHandle {
 public:
  ThreadHandle(std::shared_ptr<Job> job, double timeout_s, int rank)
      : job_(std::move(job)), timeout_s_(timeout_s), rank_(rank), deadline_(timeout_s) {}
  // The thread still writes the caller's buffers: wait for it until the deadline (counted from
  // the first wait), then end every rank (end_every_rank) rather than wait forever on a peer
  // that stalled.
  ~ThreadHandle() override {
    std::unique_lock lock(job_->mutex);
    if (job_->finished.wait_until(lock, deadline_.get(), [&] { return job_->done; })) return;
    end_every_rank(rank_, job_->what, timeout_s_);
  }
  bool test() override {
    std::lock_guard lock(job_->mutex);
    if (job_->done && job_->error) std::rethrow_exception(job_->error);
    return job_->done;
  }
  void wait() override {
    std::unique_lock lock(job_->mutex);
    if (!job_->finished.wait_until(lock, deadline_.get(), [&] { return job_->done; }))
      throw sdk::CommunicationError(timed_out_message(rank_, job_->what, timeout_s_),
                                    kTimedOutHint);
    if (job_->error) std::rethrow_exception(job_->error);
  }

 private:
  std::shared_ptr<Job> job_;
  double timeout_s_;
  int rank_;
  FirstWaitDeadline deadline_;
};

sdk::OptionSchema MpiCommunicator::option_schema() {
  return {sdk::OptionSpec::number("timeout_s", 300.0,
                                  "seconds a collective, or MPI's start-up, may wait for the other "
                                  "ranks before the run ends with an error naming it; it must "
                                  "cover rank 0's longest checkpoint write")
              .greater_than(0.0),
          sdk::OptionSpec::string("progress", "thread",
                                  "how collectives overlap backward: \"thread\", MPI's "
                                  "blocking ones on a communication thread, or \"test\", MPI's "
                                  "non-blocking ones tested between the host's ops")
              .one_of({"test", "thread"})};
}

namespace {

// Ends the process when the start-up call it watches has not returned after `timeout_s`: MPI's
// start-up waits for every rank inside MPI_Init_thread / MPI_Comm_dup, which nothing can
// interrupt, and a rank that exited before starting MPI never arrives. Rank from the launcher's
// environment (MPI cannot be asked yet).
class StartupWatchdog {
 public:
  StartupWatchdog(const char* call, double timeout_s) : call_(call), timeout_s_(timeout_s) {
    thread_ = std::thread([this] { watch(); });
  }
  ~StartupWatchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  StartupWatchdog(const StartupWatchdog&) = delete;
  StartupWatchdog& operator=(const StartupWatchdog&) = delete;

 private:
  void watch() {
    std::unique_lock lock(mutex_);
    if (done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return done_; }))
      return;
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr) rank = std::getenv("PMI_RANK");
    std::fprintf(stderr,
                 "\nerror: rank %s: MPI start-up (%s) waited %s s (distributed.mpi.timeout_s) for "
                 "the other ranks: one of them exited or never started MPI\n  HINT: look for an "
                 "earlier error or an early exit of another rank; raise distributed.mpi.timeout_s "
                 "if start-up is legitimately slow\n",
                 rank != nullptr ? rank : "?", call_, seconds_text(timeout_s_).c_str());
    std::fflush(stderr);
    std::_Exit(1);  // MPI is mid-call: no destructor, no MPI_Finalize can run safely now
  }

  const char* call_;
  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

MpiCommunicator::MpiCommunicator(const sdk::Options& options, const sdk::PluginContext& context)
    : log_(context.logger),
      timeout_s_(options.get_double("timeout_s")),
      comm_thread_(options.get_string("progress") == "thread") {
  const int wanted = comm_thread_ ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
  int initialised = 0, provided = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int code = MPI_SUCCESS;
    {
      const StartupWatchdog watchdog("MPI_Init_thread", timeout_s_);
      code = MPI_Init_thread(nullptr, nullptr, wanted, &provided);
    }
    if (code != MPI_SUCCESS)
      throw sdk::CommunicationError("MPI_Init_thread failed",
                                    "launch with mpirun; check the Open MPI installation");
    owns_mpi_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < wanted)
    throw sdk::CommunicationError(
        "progress = \"thread\" needs MPI_THREAD_MULTIPLE, which this MPI does not provide",
        "use progress = \"test\", or an MPI built with thread support");
  {
    const StartupWatchdog watchdog("MPI_Comm_dup", timeout_s_);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    if (comm_thread_)
      // The thread's collectives and the host thread's must never interleave on one
      // communicator: MPI matches collectives by order per communicator.
      MPI_Comm_dup(MPI_COMM_WORLD, &thread_comm_);
  }
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (comm_thread_) MPI_Comm_set_errhandler(thread_comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &world_);
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  library_.assign(version, static_cast<std::size_t>(std::max(length, 0)));
  library_ = library_.substr(0, library_.find_first_of(",\n"));
}

MpiCommunicator::~MpiCommunicator() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    thread_.join();
  }
  if (thread_comm_ != MPI_COMM_NULL) MPI_Comm_free(&thread_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (owns_mpi_ && !finalised) MPI_Finalize();
}

std::string MpiCommunicator::description() const {
  return library_ + ", " + std::to_string(world_) + " rank" + (world_ == 1 ? "" : "s");
}

void MpiCommunicator::bind(sdk::DeviceBackend& backend) {
  const auto kind = backend.capabilities().kind;
  if (kind != "cpu")
    throw sdk::BackendError("the mpi communicator moves host memory, and backend '" + kind +
                                "' keeps its tensors "
                                "elsewhere",
                            "for CUDA tensors use [distributed] type = \"nccl\"");
  bound_ = true;
  if (comm_thread_ && !thread_.joinable()) thread_ = std::thread([this] { thread_loop(); });
}

void MpiCommunicator::thread_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      job = jobs_.front();
      jobs_.pop_front();
    }
    std::exception_ptr error;
    try {
      check(job->run(thread_comm_), job->what);
      scale_in_place(job->scaled, job->scale);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(job->mutex);
      job->done = true;
      job->error = error;
    }
    job->finished.notify_all();
  }
}

sdk::CommunicationHandlePtr MpiCommunicator::enqueue(std::string what,
                                                     std::function<int(MPI_Comm)> run,
                                                     sdk::TensorView scale_on_completion) {
  auto job = std::make_shared<Job>();
  job->what = std::move(what);
  job->run = std::move(run);
  job->scaled = scale_on_completion;
  job->scale = 1.0f / static_cast<float>(world_);
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(job);
  }
  queued_.notify_one();
  return std::make_unique<ThreadHandle>(std::move(job), timeout_s_, rank_);
}

bool MpiCommunicator::test_request(MPI_Request& request, const std::string& what) {
  int flag = 0;
  check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), what);
  return flag != 0;
}

void MpiCommunicator::require_bound(const char* op) const {
  if (!bound_) throw std::logic_error(std::string("MpiCommunicator::") + op + " before bind()");
}

void MpiCommunicator::check(int code, const std::string& what) const {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw sdk::CommunicationError("rank " + std::to_string(rank_) + ": " + what + " failed: " +
                                    std::string(text, static_cast<std::size_t>(length)),
                                "another rank may have failed; its own error says why");
}

void MpiCommunicator::wait_for(MPI_Request& request, const std::string& what) {
  wait_for(request, what, deadline_after(timeout_s_));
}

void MpiCommunicator::wait_for(MPI_Request& request, const std::string& what,
                               std::chrono::steady_clock::time_point deadline) {
  if (!complete_by(request, what, deadline))
    throw sdk::CommunicationError(timed_out_message(rank_, what, timeout_s_), kTimedOutHint);
}

bool MpiCommunicator::complete_by(MPI_Request& request, const std::string& what,
                                  std::chrono::steady_clock::time_point deadline) {
  for (int spins = 0;; ++spins) {
    if (test_request(request, what)) return true;
    if (Clock::now() > deadline) return false;
    // Spin first (the answer is usually microseconds away), then give the core back: with more
    // ranks than cores, a busy wait would starve the rank being waited for.
    if (spins > 1000) std::this_thread::yield();
  }
}

sdk::CommunicationHandlePtr MpiCommunicator::start_all_reduce(sdk::TensorView data,
                                                              sdk::ReduceOp op) {
  require_bound("start_all_reduce");
  require_fp32(data, "all_reduce");
  const std::string what =
      std::string("all_reduce (") + sdk::reduce_op_name(op) + ") of " + elements(data);
  const int count = count_of(data.numel(), "all_reduce");
  if (comm_thread_)
    return enqueue(
        what,
        [=](MPI_Comm c) {
          return MPI_Allreduce(MPI_IN_PLACE, data.data, count, MPI_FLOAT, mpi_op(op), c);
        },
        op == sdk::ReduceOp::avg ? data : sdk::TensorView{});
  auto h =
      std::make_unique<Handle>(*this, what, op == sdk::ReduceOp::avg ? data : sdk::TensorView{},
                               1.0f / static_cast<float>(world_));
  check(MPI_Iallreduce(MPI_IN_PLACE, data.data, count, MPI_FLOAT, mpi_op(op), comm_, h->request()),
        what);
  in_flight_.push_back(h->watch());
  return h;
}

sdk::CommunicationHandlePtr MpiCommunicator::start_reduce_scatter(sdk::TensorView send,
                                                                  sdk::TensorView recv,
                                                                  sdk::ReduceOp op) {
  require_bound("start_reduce_scatter");
  require_fp32(send, "reduce_scatter");
  require_fp32(recv, "reduce_scatter");
  if (send.numel() != recv.numel() * world_)
    throw sdk::BackendError("reduce_scatter: send holds " + std::to_string(send.numel()) +
                                " elements, not recv's " + std::to_string(recv.numel()) + " × " +
                                std::to_string(world_) + " ranks",
                            "size send as world_size() pieces of recv.numel()");
  const std::string what =
      std::string("reduce_scatter (") + sdk::reduce_op_name(op) + ") of " + elements(send);
  const int count = count_of(recv.numel(), "reduce_scatter");
  if (comm_thread_)
    return enqueue(
        what,
        [=](MPI_Comm c) {
          return MPI_Reduce_scatter_block(send.data, recv.data, count, MPI_FLOAT, mpi_op(op), c);
        },
        op == sdk::ReduceOp::avg ? recv : sdk::TensorView{});
  auto h =
      std::make_unique<Handle>(*this, what, op == sdk::ReduceOp::avg ? recv : sdk::TensorView{},
                               1.0f / static_cast<float>(world_));
  check(MPI_Ireduce_scatter_block(send.data, recv.data, count, MPI_FLOAT, mpi_op(op), comm_,
                                  h->request()),
        what);
  in_flight_.push_back(h->watch());
  return h;
}

sdk::CommunicationHandlePtr MpiCommunicator::start_all_gather(sdk::TensorView send,
                                                              sdk::TensorView recv) {
  require_bound("start_all_gather");
  if (send.dtype != recv.dtype || recv.numel() != send.numel() * world_)
    throw sdk::BackendError("all_gather: recv holds " + elements(recv) + ", not send's " +
                                elements(send) + " × " + std::to_string(world_) + " ranks",
                            "size recv as world_size() pieces of send, in send's dtype");
  const std::string what = "all_gather of " + elements(recv);
  const int bytes = count_of(static_cast<std::int64_t>(send.bytes()), "all_gather");
  if (comm_thread_)
    return enqueue(what, [=](MPI_Comm c) {
      return MPI_Allgather(send.data, bytes, MPI_BYTE, recv.data, bytes, MPI_BYTE, c);
    });
  auto h = std::make_unique<Handle>(*this, what);
  check(MPI_Iallgather(send.data, bytes, MPI_BYTE, recv.data, bytes, MPI_BYTE, comm_, h->request()),
        what);
  in_flight_.push_back(h->watch());
  return h;
}

void MpiCommunicator::broadcast(sdk::TensorView data, int root) {
  require_bound("broadcast");
  require_root(root, world_, "broadcast");
  const std::string what = "broadcast from rank " + std::to_string(root) + " of " + elements(data);
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibcast(data.data, count_of(static_cast<std::int64_t>(data.bytes()), "broadcast"),
                   MPI_BYTE, root, comm_, &request),
        what);
  wait_for(request, what);
}

void MpiCommunicator::progress() {
  if (comm_thread_) return;
  int flag = 0;
  for (auto& w : in_flight_)
    if (auto r = w.lock(); r && *r != MPI_REQUEST_NULL)
      check(MPI_Test(r.get(), &flag, MPI_STATUS_IGNORE), "progress");
  std::erase_if(in_flight_, [](const std::weak_ptr<MPI_Request>& w) {
    auto r = w.lock();
    return !r || *r == MPI_REQUEST_NULL;
  });
}

void MpiCommunicator::barrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm_, &request), "barrier");
  wait_for(request, "barrier");
}

void MpiCommunicator::all_reduce_host(std::span<double> values, sdk::ReduceOp op) {
  const std::string what = std::string("host all_reduce (") + sdk::reduce_op_name(op) + ") of " +
                           std::to_string(values.size()) + " values";
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, values.data(),
                       count_of(static_cast<std::int64_t>(values.size()), "all_reduce_host"),
                       MPI_DOUBLE, mpi_op(op), comm_, &request),
        what);
  wait_for(request, what);
  if (op == sdk::ReduceOp::avg)
    for (double& v : values) v /= static_cast<double>(world_);
}

void MpiCommunicator::broadcast_host(std::vector<std::byte>& bytes, int root) {
  require_root(root, world_, "broadcast_host");
  const std::string what = "host broadcast from rank " + std::to_string(root);
  long long size = static_cast<long long>(bytes.size());
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibcast(&size, 1, MPI_LONG_LONG, root, comm_, &request), what);
  wait_for(request, what);
  bytes.resize(static_cast<std::size_t>(size));
  check(MPI_Ibcast(bytes.data(), count_of(size, "broadcast_host"), MPI_BYTE, root, comm_, &request),
        what);
  wait_for(request, what);
}

void MpiCommunicator::abort(int exit_code) noexcept {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; if it did, end this rank anyway
}

}  // namespace mixtrain::communicators
