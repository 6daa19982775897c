#include "graph/ops/operand_scaler.h"

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "graph/ops/op_support.h"
#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/sdk/backend_foreach.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {
int role_slot(sdk::OperandRole role) {
  switch (role) {
    case sdk::OperandRole::input:
      return 0;
    case sdk::OperandRole::weight:
      return 1;
    default:
      return 2;
  }
}

sdk::Shape flipped(const sdk::Shape& s) {
  return sdk::Shape{s.cols(), s.rows()};
}

// What a policy's operand_scaling() must give (sdk/precision_policy.h): the cast's target is an
// fp8 dtype, and the GEMM undoes the scale with scale_inv. Anything else would run silently in
// another dtype, or at a scale that zeroes or overflows every operand, and look like divergence.
sdk::OperandScaling checked(const sdk::OperandScaling& s, const sdk::OperandSlot& slot) {
  const bool finite =
      std::isfinite(s.scale) && s.scale > 0.0f && std::isfinite(s.scale_inv) && s.scale_inv > 0.0f;
  const bool inverse = finite && std::abs(static_cast<double>(s.scale) * s.scale_inv - 1.0) <= 1e-5;
  if (sdk::is_fp8(s.dtype) && inverse) return s;
  char values[160];
  std::snprintf(values, sizeof values, "dtype %s, scale %g, scale_inv %g",
                std::string(sdk::dtype_name(s.dtype)).c_str(), static_cast<double>(s.scale),
                static_cast<double>(s.scale_inv));
  throw sdk::PluginError(
      "the precision policy's operand_scaling() for slot '" + slot.name() + "' gave " + values +
          ": " +
          (!sdk::is_fp8(s.dtype) ? "a scaled operand is cast to fp8_e4m3 or fp8_e5m2"
           : !finite             ? "the scale and its inverse must be finite numbers above 0"
                                 : "scale_inv must be 1 / scale"),
      "fix the policy's operand_scaling() (a plugin's fault), or choose another policy");
}
}  // namespace

sdk::GemmOperand ScaledLayouts::operand(bool op_transposed, bool b_slot) const {
  // The stored layout is read with transpose = op_transposed, the transposed one with the
  // opposite; A wants the one read without, B the one read with.
  const bool stored_preferred = op_transposed == b_slot;
  if (stored.data != nullptr && (stored_preferred || transposed.data == nullptr))
    return {stored, op_transposed, scale_inv};
  return {transposed, !op_transposed, scale_inv};
}

OperandScaler::OperandScaler(const std::string& node, const std::string& gemm) {
  for (auto role :
       {sdk::OperandRole::input, sdk::OperandRole::weight, sdk::OperandRole::grad_output})
    slots_.emplace_back(node, gemm, role);
}

sdk::GemmOperand OperandScaler::last(sdk::OperandRole role, sdk::Shape shape) const {
  const ScaledOperand& c = copies_[role_slot(role)];
  return {TensorView{c.stored.view().data, c.stored.dtype(), shape}, false, c.scale_inv};
}

ScaledLayouts OperandScaler::kept(sdk::OperandRole role, sdk::Shape shape) const {
  const ScaledOperand& c = copies_[role_slot(role)];
  ScaledLayouts l;
  l.scale_inv = c.scale_inv;
  if (c.has_stored) l.stored = {c.stored.view().data, c.stored.dtype(), shape};
  if (c.has_transposed)
    l.transposed = {c.transposed.view().data, c.transposed.dtype(), flipped(shape)};
  return l;
}

bool OperandScaler::transposes(const BoundFacets& facets, DType src, DType to) {
  const sdk::GemmFacet* gemm = facets.find<sdk::GemmFacet>();
  if (gemm == nullptr || gemm->version().minor < sdk::introduced_in(sdk::GemmOp::cast_transpose))
    return false;
  const DType dtypes[2] = {src, to};
  return gemm->supports(sdk::GemmOp::cast_transpose, dtypes);
}

sdk::GemmOperand OperandScaler::scale(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                      TensorView src, sdk::OperandRole role,
                                      std::vector<Layer::ScaledOperandStats>* stats) {
  return scale_layouts(backend, BoundFacets{}, src, role, Keep::kept, Keep::no, stats)
      .operand(false, false);
}

