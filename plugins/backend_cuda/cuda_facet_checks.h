// The CUDA backend's own argument checks of the attention and embedding facets, as free host
// functions: no CUDA call, so tests run them on machines without a GPU (the backend itself cannot
// be constructed there), and every facet method runs them before it enqueues anything.
//
// Contract: each runs the SDK's shared check (sdk::BackendArgumentChecks through checks(), so
// both backends reject a call alike, "backend_cuda.<op>: ..." naming the tensor, its dtype and
// shape, with a hint), then what one launch of this backend's kernels covers; on success it
// returns the sizes the launch needs. What only the device can see (the ids' values) is checked
// there (cuda_embedding.h). The residual and dropout facets and the head permutes need nothing
// beyond the shared checks and call them directly.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"

namespace mixtrain::backend_cuda {

// softmax_forward: the shared checks, and batch * rows within one launch's grid. Returns the
// element count.
std::int64_t check_softmax_forward(const sdk::TensorView& scores, const sdk::SoftmaxShape& shape,
                                   const sdk::TensorView& probs);
// softmax_backward: the shared checks, and batch * rows within one launch's grid.
std::int64_t check_softmax_backward(const sdk::TensorView& probs, const sdk::TensorView& dprobs,
                                    const sdk::SoftmaxShape& shape, const sdk::TensorView& dscores);

using EmbeddingShape = sdk::BackendArgumentChecks::EmbeddingShape;
// gather: the shared checks, fewer than 2^31 - 1 ids and a table int32 ids can index.
EmbeddingShape check_gather(const sdk::TensorView& ids, const sdk::TensorView& table,
                            const sdk::TensorView& out);
// scatter_add: as gather, and a table no wider than one launch covers.
EmbeddingShape check_scatter_add(const sdk::TensorView& ids, const sdk::TensorView& dy,
                                 const sdk::TensorView& dtable, float beta);

}  // namespace mixtrain::backend_cuda
