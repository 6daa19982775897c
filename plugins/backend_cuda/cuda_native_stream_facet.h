// CudaNativeStream: the CUDA backend's NativeStreamFacet (sdk/backend_native_stream.h): the
// context's cudaStream_t, on which every op of the backend is enqueued, for plugins that order
// their own device work against it (e.g. the NCCL communicator). The same stream every call.
#pragma once

#include "cuda_context.h"
#include "mixtrain/sdk/backend_native_stream.h"

namespace mixtrain::backend_cuda {

class CudaNativeStream final : public sdk::NativeStreamFacet {
 public:
  explicit CudaNativeStream(CudaContext& context) : context_(context) {}

  void* native_stream() override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
