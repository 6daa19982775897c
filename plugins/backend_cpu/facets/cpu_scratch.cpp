// CpuScratch: the CPU backend's ScratchFacet. Its scratch is the GEMM's and the primitive cache's
// grow-only buffers (decoded operands of emulated formats, fp32 staging of 16-bit outputs,
// reordered weights, Winograd's blocked activations), as the context last counted them into
// memory_stats(); oneDNN's own per-call scratchpad is in neither.
#include "cpu_context.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

namespace {

class CpuScratch final : public sdk::ScratchFacet {
 public:
  explicit CpuScratch(CpuContext& context) : context_(context) {}

  std::size_t scratch_bytes() const override { return context_.scratch_bytes(); }

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::ScratchFacet, CpuScratch> kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cpu
