#include "cuda_access.h"

namespace mixtrain::backend_cuda {

void fail(std::string_view op, const std::string& what, std::string hint) {
  throw sdk::BackendError("backend_cuda." + std::string(op) + ": " + what, std::move(hint));
}

std::string describe(const sdk::TensorView& v) {
  return std::string(sdk::dtype_name(v.dtype)) + " " + v.shape.to_string();
}

std::string cuda_error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

void check_cuda(cudaError_t status, std::string_view op, std::string_view what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  fail(op, std::string(what) + " failed: " + cuda_error_text(status),
       status == cudaErrorMemoryAllocation
           ? "reduce the batch size or the model, or free device memory"
           : "check the device with nvidia-smi; an illegal access here means a tensor view points "
             "outside memory this backend allocated");
}

void require_present(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  if (v.empty() && v.numel() != 0)
    fail(op, std::string(name) + " is empty (null data) but has shape " + v.shape.to_string(),
         "pass a tensor allocated by this backend");
}

void require_storage(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  require_present(op, name, v);
  if (!is_storage_float(v.dtype))
    fail(op, std::string(name) + " is " + describe(v) + "; this op takes fp32, bf16 or fp16 storage",
         "cast the tensor to fp32, bf16 or fp16 first");
}

void require_fp32(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  require_present(op, name, v);
  if (!is_fp32_storage(v.dtype))
    fail(op, std::string(name) + " is " + describe(v) + " but must be fp32",
         "keep this tensor in fp32 (statistics, gradients accumulators and optimizer state are "
         "fp32)");
}

void require_numel(std::string_view op, std::string_view name, const sdk::TensorView& v,
                   std::int64_t numel) {
  if (v.numel() != numel)
    fail(op,
         std::string(name) + " is " + describe(v) + " (" + std::to_string(v.numel()) +
             " elements) but " + std::to_string(numel) + " are needed",
         "check the shapes passed to " + std::string(op));
}

kernels::Elem elem_of(sdk::DType t) {
  switch (t) {
    case sdk::DType::bf16: return kernels::Elem::bf16;
    case sdk::DType::fp16: return kernels::Elem::f16;
    case sdk::DType::fp8_e4m3: return kernels::Elem::e4m3;
    case sdk::DType::fp8_e5m2: return kernels::Elem::e5m2;
    case sdk::DType::int32: return kernels::Elem::i32;
    default: return kernels::Elem::f32;
  }
}

}  // namespace mixtrain::backend_cuda
