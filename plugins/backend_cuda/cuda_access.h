// Validation and CUDA error helpers shared by the CUDA backend's host code.
//
// Contract
// - fail()/require_*() throw sdk::BackendError whose message names "backend_cuda.<op>", the
//   tensor, its dtype and shape, and whose hint says how to fix the call (same wording as the CPU
//   backend, so a user switching backends reads the same messages).
// - check_cuda()/check_cublas() turn a failed CUDA runtime / cuBLASLt status into a BackendError
//   carrying the library's own error name and text ("cudaErrorNoDevice: no CUDA-capable device
//   is detected").
// - Storage dtypes are fp32 (tf32 views are fp32 storage), bf16 and fp16; fp8 storage is accepted
//   only by gemm(), cast() and cast_transpose().
#pragma once

#include "mixtrain/sdk/support/backend_argument_checks.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "cuda_kernel_types.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cuda {

// The SDK's shared checks, with this backend's name in every message.
const sdk::BackendArgumentChecks& checks();
[[noreturn]] void fail(std::string_view op, const std::string& what, std::string hint = {});
using sdk::describe;  // "bf16 [512, 1024]"

// "cudaErrorNoDevice: no CUDA-capable device is detected"
std::string cuda_error_text(cudaError_t status);
// Throws BackendError "backend_cuda.<op>: <what> failed: <cuda error text>" unless cudaSuccess.
void check_cuda(cudaError_t status, std::string_view op, std::string_view what);

// The largest power of two up to 256 that divides p's address (256 for nullptr: scratch, which
// is 256-byte aligned, stands for itself so): what cuBLASLt's MIN_ALIGNMENT preferences take.
int alignment_of(const void* p);

using sdk::is_fp32_storage;
using sdk::is_storage_float;

void require_present(std::string_view op, std::string_view name, const sdk::TensorView& v);
// fp32, bf16 or fp16 storage.
void require_storage(std::string_view op, std::string_view name, const sdk::TensorView& v);
void require_fp32(std::string_view op, std::string_view name, const sdk::TensorView& v);
void require_numel(std::string_view op, std::string_view name, const sdk::TensorView& v,
                   std::int64_t numel);

// The kernels' element type of a storage dtype (tf32 is fp32 storage).
kernels::Elem elem_of(sdk::DType t);

}  // namespace mixtrain::backend_cuda
