// CudaNativeStream: hands out the context's stream.
#include "cuda_native_stream_facet.h"

namespace mixtrain::backend_cuda {

void* CudaNativeStream::native_stream() {
  return context_.stream;
}

}  // namespace mixtrain::backend_cuda
