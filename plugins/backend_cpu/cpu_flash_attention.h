// Causal flash attention on the CPU (AttentionFacet 1.1's flash_forward / flash_backward and 1.3's
// flash_decode), in the manner of FlashAttention-2: q, k and v are read where the QKV projection
// (or the KV cache) holds them, in tiles of kFlashBlock tokens, and no [T, T] tensor exists beyond
// one tile per thread.
//
// Contract
// - Arguments as backend_attention.h states them, already checked (BackendArgumentChecks).
// - Forward: per (sequence, head, block of query rows), S = scale·q·kᵀ one key tile at a time (key
//   tiles wholly above the diagonal are skipped), an online softmax in FP32 (running max and sum;
//   exponentials by a vectorised Cephes expf, within 1 ulp) and O accumulated in FP32, rounded
//   once into out; lse = max + log(sum) per row. A task is a run of one head's query blocks
//   (whole heads when there are at least 4 a thread).
// - Backward: per (sequence, head), D_i = Σ dO_i·O_i, then per key tile and every query tile at or
//   below it P = exp(scale·S − lse), dV += Pᵀ·dO, dP = dO·vᵀ, dS = P∘(dP − D)·scale, dQ += dS·k,
//   dK += dSᵀ·q, all in FP32, each of dq, dk, dv rounded once into dqkv.
// - Tile products (FlashProducts), one thread each: the OpenMP team is over the tasks above and
//   each task sums in a fixed order, so results do not depend on the thread count.
//   - fp32: every operand exact in FP32 (16-bit ones decoded, each row once per task: the
//     forward's k and v up to the task's last key, the backward's q and dO for the whole head, k
//     and v per key tile; fp32 ones read in place), oneDNN's sgemm.
//   - bf16 (the forward and backward with bf16 qkv, and dout in the backward; fp32 otherwise):
//     q, k, v and dO copied into dense bf16 tiles, the products by Bf16TileMatmul
//     (cpu_tile_matmul.h: oneDNN, AMX-BF16 where the CPU has it), FP32 sums. Where the process may
//     run AMX tile instructions and the head dimension is a multiple of 32, the products whose
//     left operand is read as stored take AMX's own (cpu_amx_tile_product.h, oneDNN's bits): k
//     and v packed once per task forward and per key tile backward, for q·kᵀ, P·v, dO·vᵀ and
//     dS·k (P·v and dS·k added into o and dq a block at a time). P is rounded to bf16 before
//     P·v and Pᵀ·dO, and dS before dS·k and dSᵀ·q, as FlashAttention-2 does on a GPU (the attention
//     facet's contract allows it). The scale multiplies the scores after the product, one rounding,
//     as sgemm's alpha does.
//   The element work between them (the online softmax, P, dS: cpu_flash_element_kernels.h) is
//   compiled for x86-64-v4, v3 and the baseline and picked by cpuid (cpu_isa.h); a CPU's results
//   do not change between runs. The online softmax's max and sum run in fixed lanes
//   (cpu_lane_reductions.h), so the FMA variants (v4, v3) give the same bits; the baseline may
//   differ in the last bit of an exponential.
// - Scratch per thread: a few kFlashBlock × max(kFlashBlock, D) fp32 tiles; the forward's k and v,
//   2 × [T, D] (fp32 decoded, or bf16); in the backward, the head's dQ accumulator [T, D] and D_i
//   [T] in FP32, and its q and dO, 2 × [T, D] (fp32 decoded, or bf16) (heap, freed on return).
#pragma once

#include <cstdint>

#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

// 128: against 64, GPT-2 small's attention (12 heads × 1024 tokens, 2 threads) ran 1.2x faster
// with FP32 products and 1.24x (forward) / 1.33x (backward) with bf16 ones, GPT tiny's (T 128, D
// 32) 1.15x with bf16 ones; 256 sped the bf16 forward further but slowed the FP32 backward
// (bench/RESULTS.md, session 64).
inline constexpr std::int64_t kFlashBlock = 128;

// How the tile products compute (above), and the backend option `flash_products` that chooses
// (CpuContext::flash_products): `automatic` decides from the CPU's features. The caller asks for
// bf16 only where oneDNN offers a bf16 matmul (Bf16TileMatmul::available()), as
// CpuContext::flash_products does; elsewhere the first product throws BackendError.
enum class FlashProducts { fp32, bf16 };
enum class FlashProductsChoice { automatic, bf16, fp32 };

void flash_attention_forward(const sdk::TensorView& qkv, const sdk::HeadLayout& layout, float scale,
                             const sdk::TensorView& out, const sdk::TensorView& lse,
                             FlashProducts products = FlashProducts::fp32);

// flash_decode (facet 1.3): the forward's routine with the queries at rows [start, start + rows)
// of a head-major cache and keys up to each query's position; no lse. FP32 products always (the
// facet keeps a decode's probabilities in FP32).
void flash_attention_decode(const sdk::TensorView& cache, const sdk::HeadLayout& layout,
                            float scale, const sdk::TensorView& out);

void flash_attention_backward(const sdk::TensorView& qkv, const sdk::TensorView& out,
                              const sdk::TensorView& dout, const sdk::TensorView& lse,
                              const sdk::HeadLayout& layout, float scale,
                              const sdk::TensorView& dqkv,
                              FlashProducts products = FlashProducts::fp32);

}  // namespace mixtrain::backend_cpu
