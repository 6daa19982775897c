#include "cuda_access.h"

#include <algorithm>
#include <cstdint>

namespace mixtrain::backend_cuda {

const sdk::BackendArgumentChecks& checks() {
  static const sdk::BackendArgumentChecks instance("backend_cuda");
  return instance;
}

void fail(std::string_view op, const std::string& what, std::string hint) {
  checks().fail(op, what, std::move(hint));
}

void require_present(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_present(op, name, v);
}

void require_storage(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_storage(op, name, v);
}

void require_fp32(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_fp32(op, name, v);
}

void require_numel(std::string_view op, std::string_view name, const sdk::TensorView& v,
                   std::int64_t numel) {
  checks().require_numel(op, name, v, numel);
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

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  if (v == 0) return 256;
  return static_cast<int>(std::min<std::uintptr_t>(256, v & (~v + 1)));
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
