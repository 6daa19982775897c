// The host-side rules of the CUDA backend's flash attention (cuDNN's SDPA graphs through the cuDNN
// frontend, cuda_sdpa_graphs.h), plain C++ without a CUDA or cuDNN header so the host tests check
// them without a GPU: which shapes and devices it takes, the plan-cache key, and the dims and
// strides that let cuDNN read q, k and v where the QKV projection wrote them.
//
// Contract
// - Layouts are AttentionFacet's (sdk/backend_attention.h): qkv [N, T, 3, H, D] token-major, out
//   and dout [N, T, H, D], lse fp32 [N, H, T]. cuDNN is told each as [N, H, T, D] dims (BHSD
//   order) with the strides of that memory, so nothing is permuted or copied: q, k and v are three
//   strided views of one qkv buffer, `offset` elements apart.
// - static_refusal() answers from cuDNN 9's documented support matrix for SDPA in fp16 / bf16:
//   sm_80 or newer; a head dimension that is a multiple of 8 (16-byte rows, so k's and v's views
//   start 16-byte aligned too), at most 128 before sm_90 (the backward's limit) and at most 256
//   from sm_90. "" means cuDNN may still decline the graph; the graphs' own check is final.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "mixtrain/sdk/dtype.h"

namespace mixtrain::backend_cuda::sdpa {

// One attention shape and its numerics: the graph cache's key. batch 0 is the plan-time probe
// (the graphs are built for one sequence then).
struct Key {
  std::int64_t batch = 0, tokens = 0, heads = 0, head_dim = 0;
  sdk::DType dtype = sdk::DType::bf16;  // qkv, out, dout, dqkv
  float scale = 1.0f;
  bool deterministic = true;  // the backward's deterministic kernels
  // The scale by its bits, as KeyHash hashes it: a NaN scale finds its entry, and -0 is not 0.
  bool operator==(const Key& o) const;
};
struct KeyHash {
  std::size_t operator()(const Key& k) const noexcept;
};
// "N 8 T 1024 H 12 D 64 bf16 scale 0.125 deterministic".
std::string key_text(const Key& k);

// "" when cuDNN's SDPA can take this attention on an sm_<sm> device, else why not.
std::string static_refusal(std::int64_t tokens, std::int64_t head_dim, sdk::DType dtype, int sm);

// A tensor as cuDNN is told it: dims and strides in elements, [N, H, T, D] order (stats: [N, H, T,
// 1]), starting `offset` elements into its buffer.
struct Strided {
  std::array<std::int64_t, 4> dim{}, stride{};
  std::int64_t offset = 0;
};
// part 0 q, 1 k, 2 v of qkv [N, T, 3, H, D]; also their gradients in dqkv.
Strided qkv_part(const Key& k, int part);
// out and dout [N, T, H, D].
Strided token_major(const Key& k);
// lse [N, H, T] as cuDNN's softmax statistics [N, H, T, 1].
Strided stats(const Key& k);

}  // namespace mixtrain::backend_cuda::sdpa
