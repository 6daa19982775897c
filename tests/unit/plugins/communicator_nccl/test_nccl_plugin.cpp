// The nccl plugin as the host loads it: the module (no CUDA, NCCL or MPI linked) is found by the
// registry, declares its options, and its factory opens the runtime library, which initialises
// MPI from a dlopen'ed library. Without a device the factory's BackendError must cross the
// dlopen boundary with its message and hint (the registry rethrows it as a PluginError naming
// the component); with one, a one-rank communicator comes back.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>

#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain {
namespace {

bool device_visible() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

TEST(nccl_plugin, LoadsAndCreatesThroughTheRuntimeLibrary) {
  core::PluginRegistry registry;
  registry.load_library(MIXTRAIN_NCCL_PLUGIN);
  const auto* component = registry.find(sdk::ComponentKind::communicator, "nccl");
  ASSERT_NE(component, nullptr) << registry.load_problems();
  const auto options =
      sdk::Options::resolve("distributed", component->info.options, {{"timeout_s", 30.0, {}}}, {});
  if (!device_visible()) {
    try {
      registry.create<sdk::Communicator>(*component, options);
      FAIL() << "created a communicator without a device";
    } catch (const sdk::UserError& e) {  // the registry's PluginError, naming the component
      EXPECT_NE(std::string(e.what()).find(
                    "the nccl communicator needs a CUDA device; none is visible ("),
                std::string::npos)
          << e.what();
      EXPECT_NE(e.hint().find("CUDA_VISIBLE_DEVICES"), std::string::npos) << e.hint();
    }
    return;
  }
  auto comm = registry.create<sdk::Communicator>(*component, options);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->description().rfind("NCCL 2.", 0), 0u) << comm->description();
}

}  // namespace
}  // namespace mixtrain
