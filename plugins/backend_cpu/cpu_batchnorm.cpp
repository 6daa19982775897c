// Batch norm on oneDNN (placeholder until the CPU batch norm lands: supports() answers no).
#include "cpu_backend.h"

#include <string>

#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {
[[noreturn]] void not_yet(const char* op) {
  throw sdk::BackendError(std::string("cpu backend: ") + op + " is not implemented yet");
}
}  // namespace

std::size_t CpuBackend::batchnorm_workspace_bytes(const sdk::BatchNormShape&, DType) const {
  return 0;
}
void CpuBackend::batchnorm_forward_training(TensorView, TensorView, TensorView,
                                            const sdk::BatchNormShape&, float, TensorView,
                                            TensorView, TensorView, TensorView, TensorView,
                                            TensorView) {
  not_yet("batchnorm_forward_training");
}
void CpuBackend::batchnorm_forward_inference(TensorView, TensorView, TensorView, TensorView,
                                             TensorView, const sdk::BatchNormShape&, TensorView) {
  not_yet("batchnorm_forward_inference");
}
void CpuBackend::batchnorm_backward(TensorView, TensorView, TensorView, TensorView, TensorView,
                                    TensorView, const sdk::BatchNormShape&, TensorView, TensorView,
                                    TensorView, TensorView, bool) {
  not_yet("batchnorm_backward");
}

}  // namespace mixtrain::backend_cpu
