// Plugin entry point: exports one component, backend "cuda". The library loads on any machine
// (it needs libcudart and libcublasLt, not a GPU); without a usable device the factory throws
// BackendError with CUDA's own error text, which `mixtrain plugins` shows as "unavailable".
#include <memory>

#include "cuda_backend.h"
#include "mixtrain/sdk/plugin.h"

namespace {

using namespace mixtrain;

std::unique_ptr<sdk::Component> create_cuda_backend(const sdk::Options& options,
                                                    const sdk::PluginContext& context) {
  const auto device = static_cast<int>(options.get_int("device"));
  auto backend = std::make_unique<backend_cuda::CudaBackend>(device);
  const auto caps = backend->capabilities();
  context.logger.debug("cuda backend on " + caps.device_name);
  return backend;
}

std::vector<sdk::ComponentInfo> backend_cuda_components() {
  return {{sdk::ComponentKind::backend, "cuda",
           "CUDA backend: cuBLASLt Tensor Core GEMMs (fp32/tf32/bf16/fp16, fp8 on sm_89+), CUDA "
           "kernels for casts, layers, loss and fused optimizers",
           backend_cuda::CudaBackend::option_schema(),
           &create_cuda_backend}};
}

}  // namespace

MIXTRAIN_PLUGIN("backend_cuda", "0.1.0", backend_cuda_components)
