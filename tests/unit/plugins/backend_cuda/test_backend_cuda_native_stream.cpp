// The CUDA backend's native_stream facet: the stream every op is enqueued on, so that the NCCL
// communicator can order its own stream against it. The type check runs everywhere; the rest
// needs a device and skips (with CUDA's error text) without one.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>
#include <vector>

#include "cuda_backend.h"
#include "cuda_native_stream_facet.h"
#include "mixtrain/sdk/backend_native_stream.h"

namespace mixtrain::backend_cuda {
namespace {

std::string no_device_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
  }
  if (count == 0) return "cudaGetDeviceCount reports 0 devices";
  return {};
}

TEST(backend_cuda_native_stream, NativeStreamIsAFacetObject) {
  static_assert(std::is_base_of_v<sdk::NativeStreamFacet, CudaNativeStream>);
  EXPECT_EQ(sdk::NativeStreamFacet::kName, "native_stream");
}

TEST(backend_cuda_native_stream, FacetReturnsTheBackendsNonBlockingStream) {
  if (const std::string reason = no_device_reason(); !reason.empty())
    GTEST_SKIP() << "no CUDA device: " << reason;
  CudaBackend backend(0);
  auto* facet = sdk::facet<sdk::NativeStreamFacet>(backend);
  ASSERT_NE(facet, nullptr);
  EXPECT_EQ(facet->name(), "native_stream");
  EXPECT_EQ(facet->version().major, sdk::NativeStreamFacet::kVersion.major);
  auto stream = static_cast<cudaStream_t>(facet->native_stream());
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(facet->native_stream(), stream);  // the one stream, every time
  unsigned int flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(stream, &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking));

  // Work enqueued on the stream by someone else is ordered with the backend's ops: a memset on
  // the facet's stream, then the backend's copy_to_host sees it.
  constexpr std::size_t n = 16;
  void* dev = backend.allocate(n * sizeof(float));
  const sdk::TensorView view{dev, sdk::DType::fp32, {static_cast<std::int64_t>(n)}};
  backend.fill(view, 1.0f);
  ASSERT_EQ(cudaMemsetAsync(dev, 0, n * sizeof(float), stream), cudaSuccess);
  std::vector<float> host(n, -1.0f);
  backend.copy_to_host(host.data(), view);
  for (float v : host) EXPECT_EQ(v, 0.0f);
  backend.deallocate(dev);
}

}  // namespace
}  // namespace mixtrain::backend_cuda
