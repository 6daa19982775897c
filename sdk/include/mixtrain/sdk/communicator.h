// Communicator: collectives among the ranks of a data-parallel run (docs/architecture.md,
// "Data parallel").
//
// Contract
// - One communicator per process, created by the host from [distributed] type before anything
//   else talks to the other ranks; rank() is in [0, world_size()). The host calls bind() once,
//   with the backend whose memory the tensor collectives will see, before any of them.
// - Tensor collectives take TensorViews into that backend's memory (contiguous). Every rank calls
//   the same collectives in the same order with the same dtypes and sizes (the host guarantees
//   it; a mismatch is undefined, as in MPI and NCCL).
//   - all_reduce: in place on `data`, element-wise over the ranks.
//   - reduce_scatter: `send` holds world_size() equal pieces of recv.numel() elements; rank r
//     receives the reduction of every rank's piece r.
//   - all_gather: recv.numel() == send.numel() · world_size(); rank r's `send` lands in piece r.
//   - broadcast: root's `data` is copied into every rank's.
//   A plugin reduces at least fp32 (sum, avg, max); it moves any dtype it gathers or broadcasts.
//   Anything it cannot do is BackendError naming the dtype and what it supports, and so are
//   arguments that do not fit (sizes, a root outside the world), thrown before any transfer so
//   that the ranks still agree on what comes next. The component kit checks all of this
//   (mixtrain/conformance/communicator_conformance.h).
// - start_* returns at once with a handle; the operation's buffers stay owned by the caller and
//   untouched by the caller until wait() (or test() == true) returns. A device-stream plugin may
//   complete on its stream: wait() then orders the backend's later ops after it, and the host sees
//   the result once it reads the backend (copy_to_host, synchronize). progress() lets outstanding
//   operations advance where the library has no progress thread of its own; the host calls it
//   between ops during backward.
// - Host collectives carry small control values (found_inf, Σg², config hashes, checkpoint
//   metadata) in host memory and block.
// - Failure: a peer that fails or never joins ends wait() (and every blocking call) with
//   CommunicationError within the plugin's timeout, naming the operation and, where the library
//   says, the rank. No call blocks forever.
// - Threading: one host thread at a time; the object outlives the backend ops that use it.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/component.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class ReduceOp { sum, avg, max };
const char* reduce_op_name(ReduceOp op) noexcept;  // "sum", "avg", "max"

// A collective that a peer failed or timed out: the run cannot go on, on any rank.
class MIXTRAIN_SDK_API CommunicationError : public UserError {
 public:
  using UserError::UserError;
};

// An operation in flight. Destroying a handle that was never completed waits for it first
// (buffers must not be freed under a transfer) and swallows its error.
class MIXTRAIN_SDK_API CommunicationHandle {
 public:
  virtual ~CommunicationHandle();
  CommunicationHandle() = default;
  CommunicationHandle(const CommunicationHandle&) = delete;
  CommunicationHandle& operator=(const CommunicationHandle&) = delete;
  // True once complete (then wait() returns at once); advances the operation; never blocks.
  virtual bool test() = 0;
  // Blocks until complete, or throws CommunicationError (timeout, a failed peer).
  virtual void wait() = 0;
};
using CommunicationHandlePtr = std::unique_ptr<CommunicationHandle>;

class MIXTRAIN_SDK_API Communicator : public Component {
 public:
  ~Communicator() override;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // One line for logs: library, version, transport ("Open MPI 4.1.4, 2 ranks").
  virtual std::string description() const = 0;
  virtual void bind(DeviceBackend& backend) = 0;

  // --- tensor collectives (backend memory) ----------------------------------------------------
  virtual CommunicationHandlePtr start_all_reduce(TensorView data, ReduceOp op) = 0;
  virtual CommunicationHandlePtr start_reduce_scatter(TensorView send, TensorView recv,
                                                      ReduceOp op) = 0;
  virtual CommunicationHandlePtr start_all_gather(TensorView send, TensorView recv) = 0;
  virtual void broadcast(TensorView data, int root) = 0;
  virtual void progress() {}

  // --- host collectives (small, blocking) -----------------------------------------------------
  virtual void barrier() = 0;
  virtual void all_reduce_host(std::span<double> values, ReduceOp op) = 0;
  // Root's bytes on every rank (resized on the others).
  virtual void broadcast_host(std::vector<std::byte>& bytes, int root) = 0;

  // Ends this process at once with `exit_code`, so that the launcher ends the other ranks too
  // instead of leaving them blocked in a collective this rank will never join (MPI_Abort). The
  // default exits without finalising, which launchers such as mpirun treat the same way.
  [[noreturn]] virtual void abort(int exit_code) noexcept;

  // Blocking forms.
  void all_reduce(TensorView data, ReduceOp op) { start_all_reduce(data, op)->wait(); }
  void reduce_scatter(TensorView send, TensorView recv, ReduceOp op) {
    start_reduce_scatter(send, recv, op)->wait();
  }
  void all_gather(TensorView send, TensorView recv) { start_all_gather(send, recv)->wait(); }
};

}  // namespace mixtrain::sdk
