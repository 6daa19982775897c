// The NCCL communicator's decisions that need no GPU, no NCCL call and no MPI: which
// ncclDataType_t and ncclRedOp_t a collective runs with, the size checks of sdk/communicator.h,
// the device a rank picks, and the text of description(). Only nccl.h's enums are used, so a
// host-only test checks them bit for bit.
//
// Contract
// - reduce_type: fp32 (and tf32, stored as fp32), bf16, fp16 → ncclFloat32, ncclBfloat16,
//   ncclFloat16; any other dtype is BackendError naming `op`, the dtype and what is supported.
// - move_type: every dtype, element for element (fp8 as ncclUint8, int32 as ncclInt32): gathers
//   and broadcasts never convert.
// - check_*: BackendError naming the op, the tensors' dtypes and element counts, when they break
//   the contract's rules; they return the element count NCCL is called with.
// - choose_device: local_rank % device_count; BackendError when no device is visible.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <optional>
#include <string>

#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::communicator_nccl {

ncclDataType_t reduce_type(sdk::DType dtype, const char* op);
ncclDataType_t move_type(sdk::DType dtype) noexcept;
ncclRedOp_t nccl_op(sdk::ReduceOp op) noexcept;

// Each returns the count NCCL is given: numel of `data` / of recv (reduce_scatter: the piece) /
// of send (all_gather: what each rank contributes).
std::size_t check_all_reduce(const sdk::TensorView& data);
std::size_t check_reduce_scatter(const sdk::TensorView& send, const sdk::TensorView& recv,
                                 int world_size);
std::size_t check_all_gather(const sdk::TensorView& send, const sdk::TensorView& recv,
                             int world_size);
std::size_t check_broadcast(const sdk::TensorView& data, int root, int world_size);

// OMPI_COMM_WORLD_LOCAL_RANK's value as a rank, or nullopt when unset or not a number >= 0.
std::optional<int> parse_local_rank(const char* value) noexcept;
// local_rank % device_count. `why` is CUDA's text for a failed count, shown in the message.
int choose_device(int local_rank, int device_count, const std::string& why = {});

// ncclGetVersion's code as "2.28.9" (codes >= 20900: major·10000 + minor·100 + patch; older:
// major·1000 + minor·100 + patch).
std::string nccl_version_text(int code);
// "NCCL 2.28.9, 2 ranks, device 0 (NVIDIA H100 80GB HBM3)"
std::string describe(int version_code, int ranks, int device, const std::string& device_name);

// The text of every CommunicationError: "nccl.<op> on rank r of n: <why>", and its hint.
std::string failure_message(const char* op, int rank, int size, const std::string& why);
const char* failure_hint() noexcept;
// Seconds as the user wrote them ("300", "0.5").
std::string seconds_text(double seconds);
// One wait loop's pause: yield for the first polls (host collectives of a few doubles finish in
// microseconds), then sleep 100 µs so a rank waiting minutes for a slow peer does not hold a core.
void pause_poll(int& polls);

}  // namespace mixtrain::communicator_nccl
