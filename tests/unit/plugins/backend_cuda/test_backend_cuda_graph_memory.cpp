// The caching allocator under step graphs (cuda_allocator.h) on the device (skipped without one):
// a recorded graph holds raw addresses, so every block it may touch (live when the recording
// started, or allocated during it) keeps its address for the graph's life: freed, it is neither
// handed out again nor given back to the driver, and the replay still writes what it recorded.
// Once the last graph is released, the blocks return to the cache.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/sdk/backend_step_graph.h"

namespace mixtrain::backend_cuda::testing {
namespace {

TEST_F(backend_cuda_vs_cpu, BlocksAGraphMayTouchKeepTheirAddressesWhileItLives) {
  auto& graphs = gpu<sdk::StepGraphFacet>();
  // A size class no other test object uses (multiples of 2 MiB above 1 MiB).
  constexpr std::size_t kBytes = std::size_t{6} << 20;
  const std::int64_t n = static_cast<std::int64_t>(kBytes / 4);
  void* before = gpu().allocate(kBytes);  // live when the recording starts
  // One block cached beforehand, so the recording can allocate (a cudaMalloc would void it).
  void* cached = gpu().allocate(kBytes);
  gpu().deallocate(cached);
  const TensorView out{before, DType::fp32, Shape{n}};
  ASSERT_TRUE(graphs.begin_capture());
  void* during = gpu().allocate(kBytes);  // from the cache
  EXPECT_EQ(during, cached);
  const TensorView temp{during, DType::fp32, Shape{n}};
  gpu().fill(temp, 3.0f);
  gpu().copy(out, temp);
  gpu().deallocate(during);
  const int graph = graphs.end_capture();
  ASSERT_GE(graph, 0);
  gpu().deallocate(before);
  // Both freed, both still the graph's: a new block of the class is neither.
  void* fresh = gpu().allocate(kBytes);
  EXPECT_NE(fresh, during);
  EXPECT_NE(fresh, before);
  gpu().fill({fresh, DType::fp32, Shape{n}}, -1.0f);
  graphs.replay(graph);  // writes `during` and `before`, not `fresh`
  std::vector<float> got(static_cast<std::size_t>(n));
  gpu().copy_to_host(got.data(), {fresh, DType::fp32, Shape{n}});
  EXPECT_EQ(got.front(), -1.0f);
  EXPECT_EQ(got.back(), -1.0f);
  // And the replay did write where it recorded: `before` (freed, retired, still allocated) holds
  // the recorded fill.
  gpu().copy_to_host(got.data(), out);
  EXPECT_EQ(got.front(), 3.0f);
  EXPECT_EQ(got.back(), 3.0f);
  gpu().deallocate(fresh);
  graphs.release(graph);
  // No graph left: the held blocks are the cache's again.
  std::vector<void*> again;
  for (int i = 0; i < 3; ++i) again.push_back(gpu().allocate(kBytes));
  EXPECT_NE(std::find(again.begin(), again.end(), during), again.end());
  EXPECT_NE(std::find(again.begin(), again.end(), before), again.end());
  for (void* p : again) gpu().deallocate(p);
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
