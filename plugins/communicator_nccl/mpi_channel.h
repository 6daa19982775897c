// MpiChannel: the MPI half of the nccl communicator — MPI's lifetime, a duplicate of
// MPI_COMM_WORLD, and the host collectives. No CUDA or NCCL, so it is tested on CPUs with mpirun.
//
// Contract
// - Construction initialises MPI (MPI_THREAD_SERIALIZED) unless someone has, duplicates
//   MPI_COMM_WORLD (timed; MPI_ERRORS_RETURN, so errors come back as codes, not a job abort) and
//   finds the local rank (OMPI_COMM_WORLD_LOCAL_RANK, else MPI_Comm_split_type SHARED).
// - Every wait polls MPI_Test until done or timeout_s, calling the poll hook each time (the
//   communicator checks NCCL's async error there; it may throw). A failure or a timeout calls the
//   failure hook once with the message, then throws sdk::CommunicationError
//   "nccl.<op> on rank r of n: <why>".
// - Destruction frees the duplicate and finalises MPI if this channel initialised it, unless a
//   failure happened (mark_failed() or its own): both could wait on the peer that failed.
// - Threading: one host thread at a time.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/logging.h"

namespace mixtrain::communicator_nccl {

class MpiChannel {
 public:
  using PollHook = std::function<void(const char* op)>;
  using FailureHook = std::function<void(const std::string& message)>;

  MpiChannel(double timeout_s, sdk::Logger logger);
  ~MpiChannel();
  MpiChannel(const MpiChannel&) = delete;
  MpiChannel& operator=(const MpiChannel&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const noexcept { return local_rank_; }
  bool initialised_mpi() const noexcept { return initialised_here_; }
  void set_hooks(PollHook poll, FailureHook on_failure);

  void barrier();
  // In place; avg is the sum divided by size().
  void all_reduce(std::span<double> values, sdk::ReduceOp op);
  // Root's bytes on every rank (resized on the others); sent as a size, then ≤ 1 GiB chunks.
  void broadcast(std::vector<std::byte>& bytes, int root);
  // A fixed-size buffer (the ncclUniqueId) from root, named `op` in errors.
  void broadcast(void* data, int bytes, int root, const char* op);

  // The communicator failed elsewhere: the destructor must not free or finalise.
  void mark_failed() noexcept { failed_ = true; }
  [[noreturn]] void fail(const char* op, const std::string& why);

 private:
  void wait(MPI_Request& request, const char* op);
  void check(int status, const char* op, const char* call);
  void release() noexcept;

  double timeout_s_;
  sdk::Logger logger_;
  bool initialised_here_ = false;
  bool failed_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  PollHook poll_;
  FailureHook on_failure_;
};

}  // namespace mixtrain::communicator_nccl
