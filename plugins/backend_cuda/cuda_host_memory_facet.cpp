// CudaHostMemory: the CUDA backend's HostMemoryFacet (sdk/backend_host_memory.h), whole in one
// file. Each buffer is a PinnedBlock (cuda_pinned_block.h: page-locked memory and the event of its
// last upload) registered with the context's staging (HostStaging::pinned) for its lifetime, so
// copy_from_host and decode_images read a source inside it in place instead of copying it into a
// staging slot first. allocate_host and the buffers touch only the device id, the block and the
// registry's mutex, so a loader thread may use them beside the backend's thread.
#include <algorithm>
#include <memory>

#include "cuda_context.h"
#include "cuda_pinned_block.h"
#include "mixtrain/sdk/backend_host_memory.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

namespace {

class CudaHostBuffer final : public sdk::HostBuffer {
 public:
  CudaHostBuffer(AddressRanges<PinnedBlock>& registry, std::size_t bytes, int device)
      : registry_(registry), block_(bytes, device) {
    registry_.add(block_.data(), block_.size(), &block_);
  }
  ~CudaHostBuffer() override {
    // Gone from the registry first: no upload may find the block while it is being freed.
    registry_.remove(block_.data());
  }

  std::byte* data() noexcept override { return block_.data(); }
  std::size_t size() const noexcept override { return block_.size(); }
  void wait_until_read() override { block_.wait_until_read(); }

 private:
  AddressRanges<PinnedBlock>& registry_;
  PinnedBlock block_;
};

class CudaHostMemory final : public sdk::HostMemoryFacet {
 public:
  explicit CudaHostMemory(CudaContext& context) : context_(context) {}

  std::unique_ptr<sdk::HostBuffer> allocate_host(std::size_t bytes) override {
    // At least a byte, so every buffer has an address of its own in the registry.
    return std::make_unique<CudaHostBuffer>(context_.staging.pinned,
                                            std::max<std::size_t>(bytes, 1), context_.device);
  }

 private:
  CudaContext& context_;
};

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::HostMemoryFacet, CudaHostMemory>
    kCudaHostMemoryRegistration;

}  // namespace

}  // namespace mixtrain::backend_cuda
