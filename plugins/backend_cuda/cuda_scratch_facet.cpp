// CudaScratch: the CUDA backend's ScratchFacet (sdk/backend_scratch.h), whole in one file. Its
// scratch is the context's own buffers as account_buffers() last folded them into the allocator's
// statistics: the grow-only scratch, the convolution's workspace and the image input's byte slots
// (the fixed cuBLASLt workspace is counted in neither).
#include "cuda_context.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

namespace {

class CudaScratch final : public sdk::ScratchFacet {
 public:
  explicit CudaScratch(CudaContext& context) : context_(context) {}

  std::size_t scratch_bytes() const override { return context_.buffer_bytes(); }

 private:
  CudaContext& context_;
};

const sdk::FacetRegistration<CudaContext, sdk::ScratchFacet, CudaScratch> kCudaScratchRegistration;

}  // namespace

}  // namespace mixtrain::backend_cuda
