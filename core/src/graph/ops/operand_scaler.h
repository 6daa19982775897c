// FP8 operand scaling for one GEMM-like product of an op (a linear's matmul, a convolution): each
// operand is cast to the dtype and scale its slot "<node>.<gemm>.<role>" gets from the precision
// policy, with saturation and a fused amax that goes back to the policy.
//
// Contract
// - Delayed scaling: the amax of each cast stays on the device until the model reads every
//   scaler's at once (Model::flush_operand_amaxes, after the step's found_inf read: one host wait
//   per step, whatever the number of FP8 layers), maxed over the micro-batches of one optimizer
//   step. The amaxes live in the model's table (bind_amaxes, which Model::allocate calls before
//   any cast). A cast that starts a slot's measurement zeroes the slot first, unless the model
//   zeroed the whole table since the slot's last cast (table_zeroed(): one fill per step instead
//   of one per cast).
// - Current scaling: the amax is measured and read before the scale is asked for (one host wait
//   per operand).
// - Layouts (scale_layouts): a cast may write the operand as stored [rows, cols] and its
//   transpose [cols, rows], from one read of the source, where the backend's gemm facet has
//   cast_transpose (1.6) for {the source's dtype, the slot's FP8 dtype}. Elsewhere it writes the
//   stored layout alone, kept as long as the longer of the two asked for, and a GEMM that wants
//   the transpose makes it itself; the first such cast logs that once. Each layout is either kept
//   (this scaler's own copy of the role, until the role is cast again: kept() views it) or
//   transient (the model's one staging buffer, shared by every scaler: valid only until the next
//   transient cast of any of them, i.e. for the GEMMs that follow the cast directly). A linear
//   keeps only xᵀ for its wgrad and stages x for its forward GEMM, as Transformer Engine does, and
//   stages both of dy's layouts; it keeps W and Wᵀ (1 byte per FP8 weight element more than one
//   layout, against rows·out bytes per linear no longer kept for dy).
// - A gradient's cast may fold in work that reads the same tensor (GradientCast: its column sums,
//   a linear's bias gradient; gelu's gradient, so that what is cast is dz = dy·gelu'(z)), through
//   the gemm facet's cast_transpose_gradient (1.7). The caller asks only where that op runs for
//   the gradient's dtype, the transpose is asked for, scaling is delayed (delayed(): a current
//   amax would have to be measured on dz) and no statistics are collected; elsewhere it is a
//   logic error.
// - scale() and last() are the stored layout alone, kept (a convolution's operands).
// - A weight is cast once per optimizer step: the micro-batches after the first (index > 0 since
//   begin_micro_batch(0)) reuse the kept layouts of the same source tensor as they are, scale and
//   amax included, since neither the weight nor its scale changes within a step (Transformer
//   Engine keeps a weight's FP8 copy across micro-batches likewise), unless a layout is asked for
//   that the first cast did not keep. record_amaxes(), once per step before the optimizer runs,
//   ends that reuse. Asking for statistics casts anew. `stats`, when given, receives what the
//   cast saturated and flushed to zero (diagnostics; reads the tensors back).
// - Staging: Model::allocate binds one OperandStaging to every scaler (bind_staging); it grows to
//   the largest transient request of the first step and stays there. Out of memory while it grows,
//   the BackendError names it, its bytes and how to need less.
// - Non-owning: the policy outlives the op; the backend is the op's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/tensor.h"

namespace mixtrain::core {

// The model's one buffer for every scaler's transient layouts: grown to the largest request so
// far, its old contents dropped (they were an earlier cast's, which only GEMMs already queued on
// the backend's stream read).
class OperandStaging {
 public:
  sdk::TensorView at_least(const std::shared_ptr<sdk::DeviceBackend>& backend, std::size_t bytes);

 private:
  Tensor buffer_;
};

// What a gradient's cast folds in (see the contract above): the column sums of what it casts into
// column_sums (fp32 [cols]; accumulated or overwritten), and with gelu_input (gelu's input z,
// [rows, cols] of the gradient's dtype) the gelu's gradient first.
struct GradientCast {
  sdk::TensorView column_sums;
  bool accumulate_column_sums = false;
  sdk::TensorView gelu_input;
};

// Where OperandScaler::scale_layouts writes one layout of a cast (see the contract above).
enum class Keep : std::uint8_t { no, transient, kept };

// One FP8 operand in the layouts a cast wrote: `stored` as its source [rows, cols], `transposed`
// its transpose [cols, rows]; a layout not written has a view without data. One scale for both.
struct ScaledLayouts {
  sdk::TensorView stored, transposed;
  float scale_inv = 1.0f;
  // The GEMM operand whose op() is this operand's matrix M (Mᵀ when `op_transposed`), for the
  // GEMM's A (`b_slot` false) or B. Where both layouts exist it takes the one whose reduction dim
  // is contiguous, as FP8 Tensor Cores read it (sdk/backend_gemm.h 1.6): A read without a
  // transpose, B read with one.
  sdk::GemmOperand operand(bool op_transposed, bool b_slot) const;
};

class OperandScaler {
 public:
  OperandScaler(const std::string& node, const std::string& gemm);
  void set_policy(sdk::PrecisionPolicy* policy) { policy_ = policy; }
  bool active() const { return policy_ != nullptr; }
  // Delayed scaling: a cast's amax feeds later steps' scales only (see the contract above).
  bool delayed() const;
  void begin_micro_batch(std::int64_t index) {
    micro_batch_ = index;
    if (index == 0) weight_source_ = nullptr;  // a new step: the weights may have changed
  }

