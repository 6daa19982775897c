// Argument checks of the residual, attention, embedding and dropout facets, as free host
// functions: no CUDA call, so tests run them on machines without a GPU (the backend itself cannot
// be constructed there), and every facet method runs them before it enqueues anything.
//
// Contract: each throws sdk::BackendError "backend_cuda.<op>: ..." naming the tensor, its dtype
// and shape (the CPU backend's wording, so both backends reject a call alike), with a hint; on
// success it returns the sizes the launch needs. What only the device can see (the ids' values)
// is checked there (cuda_embedding.h).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::backend_cuda {

// a and b are the same tensor (in place) or do not overlap.
void require_same_or_disjoint(std::string_view op, std::string_view a_name,
                              const sdk::TensorView& a, std::string_view b_name,
                              const sdk::TensorView& b);

// ResidualFacet::add: two or more inputs, each a storage float of y's numel, each y itself or
// disjoint from it; y a storage float. Returns y's numel.
std::int64_t check_residual_add(std::span<const sdk::TensorView> xs, const sdk::TensorView& y);

// split_heads / merge_heads: a sane layout, x [N, T, P, H, D] and y [P, N, H, T', D] storage
// floats that do not overlap.
void check_head_permute(std::string_view op, const sdk::TensorView& x,
                        const sdk::HeadLayout& layout, const sdk::TensorView& y);

// softmax_forward: fp32 scores/probs of batch*rows*cols (the same view or disjoint), a causal
// mask with rows <= cols. Returns the element count.
std::int64_t check_softmax_forward(const sdk::TensorView& scores, const sdk::SoftmaxShape& shape,
                                   const sdk::TensorView& probs);
// softmax_backward: fp32 probs/dprobs/dscores of batch*rows*cols; dscores is dprobs or disjoint
// from it, and never overlaps probs.
std::int64_t check_softmax_backward(const sdk::TensorView& probs, const sdk::TensorView& dprobs,
                                    const sdk::SoftmaxShape& shape, const sdk::TensorView& dscores);

struct EmbeddingShape {
  std::int64_t rows = 0, vocab = 0, width = 0;
};
// gather: ids int32 (rows), table storage [V, C], out storage [rows, C] disjoint from both.
EmbeddingShape check_gather(const sdk::TensorView& ids, const sdk::TensorView& table,
                            const sdk::TensorView& out);
// scatter_add: ids int32 (rows), dy storage [rows, C], dtable fp32 [V, C] disjoint from both,
// beta 0 or 1.
EmbeddingShape check_scatter_add(const sdk::TensorView& ids, const sdk::TensorView& dy,
                                 const sdk::TensorView& dtable, float beta);

// dropout_forward / dropout_backward: storage floats of equal numel, the same view or disjoint,
// p in [0, 1).
void check_dropout(std::string_view op, std::string_view in_name, const sdk::TensorView& in,
                   std::string_view out_name, const sdk::TensorView& out, float p);

}  // namespace mixtrain::backend_cuda
