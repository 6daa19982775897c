// CudaGemm: GEMMs through the context's cuBLASLt engine (cuda_gemm.cpp).
#include "cuda_gemm_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

#include "cuda_access.h"
#include "cuda_gemm.h"
#include "cuda_gemm_routes.h"

namespace mixtrain::backend_cuda {

using sdk::DType;

void CudaGemm::gemm(const sdk::GemmArgs& args) {
  context_.activate();
  context_.gemm->run(args);
  context_.account_buffers();
}

void CudaGemm::gemm_strided_batched(const sdk::GemmBatchedArgs& args) {
  context_.activate();
  checks().gemm_batched_shape(args);
  context_.gemm->run_batched(args);
  context_.account_buffers();
}

bool CudaGemm::supports(sdk::GemmOp op, std::span<const DType> dtypes) const {
  return gemm_supported(context_.capabilities(), op, dtypes);
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::GemmFacet, CudaGemm> kCudaGemmRegistration;

}  // namespace mixtrain::backend_cuda
