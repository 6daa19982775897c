// Launchers of the attention facet's kernels (cuda_attention.cu); plain C++ like every launcher
// header (cuda_kernel_types.h).
//
// Contract
// - Enqueue on `stream` only, validate nothing (the backend did: cuda_facet_checks.h), return the
//   launch status.
// - Permutes move rows of D elements between the token-major x [N, T, P, H, D] and the
//   head-major y [P, N, H, T', D] (token t of x is token offset + t of y); equal storage types
//   move bits, different ones decode exactly and round once (RNE). Rows of y outside
//   [offset, offset + T) are not touched.
// - The softmax is FP32, one warp per row (query), lanes striding the keys: max of scale*s,
//   e = exp_nonpos(scale*s - max), Σe and Σ dp*p in double with each lane's partial in key order
//   and the lanes combined by a fixed xor-shuffle tree, so a row's bits do not depend on the
//   launch; the per-element steps are cuda_element_math.h's (the CPU's expressions; the exp is
//   within 2 ulps of the CPU's). Masked entries are written as exact +0.
// - flash_decode: one block per (new query, head) over a head-major KV cache, the keys in tiles
//   with a running max and sum (an online softmax in FP32, the exp cuda_element_math.h's), the
//   output accumulated in FP32 and rounded once; fixed orders, so deterministic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// The HeadLayout's numbers (sdk/backend_attention.h), capacity = T' resolved.
struct PermuteShape {
  std::int64_t batch, tokens, parts, heads, head_dim, capacity, offset;
};

// to_heads: y = permute(x) (split_heads); else x = permute⁻¹(y) (merge_heads).
cudaError_t head_permute(const void* x, Elem xt, void* y, Elem yt, const PermuteShape& s,
                         bool to_heads, cudaStream_t stream);

// probs = softmax(scale * scores) per row of [batch * rows, cols] (fp32; probs may be scores).
cudaError_t softmax_forward(const float* scores, float* probs, std::int64_t batch,
                            std::int64_t rows, std::int64_t cols, bool causal, float scale,
                            cudaStream_t stream);
// dscores = scale * probs * (dprobs - Σ dprobs * probs) per row (fp32; dscores may be dprobs).
cudaError_t softmax_backward(const float* probs, const float* dprobs, float* dscores,
                             std::int64_t batch, std::int64_t rows, std::int64_t cols, bool causal,
                             float scale, cudaStream_t stream);

// out [1, rows, H, D] = attention of the queries at cache rows [start, start + rows) over keys
// [0, start + i] each, from cache [3, 1, H, cap, D] (attention facet 1.3's flash_decode).
cudaError_t flash_decode(const void* cache, Elem ct, std::int64_t heads, std::int64_t cap,
                         std::int64_t d, std::int64_t start, std::int64_t rows, float scale,
                         void* out, Elem ot, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
