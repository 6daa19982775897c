#include "nccl_rules.h"

#include <charconv>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string_view>
#include <thread>

#include "mixtrain/sdk/error.h"

namespace mixtrain::communicator_nccl {
namespace {

std::string describe_tensor(const char* name, const sdk::TensorView& t) {
  return std::string(name) + " (" + std::string(sdk::dtype_name(t.dtype)) + ", " +
         std::to_string(t.numel()) + " elements)";
}

void check_data(const char* op, const char* name, const sdk::TensorView& t) {
  // A null pointer with elements would reach NCCL as an illegal address on the device, long
  // after the call that passed it.
  if (t.data == nullptr && t.numel() > 0)
    throw sdk::BackendError(
        "nccl." + std::string(op) + ": " + describe_tensor(name, t) + " has no data pointer",
        "pass a tensor allocated by the bound CUDA backend");
}

}  // namespace

ncclDataType_t reduce_type(sdk::DType dtype, const char* op) {
  switch (dtype) {
    case sdk::DType::fp32:
    case sdk::DType::tf32:
      return ncclFloat32;
    case sdk::DType::bf16:
      return ncclBfloat16;
    case sdk::DType::fp16:
      return ncclFloat16;
    default:
      break;
  }
  throw sdk::BackendError("nccl." + std::string(op) + ": cannot reduce " +
                              std::string(sdk::dtype_name(dtype)) +
                              " tensors; the nccl communicator reduces fp32, tf32, bf16 and fp16",
                          "reduce the gradients in fp32 or bf16 (gather or broadcast moves any "
                          "dtype)");
}

ncclDataType_t move_type(sdk::DType dtype) noexcept {
  switch (dtype) {
    case sdk::DType::fp32:
    case sdk::DType::tf32:
      return ncclFloat32;
    case sdk::DType::bf16:
      return ncclBfloat16;
    case sdk::DType::fp16:
      return ncclFloat16;
    case sdk::DType::fp8_e4m3:
    case sdk::DType::fp8_e5m2:
      return ncclUint8;  // bytes: NCCL's fp8 types need 2.24 and sm_90
    case sdk::DType::int32:
      return ncclInt32;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(sdk::ReduceOp op) noexcept {
  switch (op) {
    case sdk::ReduceOp::sum:
      return ncclSum;
    case sdk::ReduceOp::avg:
      return ncclAvg;
    case sdk::ReduceOp::max:
      return ncclMax;
  }
  return ncclSum;
}

std::size_t check_all_reduce(const sdk::TensorView& data) {
  check_data("all_reduce", "data", data);
  return static_cast<std::size_t>(data.numel());
}

std::size_t check_reduce_scatter(const sdk::TensorView& send, const sdk::TensorView& recv,
                                 int world_size) {
  check_data("reduce_scatter", "send", send);
  check_data("reduce_scatter", "recv", recv);
  const std::int64_t pieces = recv.numel() * world_size;
  if (send.dtype != recv.dtype || send.numel() != pieces)
    throw sdk::BackendError("nccl.reduce_scatter: " + describe_tensor("send", send) +
                                " must hold " + std::to_string(world_size) + " pieces of " +
                                describe_tensor("recv", recv) + ", i.e. " + std::to_string(pieces) +
                                " elements of " + std::string(sdk::dtype_name(recv.dtype)),
                            "size send as recv.numel() × world_size, in recv's dtype");
  return static_cast<std::size_t>(recv.numel());
}

std::size_t check_all_gather(const sdk::TensorView& send, const sdk::TensorView& recv,
                             int world_size) {
  check_data("all_gather", "send", send);
  check_data("all_gather", "recv", recv);
  const std::int64_t pieces = send.numel() * world_size;
  if (send.dtype != recv.dtype || recv.numel() != pieces)
    throw sdk::BackendError("nccl.all_gather: " + describe_tensor("recv", recv) + " must hold " +
                                std::to_string(world_size) + " pieces of " +
                                describe_tensor("send", send) + ", i.e. " + std::to_string(pieces) +
                                " elements of " + std::string(sdk::dtype_name(send.dtype)),
                            "size recv as send.numel() × world_size, in send's dtype");
  return static_cast<std::size_t>(send.numel());
}

std::size_t check_broadcast(const sdk::TensorView& data, int root, int world_size) {
  check_data("broadcast", "data", data);
  if (root < 0 || root >= world_size)
    throw sdk::BackendError("nccl.broadcast: root " + std::to_string(root) +
                                " is not a rank of this run (ranks 0.." +
                                std::to_string(world_size - 1) + ")",
                            "broadcast from a rank in [0, world_size())");
  return static_cast<std::size_t>(data.numel());
}

std::optional<int> parse_local_rank(const char* value) noexcept {
  if (value == nullptr) return std::nullopt;
  const std::string_view text(value);
  int rank = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty() || rank < 0)
    return std::nullopt;
  return rank;
}

int choose_device(int local_rank, int device_count, const std::string& why) {
  if (device_count <= 0)
    throw sdk::BackendError(
        "the nccl communicator needs a CUDA device; none is visible (" +
            (why.empty() ? std::string("cudaGetDeviceCount reports 0 devices") : why) + ")",
        "run on a machine with an NVIDIA GPU and driver (check nvidia-smi and "
        "CUDA_VISIBLE_DEVICES), or use [distributed] type = \"mpi\" for CPU ranks");
  return (local_rank < 0 ? 0 : local_rank) % device_count;
}

std::string nccl_version_text(int code) {
  const bool new_scheme = code >= 20900;
  const int major = new_scheme ? code / 10000 : code / 1000;
  const int minor = new_scheme ? (code % 10000) / 100 : (code % 1000) / 100;
  const int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string describe(int version_code, int ranks, int device, const std::string& device_name) {
  return "NCCL " + nccl_version_text(version_code) + ", " + std::to_string(ranks) +
         (ranks == 1 ? " rank" : " ranks") + ", device " + std::to_string(device) + " (" +
         device_name + ")";
}

std::string failure_message(const char* op, int rank, int size, const std::string& why) {
  return "nccl." + std::string(op) + " on rank " + std::to_string(rank) + " of " +
         std::to_string(size) + ": " + why;
}

const char* failure_hint() noexcept {
  return "another rank failed, stopped or never joined: check the other ranks' logs; raise "
         "[distributed] timeout_s if a rank is only slow (long checkpoint writes, first-step "
         "setup)";
}

std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

void pause_poll(int& polls) {
  if (++polls < 1000)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

}  // namespace mixtrain::communicator_nccl
