// The option schema of the CUDA backend, header-only: the plugin module declares it without
// linking the CUDA libraries, which load only when a CUDA backend is created.
#pragma once

#include "mixtrain/sdk/options.h"

namespace mixtrain::backend_cuda {

inline sdk::OptionSchema cuda_backend_option_schema() {
  return {sdk::OptionSpec::integer("device", 0,
                                   "CUDA device index (as CUDA_VISIBLE_DEVICES numbers them)")
              .at_least(0)
              .at_most(1023),
          sdk::OptionSpec::boolean(
              "fp8_fast_accumulation", false,
              "FP8 GEMMs without cuBLASLt's periodic promotion of the accumulator to FP32 "
              "(CUBLASLT_MATMUL_DESC_FAST_ACCUM): faster on Hopper, less exact")};
}

// The runtime library's entry point: builds a CudaBackend on `device` (fp8_fast_accumulation: 0 or
// 1), or returns null and writes the reason (CUDA's error text) and a hint into `error` and `hint`
// (each `size` bytes, NUL-terminated, truncated). C linkage and no exceptions across the dlopen
// boundary; the module and the runtime library are built together, so this signature is private.
using CreateCudaBackendFn = void* (*)(int device, int fp8_fast_accumulation, char* error,
                                      char* hint, unsigned long size);
inline constexpr const char* kCreateCudaBackendSymbol = "mixtrain_backend_cuda_create";
inline constexpr const char* kCudaRuntimeLibrary = "backend_cuda/libmixtrain_backend_cuda_runtime.so";

}  // namespace mixtrain::backend_cuda