sdk::TensorView OperandStaging::at_least(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                         std::size_t bytes) {
  if (buffer_.empty() || buffer_.view().bytes() < bytes) {
    buffer_ = Tensor();  // its memory goes back first: the new one may reuse it
    try {
      buffer_ = Tensor(backend, DType::fp8_e4m3, sdk::Shape{static_cast<std::int64_t>(bytes)});
    } catch (const sdk::BackendError& e) {
      throw sdk::BackendError(
          "the FP8 operand staging (" + std::to_string(bytes) +
              " bytes: an FP8 linear's input, or its output gradient in both layouts, for the "
              "batch) could not be allocated: " +
              e.what(),
          "lower data.batch_size, or keep the widest linears out of FP8 with a "
          "[[precision.override]] (compute = \"bf16\")" +
              (e.hint().empty() ? std::string() : "; " + e.hint()));
    }
  }
  return buffer_.view();
}

TensorView OperandScaler::place(const std::shared_ptr<sdk::DeviceBackend>& backend, Keep keep,
                                Tensor& copy, DType dtype, sdk::Shape shape, TensorView staging,
                                std::size_t* staged) {
  if (keep == Keep::kept) {
    if (copy.empty() || copy.dtype() != dtype || copy.shape().numel() < shape.numel())
      copy = Tensor(backend, dtype, shape);
    return {copy.view().data, dtype, shape};
  }
  const std::size_t at = *staged;
  const std::size_t bytes = static_cast<std::size_t>(shape.numel()) * sdk::dtype_size(dtype);
  *staged = (at + bytes + 255) / 256 * 256;  // the next layout starts aligned for any kernel
  return {static_cast<std::byte*>(staging.data) + at, dtype, shape};
}

bool OperandScaler::delayed() const {
  return policy_ != nullptr && !policy_->wants_current_amax();
}

