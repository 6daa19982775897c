// cuDNN for the CUDA backend: the library handle, error text, and an owner for backend
// descriptors (cuDNN 9's graph API, cudnn_graph.h; the legacy convolution calls are deprecated in
// cuDNN 9 and not used).
//
// Contract
// - check_cudnn() turns a failed status into sdk::BackendError "backend_cuda.<op>: <what> failed:
//   CUDNN_STATUS_...: <cuDNN's text> (<cudnnGetLastErrorString>)".
// - Descriptor owns one cudnnBackendDescriptor_t (destroyed with it); set() and get() wrap
//   cudnnBackendSetAttribute / GetAttribute and return the status (the plan builder treats a
//   failure on one engine configuration as "try the next"); set_or_throw() throws.
// - CudnnHandle is created on first use (cudnnCreate needs the device; it loads cuDNN's engine
//   libraries, so a backend that never convolves never pays it) and bound to the backend's stream.
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace mixtrain::backend_cuda {

// "CUDNN_STATUS_NOT_SUPPORTED (3000): ..." with cuDNN's last error message when it has one.
std::string cudnn_error_text(cudnnStatus_t status);
void check_cudnn(cudnnStatus_t status, std::string_view op, std::string_view what);
// "9.19.0" of the loaded library (cudnnGetVersion), and of the headers built against.
std::string cudnn_version_text();

class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& o) noexcept : d_(o.d_), status_(o.status_) { o.d_ = nullptr; }
  Descriptor& operator=(Descriptor&& o) noexcept;

  // cudnnBackendCreateDescriptor's status (the descriptor is null when it failed).
  cudnnStatus_t status() const { return status_; }
  cudnnBackendDescriptor_t get() const { return d_; }
  // The address of the handle, for attributes that take descriptors.
  const cudnnBackendDescriptor_t* ptr() const { return &d_; }

  cudnnStatus_t set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                    std::int64_t count, const void* values);
  cudnnStatus_t finalize();
  cudnnStatus_t get(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                    std::int64_t requested, std::int64_t* count, void* values) const;

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_NOT_INITIALIZED;
};

class CudnnHandle {
 public:
  CudnnHandle() = default;
  ~CudnnHandle();
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  // The handle, created on the first call (on the current device) and bound to `stream`.
  cudnnHandle_t get(cudaStream_t stream, std::string_view op);
  bool created() const { return handle_ != nullptr; }

 private:
  cudnnHandle_t handle_ = nullptr;
};

}  // namespace mixtrain::backend_cuda
