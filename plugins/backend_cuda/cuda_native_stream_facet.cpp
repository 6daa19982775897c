// CudaNativeStream: hands out the context's stream.
#include "cuda_native_stream_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

void* CudaNativeStream::native_stream() {
  return context_.stream;
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::NativeStreamFacet, CudaNativeStream> kCudaNativeStreamRegistration;

}  // namespace mixtrain::backend_cuda
