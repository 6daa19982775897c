// Block-scaled operands of one GEMM-like product of an op (a linear's matmul): each operand is
// quantized, in one backend call, into the layout of every pass that reads it, as the precision
// policy's block-scaling facet (policy_block_scaling.h) plans it.
//
// Contract
// - Passes and reduction dims, for y = x·Wᵀ with x [rows, in], W [out, in], dy [rows, out]:
//     input x:        forward along cols (in),   wgrad along rows (the batch);
//     weight W:       forward along cols (in),   dgrad along rows (out);
//     grad_output dy: dgrad along cols (out),    wgrad along rows (the batch).
//   Each operand is quantized twice (the second quantization of the transposed use) unless the
//   two layouts are equal and stored alike — 2-D blocks (128×128, 16×16 weights) serve both
//   passes, so the weight is quantized once where dgrad's is not stored transposed (below). Both
//   quantizations are one quantize_block_scaled call: one read of src.
// - Stochastic rounding (where the plan asks for it) draws its bits from seed(): the run's seed,
//   the slot, the pass, the optimizer step and the micro-batch, so a resumed run rounds as the
//   uninterrupted one did, and a replay of a step rounds as the step did.
// - Random Hadamard transform (BlockScalingFacet 1.1, when the policy's minor has it and turns it
//   on): the wgrad quantizations of x and dy read M·src per 16 rows (support/block_scaling.h's
//   hadamard16()), computed by the backend's strided-batched GEMM in fp32, the batch rows padded
//   with zeros to a multiple of 16; both wgrad operands are then [rows16, cols]. The signs come
//   from the run's seed, the GEMM, the optimizer step and the micro-batch: one M for both inputs
//   of a step's wgrad, and a resumed run transforms as the uninterrupted one did.
// - Storage: codes row-major as their source, except where the backend's gemm facet (1.4) says
//   quantizes_transposed(): then a pass that reduces its operand along the rows (wgrad's x and
//   dy, dgrad's W) is quantized as the operand's transpose, so a GEMM that wants the reduction dim
//   contiguous reads it in place. The numbers are the same either way (backend_gemm.h).
// - operand(role, pass, op_transpose) views the last quantization of a role for a pass that
//   quantize() covered, for a GEMM that reads op(X) = Xᵀ of the source X when op_transpose (the
//   view's `transpose` accounts for a transposed storage); valid until the next quantize() of that
//   role. Non-owning: the facet is the policy's and outlives the op.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/graph/tensor.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/policy_block_scaling.h"

namespace mixtrain::core {

class BlockQuantizer {
 public:
  BlockQuantizer(const std::string& node, const std::string& gemm);
  void set_facet(const sdk::BlockScalingFacet* facet) { facet_ = facet; }
  bool active() const { return facet_ != nullptr; }
  // Whether a quantization draws per step (stochastic rounding or the Hadamard transform's signs,
  // both keyed by the step): a recorded step graph would replay the first step's bits.
  bool varies_per_step() const;

  // Quantizes src [rows, cols] for both passes of `role` (the first only, when !both_passes: the
  // input of a frozen weight, which has no wgrad, and every operand of an evaluation). `run_seed`,
  // `step` and `draw` (the micro-batch among every data-parallel replica's, Layer::draw(); the
  // micro-batch index in one process) key stochastic rounding and the Hadamard transform's signs:
  // each rank draws its own, so N ranks quantize as one process accumulating their N micro-batches.
  void quantize(const std::shared_ptr<sdk::DeviceBackend>& backend, sdk::GemmFacet& gemm,
                sdk::TensorView src, sdk::OperandRole role, std::uint64_t run_seed,
                std::int64_t step, std::int64_t draw, bool both_passes = true);
  sdk::BlockScaledOperand operand(sdk::OperandRole role, sdk::GemmPass pass,
                                  bool op_transpose) const;

  // The seed of one quantization's stochastic rounding (`draw`: Layer::draw(), the micro-batch
  // index in one process).
  static std::uint64_t seed(std::uint64_t run_seed, const sdk::OperandSlot& slot,
                            sdk::GemmPass pass, std::int64_t step, std::int64_t draw);

 private:
  struct Buffers {
    Tensor codes, scales, tensor_scale;
    sdk::BlockScaledOperand view;
  };
  // Scratch shared by x and dy: each transform is quantized before the next one is made.
  struct Hadamard {
    Tensor matrix, padded, out;  // M [16, 16]; src padded to [rows16, cols]; M·src
    std::optional<std::uint64_t> matrix_seed;  // the signs M holds now
  };
  bool hadamard_on(sdk::OperandRole role) const;
  std::uint64_t hadamard_seed(std::uint64_t run_seed, std::int64_t step, std::int64_t draw) const;
  sdk::TensorView hadamard_rows(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                sdk::GemmFacet& gemm, sdk::TensorView src, std::uint64_t sign_seed);

  const sdk::BlockScalingFacet* facet_ = nullptr;
  std::string gemm_key_;                    // "<node>.<gemm>": keys the transform's signs
  std::vector<sdk::OperandSlot> slots_;     // per role: input, weight, grad_output
  Hadamard hadamard_;
  Buffers buffers_[3][2];                   // per role, per pass of it (first, second)
  bool shared_[3] = {false, false, false};  // the second pass reads the first's quantization
};

}  // namespace mixtrain::core
