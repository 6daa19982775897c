// CudaEmbedding: the CUDA backend's EmbeddingFacet (sdk/backend_embedding.h): row gather by id
// and the deterministic scatter-add (cuda_embedding.cu).
//
// Contract (in addition to sdk/backend_embedding.h)
// - Ids are checked on the device, as softmax_cross_entropy checks labels: an id outside [0, V)
//   leaves out / dtable untouched and raises BackendError naming id and row at the next
//   synchronising call (CudaContext::sync).
#pragma once

#include "cuda_context.h"
#include "mixtrain/sdk/backend_embedding.h"

namespace mixtrain::backend_cuda {

class CudaEmbedding final : public sdk::EmbeddingFacet {
 public:
  explicit CudaEmbedding(CudaContext& context) : context_(context) {}

  void gather(sdk::TensorView ids, sdk::TensorView table, sdk::TensorView out,
              bool accumulate) override;
  void scatter_add(sdk::TensorView ids, sdk::TensorView dy, sdk::TensorView dtable,
                   float beta) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