ScaledLayouts OperandScaler::scale_layouts(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                           const BoundFacets& facets, TensorView src,
                                           sdk::OperandRole role, Keep stored, Keep transposed,
                                           std::vector<Layer::ScaledOperandStats>* stats,
                                           const GradientCast* gradient) {
  if (amax_view_.data == nullptr)
    throw std::logic_error("OperandScaler::scale: no amax table bound (Model::allocate binds it)");
  if (stored == Keep::no && transposed == Keep::no)
    throw std::logic_error("OperandScaler::scale_layouts: no layout asked for");
  const int slot = role_slot(role);
  ScaledOperand& dst = copies_[slot];
  const bool weight = role == sdk::OperandRole::weight;
  if (weight && stats == nullptr && micro_batch_ > 0 && weight_source_ == src.data &&
      weight_numel_ == src.numel() && stored != Keep::transient && transposed != Keep::transient &&
      stored == dst.asked_stored && transposed == dst.asked_transposed)
    return kept(role, src.shape);
  dst.asked_stored = stored;
  dst.asked_transposed = transposed;
  const sdk::OperandSlot& operand = slots_[static_cast<std::size_t>(slot)];
  const TensorView amax_slot{static_cast<float*>(amax_view_.data) + slot, DType::fp32,
                             sdk::Shape{1}};
  auto s = checked(policy_->operand_scaling(operand), operand);
  const DType dtype = s.dtype;  // the slot's for the whole run; only the scale moves
  if (transposed != Keep::no && !transposes(facets, src.dtype, dtype)) {
    // No cast_transpose here: the stored layout alone, kept as long as either was asked.
    ops::log_once("operand_scaler", "cast_transpose",
                  "the backend's gemm facet has no cast_transpose (1.6) for " +
                      std::string(sdk::dtype_name(src.dtype)) + " -> " +
                      std::string(sdk::dtype_name(dtype)) + " (slot '" + operand.name() +
                      "' and the FP8 operands like it): each is cast alone, and the GEMMs that "
                      "read it transposed transpose it first");
    if (transposed == Keep::kept || stored == Keep::no) stored = transposed;
    transposed = Keep::no;
  }
  // The staging for the transient layouts: each of src's numel, the second 256-byte aligned.
  TensorView staging;
  const int transients =
      (stored == Keep::transient ? 1 : 0) + (transposed == Keep::transient ? 1 : 0);
  if (transients > 0) {
    if (staging_ == nullptr)
      throw std::logic_error("OperandScaler: no staging bound (Model::allocate binds it)");
    const std::size_t bytes = static_cast<std::size_t>(src.numel()) * sdk::dtype_size(dtype);
    staging =
        staging_->at_least(backend, transients == 1 ? bytes : (bytes + 255) / 256 * 256 + bytes);
  }
  std::size_t staged = 0;
  ScaledLayouts out;
  if (stored != Keep::no)
    out.stored = place(backend, stored, dst.stored, dtype, src.shape, staging, &staged);
  if (transposed != Keep::no)
    out.transposed =
        place(backend, transposed, dst.transposed, dtype, flipped(src.shape), staging, &staged);
  const bool current = policy_->wants_current_amax();
  if (gradient != nullptr && (transposed == Keep::no || current || stats != nullptr))
    throw std::logic_error("OperandScaler: slot '" + operand.name() +
                           "' was asked to fold work into a cast that cannot (scale_layouts' "
                           "contract)");
  float measured = 0.0f;
  if (current) {
    // Current scaling: the scale comes from this very tensor, so its amax is measured (a cast at
    // scale 1 with a fused amax into memory the real cast overwrites next) and read before the
    // scale is asked for again: the one host wait this scaling needs per operand.
    const TensorView probe =
        out.stored.data != nullptr ? out.stored : TensorView{out.transposed.data, dtype, src.shape};
    backend->fill(amax_slot, 0.0f);
    sdk::CastArgs measure;
    measure.saturate = true;
    measure.amax = amax_slot;
    backend->cast(src, probe, measure);
    backend->copy_to_host(&measured, amax_slot);
    policy_->record_amax(operand, measured);
    s = checked(policy_->operand_scaling(operand), operand);
    if (s.dtype != dtype)
      throw std::logic_error("OperandScaler: the policy changed slot '" + operand.name() +
                             "''s dtype within a cast");
  }
  sdk::CastArgs args;
  args.scale = s.scale;
  args.saturate = true;
  if (!current) {
    // Delayed scaling: the amax of this cast feeds later steps' scales only, so it stays on the
    // device until flush_operand_amaxes() (after the step's found_inf read). Micro-batches after
    // the first of a step add to the same measurement: the step's amax is their maximum.
    if ((micro_batch_ == 0 || !amax_pending_[slot]) && !zeroed_[slot])
      backend->fill(amax_slot, 0.0f);
    args.amax = amax_slot;
    amax_pending_[slot] = true;
  }
  if (transposed != Keep::no) {
    // One read of src for both layouts (gemm facet 1.6), and for what it folds in (1.7).
    sdk::CastTransposeArgs both;
    both.src = src;
    both.out = out.stored;
    both.out_transposed = out.transposed;
    both.cast = args;
    if (gradient != nullptr) {
      sdk::CastTransposeGradientArgs folded;
      folded.cast = both;
      folded.column_sums = gradient->column_sums;
      folded.accumulate_column_sums = gradient->accumulate_column_sums;
      folded.has_activation_grad = !gradient->gelu_input.empty();
      folded.activation = sdk::Activation::gelu;
      folded.pre_activation = gradient->gelu_input;
      facets.call(sdk::GemmOp::cast_transpose_gradient)->cast_transpose_gradient(folded);
    } else {
      facets.call(sdk::GemmOp::cast_transpose)->cast_transpose(both);
    }
  } else {
    backend->cast(src, out.stored, args);
  }
  zeroed_[slot] = false;
  out.scale_inv = s.scale_inv;
  dst.scale_inv = s.scale_inv;
  dst.has_stored = stored == Keep::kept;
  dst.has_transposed = transposed == Keep::kept;
  if (weight) {
    weight_source_ = src.data;
    weight_numel_ = src.numel();
  }
  if (stats != nullptr) {
    float amax = measured;
    if (!current) backend->copy_to_host(&amax, amax_slot);
    const bool from_stored = out.stored.data != nullptr;
    collect_stats(backend, operand, src, from_stored ? out.stored : out.transposed, !from_stored, s,
                  amax, *stats);
  }
  return out;
}

