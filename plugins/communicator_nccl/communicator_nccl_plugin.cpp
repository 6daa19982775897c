// Plugin entry point: exports one component, communicator "nccl". The module itself links no
// CUDA, NCCL or MPI library, so it loads on any machine and costs nothing in processes that never
// use it; its factory opens the runtime library (communicator_nccl/libmixtrain_nccl_runtime.so)
// on first use. Without a device the factory throws BackendError ("needs a CUDA device"), which
// `mixtrain plugins` shows as unavailable.
#include <dlfcn.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/support/elf_file_check.h"
#include "nccl_options.h"

namespace {

using namespace mixtrain;

// Opens the runtime library next to this module once; never closed (the communicator it creates
// may live until the process exits, and MPI must not be unmapped under its own atexit hooks).
communicator_nccl::CreateNcclFn runtime_entry() {
  static std::once_flag once;
  static communicator_nccl::CreateNcclFn entry = nullptr;
  static std::string error;
  std::call_once(once, [] {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&runtime_entry), &self) == 0 || self.dli_fname == nullptr) {
      error = "cannot locate the nccl plugin module on disk";
      return;
    }
    const auto path = std::filesystem::path(self.dli_fname).parent_path() /
                      communicator_nccl::kNcclRuntimeLibrary;
    try {
      sdk::check_elf_file(path);  // a half-copied library would SIGBUS inside dlopen
    } catch (const sdk::PluginError& e) {
      error = "cannot load " + path.string() + ": " + e.what();
      return;
    }
    // RTLD_GLOBAL: Open MPI loads its components (mca_*.so) with dlopen, and they resolve
    // libmpi's symbols from the global scope.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      error = "cannot load " + path.string() + ": " + (why ? why : "unknown dlopen error");
      return;
    }
    entry = reinterpret_cast<communicator_nccl::CreateNcclFn>(
        dlsym(handle, communicator_nccl::kCreateNcclSymbol));
    if (entry == nullptr) error = path.string() + " has no " + communicator_nccl::kCreateNcclSymbol;
  });
  if (entry == nullptr)
    throw sdk::BackendError("communicator_nccl: " + error,
                            "reinstall mixtrain with its NCCL runtime library, and check that "
                            "libnccl, libcudart and Open MPI's libmpi are on the loader path");
  return entry;
}

std::unique_ptr<sdk::Component> create_nccl(const sdk::Options& options,
                                            const sdk::PluginContext& context) {
  char error[1024] = {};
  char hint[1024] = {};
  int kind = 0;
  void* raw = runtime_entry()(options.get_double("timeout_s"), &context.logger, &kind, error, hint,
                              sizeof hint);
  if (raw == nullptr) {
    if (kind == static_cast<int>(communicator_nccl::CreateError::communication))
      throw sdk::CommunicationError(error, hint);
    throw sdk::BackendError(error, hint);
  }
  return std::unique_ptr<sdk::Component>(static_cast<sdk::Communicator*>(raw));
}

std::vector<sdk::ComponentInfo> nccl_components() {
  return {{sdk::ComponentKind::communicator, "nccl",
           "NCCL collectives on a communication stream of their own (one rank per GPU, set up "
           "through MPI), ordered with the CUDA backend's stream by events",
           communicator_nccl::nccl_option_schema(), &create_nccl}};
}

}  // namespace

MIXTRAIN_PLUGIN("nccl", "0.1.0", nccl_components)
