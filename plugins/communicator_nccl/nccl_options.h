// The nccl communicator's option schema and the runtime library's entry point, header-only: the
// plugin module declares both without linking NCCL (218 MB), CUDA or MPI, which load only when a
// communicator is created.
#pragma once

#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::communicator_nccl {

inline sdk::OptionSchema nccl_option_schema() {
  return {sdk::OptionSpec::number(
              "timeout_s", 300.0,
              "seconds a blocking call (communicator setup, host collectives) or a running NCCL "
              "collective waits for the other ranks before the NCCL communicator is aborted and "
              "the run ends with CommunicationError; it must cover rank 0's longest checkpoint "
              "write")
              .greater_than(0)};
}

// How the runtime library's factory failed (no exceptions cross the dlopen boundary).
enum class CreateError : int { none = 0, backend = 1, communication = 2, other = 3 };

// Builds an NcclCommunicator, or returns null and writes the reason, its hint and its kind. The
// module and the runtime library are built together, so the signature is private; the symbol's
// name changes with it.
using CreateNcclFn = void* (*)(double timeout_s, const sdk::Logger* logger, int* error_kind,
                               char* error, char* hint, unsigned long size);
inline constexpr const char* kCreateNcclSymbol = "mixtrain_nccl_create_v1";
inline constexpr const char* kNcclRuntimeLibrary = "communicator_nccl/libmixtrain_nccl_runtime.so";

}  // namespace mixtrain::communicator_nccl