std::optional<OperandScaler::Counts> OperandScaler::count_on_device(sdk::DeviceBackend& backend,
                                                                    TensorView v,
                                                                    const sdk::OperandScaling& s) {
  // The backend's tally (gradient_check 1.2) over x = v * scale, computed as the cast computes it
  // (the foreach facet's fp32 multiply): no operand crosses to the host. A code is 0 exactly when
  // |x| is at most the format's underflow_threshold (round to nearest even, as the cast rounds),
  // or when x itself is 0 though v is not (the product underflowed fp32).
  using sdk::GradientCheckOp;
  if (unmet(backend, {GradientCheckOp::count_underflow, {DType::fp32}}) ||
      unmet(backend, {sdk::ForeachOp::foreach_mul_scalar, {DType::fp32}}))
    return std::nullopt;
  auto* tally = sdk::facet<sdk::GradientCheckFacet>(backend);
  auto* multiply = sdk::facet<sdk::ForeachFacet>(backend);
  const std::int64_t nonzero = tally->count_underflow(v, 0.0f).nonzero;
  const TensorView x[] = {v};
  multiply->foreach_mul_scalar(x, s.scale);
  const sdk::UnderflowTally scaled = tally->count_underflow(v, underflow_threshold(s.dtype));
  // Saturation is a magnitude past the largest finite value as rounding takes it (e4m3: above
  // 464; e5m2: from 61440), counted below the finite limit: an infinity or a NaN among the x,
  // which the tally cannot tell apart, leaves the count to the host.
  const float finite_limit = std::numeric_limits<float>::max();
  if (tally->count_underflow(v, finite_limit).flushed != scaled.nonzero) return std::nullopt;
  const float kept_limit = s.dtype == DType::fp8_e5m2 ? std::nextafter(61440.0f, 0.0f) : 464.0f;
  const std::int64_t kept = tally->count_underflow(v, kept_limit).flushed;
  return Counts{nonzero, scaled.nonzero - kept, scaled.flushed + (nonzero - scaled.nonzero)};
}

void OperandScaler::collect_stats(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                  const sdk::OperandSlot& operand, TensorView src, TensorView codes,
                                  bool codes_transposed, const sdk::OperandScaling& s, float amax,
                                  std::vector<Layer::ScaledOperandStats>& stats) const {
  // Diagnostics only: what saturated and what flushed to zero in this cast.
  Tensor tmp(backend, DType::fp32, src.shape);
  const TensorView as_fp32{tmp.view().data, DType::fp32, src.shape};
  backend->cast(src, as_fp32);
  if (auto counted = count_on_device(*backend, as_fp32, s)) {
    stats.push_back({operand.name(), s.dtype, amax, s.scale, src.numel(), counted->saturated,
                     counted->underflowed, counted->nonzero});
    return;
  }
  // On the host, from the codes the cast wrote (v again: the device's count may have scaled it).
  backend->cast(src, as_fp32);
  std::vector<float> in(static_cast<std::size_t>(src.numel())), back(in.size());
  backend->copy_to_host(in.data(), as_fp32);
  backend->cast(codes, TensorView{tmp.view().data, DType::fp32, codes.shape});
  backend->copy_to_host(back.data(), as_fp32);
  const std::int64_t rows = src.shape.rows(), cols = src.shape.cols();
  // Saturated: what round-to-nearest-even takes past the largest finite value, not merely above
  // it. E4M3: above 464, the midpoint to the next step (a tie rounds to 448's even mantissa).
  // E5M2: from 61440 on (its tie rounds up, to 2^16 = inf).
  const bool e5m2 = s.dtype == DType::fp8_e5m2;
  const auto saturates = [e5m2](float a) { return e5m2 ? a >= 61440.0f : a > 464.0f; };
  Layer::ScaledOperandStats st{operand.name(), s.dtype, amax, s.scale, src.numel(), 0, 0, 0};
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = in[static_cast<std::size_t>(r * cols + c)];
      if (v == 0.0f) continue;
      ++st.nonzero;
      if (saturates(std::abs(v * s.scale))) ++st.saturated;
      const std::int64_t at = codes_transposed ? c * rows + r : r * cols + c;
      if (back[static_cast<std::size_t>(at)] == 0.0f) ++st.underflowed;
    }
  stats.push_back(st);
}

void OperandScaler::bind_amaxes(TensorView three) {
  if (three.numel() != 3 || three.dtype != DType::fp32)
    throw std::logic_error("OperandScaler::bind_amaxes: needs an fp32 [3] view");
  amax_view_ = three;
  for (bool& p : amax_pending_) p = false;  // the table starts at zero
}

void OperandScaler::pending_amaxes(const float* host, std::vector<float>& out) const {
  if (policy_ == nullptr) return;
  for (int i = 0; i < 3; ++i)
    if (amax_pending_[i]) out.push_back(host[i]);
}

std::size_t OperandScaler::record_amaxes(std::span<const float> values) {
  weight_source_ = nullptr;  // the step's casts are done: the optimizer may change the weights
  if (policy_ == nullptr) return 0;
  std::size_t taken = 0;
  for (int i = 0; i < 3; ++i) {
    if (!amax_pending_[i]) continue;
    amax_pending_[i] = false;
    policy_->record_amax(slots_[static_cast<std::size_t>(i)], values[taken++]);
  }
  return taken;
}

}  // namespace mixtrain::core
