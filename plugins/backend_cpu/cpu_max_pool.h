// Max pooling over channels-last [N, H, W, C] activations: the convolution facet's pool2d_* ops
// for PoolKind::max (cpu_pooling.cpp runs average pooling on oneDNN). Own loops rather than
// oneDNN 2.6's pooling, which drops NaNs (the backend scanned x after it to keep the rule below)
// and is slower: on an AMX Xeon, ResNet-50's stem pool (batch 8, 112×112×64 bf16, 3×3 stride 2
// pad 1, operands from memory) took 2.41 ms forward without the scan and 2.96 ms backward there,
// 1.94 and 1.64 here (bench/cnn/bench_max_pool, bench/RESULTS.md, session 68).
//
// Contract
// - x, y, dy and dx are fp32 (or tf32), bf16 or fp16 storage of one dtype, checked by the caller.
//   Math in fp32: y holds stored values of x exactly; dx is its fp32 sum rounded once (RNE).
// - A window's maximum, as PyTorch's max_pool2d: the running maximum starts at the window's
//   first in-image element in row-major order (kh outer, kw inner) and is replaced by a later
//   element that is greater or is a NaN. Ties go to the first maximum; a window holding a NaN
//   gives the canonical quiet NaN (its index: the last NaN's position); a window of -inf gives
//   -inf; padding is never chosen.
// - Indices (the workspace, max_pool_workspace_bytes): per output element, the window position
//   kh·KW + kw of its maximum, dense in the output's [N, OH, OW, C] order; one byte each for
//   windows of at most 256 elements, else four (int32).
// - max_pool_forward writes y when it is not empty and the indices when `indices` is not null.
// - max_pool_backward: dx[n, ih, iw, c] = Σ dy[n, oh, ow, c] over the windows whose index points
//   at (ih, iw), added in fp32 in (oh, ow) order, so the bits do not depend on the thread count.
// - OpenMP over output rows (forward) and input rows (backward); scratch per thread: the decoded
//   input rows of one output row, or one output row of dy and one fp32 row of dx.
#pragma once

#include <cstddef>

#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

std::size_t max_pool_workspace_bytes(const sdk::Pool2dGeometry& g);
void max_pool_forward(const sdk::Pool2dGeometry& g, const sdk::TensorView& x,
                      const sdk::TensorView& y, void* indices);
void max_pool_backward(const sdk::Pool2dGeometry& g, const sdk::TensorView& dy, const void* indices,
                       const sdk::TensorView& dx);

}  // namespace mixtrain::backend_cpu
