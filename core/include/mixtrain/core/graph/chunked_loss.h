// The chunked loss: the logits node (a language model's LM head) and the softmax cross-entropy
// computed a block of rows at a time, so that the [rows, classes] logits and their gradient never
// exist whole. At GPT-2's shape (8 × 1024 tokens, 50257 classes) they are 1.6 GB in bf16 and
// take the most memory of any tensor in the step; a block of 1024 rows takes 1/8 of it.
//
// Contract
// - For the logits node `head` (Layer::row_block_refusal() empty) over R rows (the batch's
//   samples × positions) in blocks of at most blocks.rows rows, in order: z_b = head.forward_rows
//   (x_b) into blocks.logits; the loss facet on z_b and labels_b; with a gradient, dz_b into
//   blocks.logits_grad scaled by grad_scale·|b|/R (so each block's gradient is its rows' share of
//   the mean over all R), then head.backward(x_b, dz_b, dx_b): dx's rows of the block, and the
//   block's parameter gradients added by take_grad_beta() (the first block of a step overwrites).
// - loss (fp32 [1]) = Σ_b (|b|/R)·loss_b, summed on the device in block order; correct: each
//   block's count in correct_parts (int32, one per block), which the caller sums.
// - Against the whole-batch loss, only roundings differ: the mean is a weighted sum of block means
//   and each dz carries grad_scale·|b|/R/|b| (a few ulps in FP32). The same blocks give the same
//   bits run to run.
// - visit (optional) sees each block's logits, then its gradient (with_grad), with the block's
//   first row, and stops the pass by returning false (the non-finite replay).
// - Padded classes (Layer::set_loss_block_padding): the blocks are [rows, loss_block_columns()],
//   the extra columns at the logits dtype's lowest finite value: probability 0, gradient 0, never
//   the argmax, so the loss, the correct counts and every gradient are the unpadded ones (the
//   sums over a row differ in order only). head.begin_loss_blocks() and end_loss_blocks() bracket
//   the blocks, also when visit stops the pass. Label smoothing with padded classes is a
//   logic_error (Model never pads then).
// - Returns how many blocks ran. Errors are the facets' (BackendError).
#pragma once

#include <cstdint>
#include <functional>

#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

// The memory of the blocks: each [rows, classes] for the largest block.
struct LossBlockMemory {
  std::int64_t rows = 0;
  sdk::TensorView logits, logits_grad;  // [rows, classes]: the logits' and their gradient's dtype
  sdk::TensorView loss_parts;           // fp32 [max blocks]
  sdk::TensorView correct_parts;        // int32 [max blocks]
};

struct LossBlockPass {
  sdk::TensorView x;       // the head's input [R, in]
  sdk::TensorView labels;  // int32 [R]
  sdk::TensorView dx;      // [R, in]: the head's input gradient; empty without a gradient or need
  float grad_scale = 1.0f;
  float label_smoothing = 0.0f;
  bool with_grad = false;
};

enum class LossBlockPart { logits, logits_grad };
using LossBlockVisitor =
    std::function<bool(LossBlockPart part, std::int64_t first_row, sdk::TensorView block)>;

std::int64_t compute_loss_in_blocks(Layer& head, sdk::DeviceBackend& backend,
                                    const BoundFacets& facets, const LossBlockMemory& blocks,
                                    const LossBlockPass& pass, sdk::TensorView loss,
                                    const LossBlockVisitor& visit = {});

}  // namespace mixtrain::core