  // The stored layout, kept: scale_layouts(..., Keep::kept, Keep::no).operand(false, false).
  sdk::GemmOperand scale(const std::shared_ptr<sdk::DeviceBackend>& backend, sdk::TensorView src,
                         sdk::OperandRole role,
                         std::vector<Layer::ScaledOperandStats>* stats = nullptr);
  // The last kept stored copy of `role`, seen as `shape`.
  sdk::GemmOperand last(sdk::OperandRole role, sdk::Shape shape) const;

  // Casts src (its leading dims folded into rows) into the layouts asked for (at least one), the
  // transposed one through `facets`' cast_transpose where it runs (see the contract above).
  // `gradient` (nullable): what the cast folds in, under the conditions above.
  ScaledLayouts scale_layouts(const std::shared_ptr<sdk::DeviceBackend>& backend,
                              const BoundFacets& facets, sdk::TensorView src, sdk::OperandRole role,
                              Keep stored, Keep transposed,
                              std::vector<Layer::ScaledOperandStats>* stats = nullptr,
                              const GradientCast* gradient = nullptr);
  // The kept layouts of role's last cast, the stored one seen as `shape` ([rows, cols]) and the
  // transposed one as [cols, rows]; a layout that cast did not keep has a view without data.
  ScaledLayouts kept(sdk::OperandRole role, sdk::Shape shape) const;

  void bind_staging(OperandStaging* staging) { staging_ = staging; }
  // Delayed scaling, after the step's casts: the device slot of the three amaxes (input,
  // weight, grad_output; fp32 [3]) in the model's table, bound once the model has allocated it.
  void bind_amaxes(sdk::TensorView three);
  // The model has just set the whole table to zero (its first micro-batch of a step).
  void table_zeroed() {
    for (bool& z : zeroed_) z = true;
  }
  sdk::TensorView amaxes() const { return amax_view_; }
  bool amaxes_pending() const { return amax_pending_[0] || amax_pending_[1] || amax_pending_[2]; }
  // Appends the pending ones of `host` (the three as read from amaxes()) to `out`, in role order;
  // record_amaxes then hands as many of `values` to the policy, in the same order (between the
  // two a reduction may change them: data parallel, the max over the ranks), and returns how
  // many it took. Called on every scaler once per step, pending or not: it ends the step's
  // weight-copy reuse.
  void pending_amaxes(const float* host, std::vector<float>& out) const;
  std::size_t record_amaxes(std::span<const float> values);

 private:
  // A role's kept copies: the stored layout and the transposed one, each allocated when first
  // kept; `has_*`: whether the last cast of the role kept that layout.
  struct ScaledOperand {
    Tensor stored, transposed;
    bool has_stored = false, has_transposed = false;
    float scale_inv = 1.0f;
    Keep asked_stored = Keep::no, asked_transposed = Keep::no;  // the last cast's request
  };
  // Whether `facets` has a gemm facet whose cast_transpose (1.6) runs {src, to}.
  static bool transposes(const BoundFacets& facets, sdk::DType src, sdk::DType to);
  // The memory of one layout of `dtype` codes: a kept copy (grown as needed) or `staging` at
  // `*staged` bytes (advanced past it, 256-byte aligned).
  static sdk::TensorView place(const std::shared_ptr<sdk::DeviceBackend>& backend, Keep keep,
                               Tensor& copy, sdk::DType dtype, sdk::Shape shape,
                               sdk::TensorView staging, std::size_t* staged);
  // A cast's statistics counted by the backend where `v` (the source in fp32, overwritten with
  // v * scale) lies; nullopt where the backend lacks the tally or the foreach multiply, or the
  // scaled values hold an infinity or NaN: the host counts then.
  struct Counts {
    std::int64_t nonzero = 0, saturated = 0, underflowed = 0;
  };
  static std::optional<Counts> count_on_device(sdk::DeviceBackend& backend, sdk::TensorView v,
                                               const sdk::OperandScaling& s);
  void collect_stats(const std::shared_ptr<sdk::DeviceBackend>& backend,
                     const sdk::OperandSlot& operand, sdk::TensorView src, sdk::TensorView codes,
                     bool codes_transposed, const sdk::OperandScaling& s, float amax,
                     std::vector<Layer::ScaledOperandStats>& stats) const;

  sdk::PrecisionPolicy* policy_ = nullptr;
  std::vector<sdk::OperandSlot> slots_;  // per role: input, weight, grad_output
  ScaledOperand copies_[3];
  OperandStaging* staging_ = nullptr;  // the model's, bound by Model::allocate
  sdk::TensorView amax_view_;  // fp32 [3] in the model's table: the last cast's amax per role
  bool amax_pending_[3] = {false, false, false};
  bool zeroed_[3] = {false, false, false};  // the slot is 0 from table_zeroed(), not cast since
  std::int64_t micro_batch_ = 0;
  // The weight this step's copy was cast from (its data and size); null: none cast this step.
  const void* weight_source_ = nullptr;
  std::int64_t weight_numel_ = 0;
};

}  // namespace mixtrain::core
