// cuDNN handle, error text and backend-descriptor owner (contract in the header).
#include "cuda_cudnn.h"

#include <utility>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

std::string cudnn_error_text(cudnnStatus_t status) {
  std::string text = std::string(cudnnGetErrorString(status)) + " (" +
                     std::to_string(static_cast<int>(status)) + ")";
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof last);
  if (last[0] != '\0') text += ": " + std::string(last);
  return text;
}

void check_cudnn(cudnnStatus_t status, std::string_view op, std::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  fail(op, std::string(what) + " failed: " + cudnn_error_text(status),
       "check that cuDNN 9 and its engine libraries (libcudnn_engines_*.so.9) are installed next "
       "to libcudnn.so.9 and match the driver; set CUDNN_LOGERR_DBG=1 for cuDNN's own log");
}

std::string cudnn_version_text() {
  const std::size_t v = cudnnGetVersion();  // 91900 for 9.19.0
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
         std::to_string(v % 100);
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  status_ = cudnnBackendCreateDescriptor(type, &d_);
  if (status_ != CUDNN_STATUS_SUCCESS) d_ = nullptr;
}

Descriptor::~Descriptor() {
  if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
}

Descriptor& Descriptor::operator=(Descriptor&& o) noexcept {
  if (this != &o) {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
    d_ = std::exchange(o.d_, nullptr);
    status_ = o.status_;
  }
  return *this;
}

cudnnStatus_t Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                              std::int64_t count, const void* values) {
  if (d_ == nullptr) return status_;
  return cudnnBackendSetAttribute(d_, name, type, count, values);
}

cudnnStatus_t Descriptor::finalize() {
  if (d_ == nullptr) return status_;
  return cudnnBackendFinalize(d_);
}

cudnnStatus_t Descriptor::get(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                              std::int64_t requested, std::int64_t* count, void* values) const {
  if (d_ == nullptr) return status_;
  return cudnnBackendGetAttribute(d_, name, type, requested, count, values);
}

CudnnHandle::~CudnnHandle() {
  if (handle_ != nullptr) cudnnDestroy(handle_);
}

cudnnHandle_t CudnnHandle::get(cudaStream_t stream, std::string_view op) {
  if (handle_ == nullptr) {
    cudnnHandle_t h = nullptr;
    check_cudnn(cudnnCreate(&h), op, "cudnnCreate (cuDNN " + cudnn_version_text() + ")");
    handle_ = h;
    check_cudnn(cudnnSetStream(handle_, stream), op, "cudnnSetStream");
  }
  return handle_;
}

}  // namespace mixtrain::backend_cuda
