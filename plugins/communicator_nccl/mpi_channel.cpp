#include "mpi_channel.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "mixtrain/sdk/error.h"
#include "nccl_rules.h"

namespace mixtrain::communicator_nccl {
namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_text(int status) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(status);
  return std::string(text, static_cast<std::size_t>(length));
}

}  // namespace

MpiChannel::MpiChannel(double timeout_s, sdk::Logger logger)
    : timeout_s_(timeout_s), logger_(std::move(logger)) {
  try {
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised)
      throw sdk::BackendError("the nccl communicator needs MPI, and MPI was already finalised",
                              "create the communicator before anything finalises MPI");
    if (!initialised) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "setup",
            "MPI_Init_thread");
      initialised_here_ = true;
      if (provided < MPI_THREAD_SERIALIZED)
        logger_.warn("MPI provides thread level " + std::to_string(provided) +
                     " (< MPI_THREAD_SERIALIZED): keep every call on one thread");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // A duplicate: nothing else on MPI_COMM_WORLD can match our messages, and its errors come
    // back as codes instead of MPI's default abort of the whole job.
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request), "setup", "MPI_Comm_idup");
    wait(request, "setup (MPI_Comm_idup)");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);

    if (const auto env = parse_local_rank(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"))) {
      local_rank_ = *env;
    } else {
      MPI_Comm node = MPI_COMM_NULL;
      check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "setup",
            "MPI_Comm_split_type");
      MPI_Comm_rank(node, &local_rank_);
      MPI_Comm_free(&node);
    }
  } catch (...) {
    release();
    throw;
  }
}

MpiChannel::~MpiChannel() {
  release();
}

void MpiChannel::release() noexcept {
  int finalised = 1;
  MPI_Finalized(&finalised);
  if (finalised || failed_) return;
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  if (initialised_here_) MPI_Finalize();
}

void MpiChannel::set_hooks(PollHook poll, FailureHook on_failure) {
  poll_ = std::move(poll);
  on_failure_ = std::move(on_failure);
}

void MpiChannel::fail(const char* op, const std::string& why) {
  const std::string text = failure_message(op, rank_, size_, why);
  if (!failed_) {
    failed_ = true;
    if (on_failure_) on_failure_(text);
  }
  throw sdk::CommunicationError(text, failure_hint());
}

void MpiChannel::check(int status, const char* op, const char* call) {
  if (status == MPI_SUCCESS) return;
  fail(op, std::string(call) + " failed: " + mpi_error_text(status));
}

void MpiChannel::wait(MPI_Request& request, const char* op) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  int polls = 0;
  for (;;) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), op, "MPI_Test");
    if (done) return;
    if (poll_) poll_(op);
    if (Clock::now() > deadline)
      fail(op, "timed out after " + seconds_text(timeout_s_) + " s waiting for the other ranks");
    pause_poll(polls);
  }
}

void MpiChannel::barrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm_, &request), "barrier", "MPI_Ibarrier");
  wait(request, "barrier");
}

void MpiChannel::all_reduce(std::span<double> values, sdk::ReduceOp op) {
  if (values.size() > static_cast<std::size_t>(INT_MAX))
    throw sdk::BackendError("nccl.all_reduce_host: " + std::to_string(values.size()) +
                                " values; host collectives carry at most INT_MAX",
                            "reduce large data with the tensor collectives");
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE,
                       op == sdk::ReduceOp::max ? MPI_MAX : MPI_SUM, comm_, &request),
        "all_reduce_host", "MPI_Iallreduce");
  wait(request, "all_reduce_host");
  if (op == sdk::ReduceOp::avg)
    for (double& v : values) v /= static_cast<double>(size_);
}

void MpiChannel::broadcast(std::vector<std::byte>& bytes, int root) {
  if (root < 0 || root >= size_)
    throw sdk::BackendError("nccl.broadcast_host: root " + std::to_string(root) +
                                " is not a rank of this run (ranks 0.." +
                                std::to_string(size_ - 1) + ")",
                            "broadcast from a rank in [0, world_size())");
  std::uint64_t size = bytes.size();
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibcast(&size, 1, MPI_UINT64_T, root, comm_, &request), "broadcast_host", "MPI_Ibcast");
  wait(request, "broadcast_host");
  if (rank_ != root) bytes.resize(size);
  // MPI counts are int: large payloads (checkpoint metadata) go in chunks.
  constexpr std::uint64_t kChunk = std::uint64_t{1} << 30;
  for (std::uint64_t offset = 0; offset < size; offset += kChunk) {
    const auto n = static_cast<int>(std::min<std::uint64_t>(kChunk, size - offset));
    check(MPI_Ibcast(bytes.data() + offset, n, MPI_BYTE, root, comm_, &request), "broadcast_host",
          "MPI_Ibcast");
    wait(request, "broadcast_host");
  }
}

void MpiChannel::broadcast(void* data, int bytes, int root, const char* op) {
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibcast(data, bytes, MPI_BYTE, root, comm_, &request), op, "MPI_Ibcast");
  wait(request, op);
}

}  // namespace mixtrain::communicator_nccl
