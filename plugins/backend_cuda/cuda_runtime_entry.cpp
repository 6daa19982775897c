// The CUDA runtime library of the plugin: the only code that links libcudart and libcublasLt.
// The plugin module opens it on the first CUDA backend it creates, so a process that only scans
// the plugin folder (every `mixtrain` run on a CPU) never maps the CUDA libraries.
#include <cuda_runtime_api.h>

#include <cstring>
#include <exception>
#include <type_traits>

#include "cuda_backend.h"
#include "cuda_backend_options.h"
#include "mixtrain/sdk/error.h"

namespace {
void copy_text(char* dst, const char* src, unsigned long size) {
  if (dst == nullptr || size == 0) return;
  std::strncpy(dst, src, size - 1);
  dst[size - 1] = '\0';
}
}  // namespace

extern "C" __attribute__((visibility("default"))) void* mixtrain_backend_cuda_create_v9(
    const mixtrain::backend_cuda::CudaOptions* options, char* error, char* hint,
    unsigned long size) {
  static_assert(std::is_same_v<decltype(&mixtrain_backend_cuda_create_v9),
                               mixtrain::backend_cuda::CreateCudaBackendFn>);
  try {
    mixtrain::backend_cuda::CudaOptions resolved = *options;
    // A local rank picks among the visible devices; without any, the context's own error says so.
    int count = 0;
    if (resolved.device_from_local_rank && cudaGetDeviceCount(&count) == cudaSuccess && count > 0)
      resolved.device %= count;
    (void)cudaGetLastError();
    return static_cast<mixtrain::sdk::DeviceBackend*>(
        new mixtrain::backend_cuda::CudaBackend(resolved));
  } catch (const mixtrain::sdk::UserError& e) {
    copy_text(error, e.what(), size);
    copy_text(hint, e.hint().c_str(), size);
  } catch (const std::exception& e) {
    copy_text(error, e.what(), size);
  } catch (...) {
    copy_text(error, "unknown error", size);
  }
  return nullptr;
}
