// Plugin entry point: exports one component, backend "cuda". The module itself links no CUDA
// library, so it loads on any machine and costs nothing in processes that never use it; its
// factory opens the runtime library (backend_cuda/libmixtrain_backend_cuda_runtime.so, which
// links libcudart and libcublasLt) on first use. Without a usable device the factory throws
// BackendError with CUDA's own error text, which `mixtrain plugins` shows as "unavailable".
#include <dlfcn.h>

#include <filesystem>
#include <memory>
#include <mutex>

#include "cuda_backend_options.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/support/elf_file_check.h"

namespace {

using namespace mixtrain;

// Opens the runtime library next to this module once; never closed (objects it creates may live
// until the process exits).
backend_cuda::CreateCudaBackendFn runtime_entry() {
  static std::once_flag once;
  static backend_cuda::CreateCudaBackendFn entry = nullptr;
  static std::string error;
  std::call_once(once, [] {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&runtime_entry), &self) == 0 || self.dli_fname == nullptr) {
      error = "cannot locate the backend_cuda plugin module on disk";
      return;
    }
    const auto path =
        std::filesystem::path(self.dli_fname).parent_path() / backend_cuda::kCudaRuntimeLibrary;
    // The largest file of an install, so the likeliest to be half-copied: a truncated library
    // would kill the process inside dlopen (SIGBUS) instead of failing.
    try {
      sdk::check_elf_file(path);
    } catch (const sdk::PluginError& e) {
      error = "cannot load " + path.string() + ": " + e.what();
      return;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      error = "cannot load " + path.string() + ": " + (why ? why : "unknown dlopen error");
      return;
    }
    entry = reinterpret_cast<backend_cuda::CreateCudaBackendFn>(
        dlsym(handle, backend_cuda::kCreateCudaBackendSymbol));
    if (entry == nullptr)
      error = path.string() + " has no " + backend_cuda::kCreateCudaBackendSymbol;
  });
  if (entry == nullptr)
    throw sdk::BackendError(
        "backend_cuda: " + error,
        "reinstall mixtrain with its CUDA runtime library, and check that the "
        "CUDA toolkit's libraries (libcudart, libcublasLt) are on the loader path");
  return entry;
}

std::unique_ptr<sdk::Component> create_cuda_backend(const sdk::Options& options,
                                                    const sdk::PluginContext& context) {
  char error[1024] = {};
  char hint[1024] = {};
  backend_cuda::CudaOptions cuda;
  cuda.device = static_cast<int>(options.get_int("device"));
  if (!options.was_set("device"))
    if (const auto local = backend_cuda::local_rank_from_environment()) {
      cuda.device = local->rank;
      cuda.device_from_local_rank = true;
      context.logger.info("backend.cuda: device from the local rank (" +
                          std::string(local->variable) + " = " + std::to_string(local->rank) +
                          ", modulo the visible devices); set backend.cuda.device to choose");
    }
  cuda.fp8_fast_accumulation = options.get_bool("fp8_fast_accumulation");
  cuda.gemm_autotune = static_cast<int>(options.get_int("gemm_autotune"));
  cuda.gemm_realign = options.get_bool("gemm_realign");
  cuda.deterministic_attention = options.get_bool("deterministic_attention");
  cuda.deterministic_convolutions = options.get_bool("deterministic_convolutions");
  cuda.layernorm_backward_one_pass = options.get_bool("layernorm_backward_one_pass");
  cuda.fp8_cast_transpose = options.get_bool("fp8_cast_transpose");
  cuda.fp8_gradient_cast = options.get_bool("fp8_gradient_cast");
  cuda.conv_workspace = options.get_bool("conv_workspace");
  cuda.conv_dgrad_accumulate = options.get_bool("conv_dgrad_accumulate");
  cuda.conv_autotune = static_cast<int>(options.get_int("conv_autotune"));
  cuda.conv_wgrad_in_operand_dtype = options.get_bool("conv_wgrad_in_operand_dtype");
  cuda.logger = context.logger;
  void* raw = runtime_entry()(&cuda, error, hint, 1024);
  if (raw == nullptr) throw sdk::BackendError(error, hint);
  std::unique_ptr<sdk::Component> backend(static_cast<sdk::DeviceBackend*>(raw));
  context.logger.debug("cuda backend on " +
                       static_cast<sdk::DeviceBackend*>(raw)->capabilities().device_name);
  if (const std::string loose = backend_cuda::irreproducible_options(cuda); !loose.empty())
    context.logger.info("backend.cuda: " + loose +
                        ": two runs of this config may differ in their last bits, and a resumed "
                        "run may not repeat the uninterrupted one; the defaults are reproducible");
  return backend;
}

std::vector<sdk::ComponentInfo> backend_cuda_components() {
  return {{sdk::ComponentKind::backend, "cuda",
           "CUDA backend: cuBLASLt Tensor Core GEMMs (fp32/tf32/bf16/fp16, fp8 on sm_89+), cuDNN "
           "convolutions, CUDA kernels for batch norm, attention, embeddings, casts, loss and "
           "fused optimizers",
           backend_cuda::cuda_backend_option_schema(), &create_cuda_backend}};
}

}  // namespace

MIXTRAIN_PLUGIN("backend_cuda", "0.1.0", backend_cuda_components)
