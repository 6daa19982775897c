#include "graph/ops/operand_scaler.h"

#include <cmath>
#include <stdexcept>

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
}  // namespace

OperandScaler::OperandScaler(const std::string& node, const std::string& gemm) {
  for (auto role :
       {sdk::OperandRole::input, sdk::OperandRole::weight, sdk::OperandRole::grad_output})
    slots_.emplace_back(node, gemm, role);
}

sdk::GemmOperand OperandScaler::last(sdk::OperandRole role, sdk::Shape shape) const {
  const ScaledOperand& c = copies_[role_slot(role)];
  return {TensorView{c.data.view().data, c.data.dtype(), shape}, false, c.scale_inv};
}

sdk::GemmOperand OperandScaler::scale(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                      TensorView src, sdk::OperandRole role,
                                      std::vector<Layer::ScaledOperandStats>* stats) {
  if (amax_view_.data == nullptr)
    throw std::logic_error("OperandScaler::scale: no amax table bound (Model::allocate binds it)");
  const int slot = role_slot(role);
  ScaledOperand& dst = copies_[slot];
  const bool weight = role == sdk::OperandRole::weight;
  if (weight && stats == nullptr && micro_batch_ > 0 && weight_source_ == src.data &&
      weight_numel_ == src.numel())
    return {TensorView{dst.data.view().data, dst.data.dtype(), src.shape}, false, dst.scale_inv};
  const sdk::OperandSlot& operand = slots_[static_cast<std::size_t>(slot)];
  const TensorView amax_slot{static_cast<float*>(amax_view_.data) + slot, DType::fp32,
                             sdk::Shape{1}};
  const bool current = policy_->wants_current_amax();
  float measured = 0.0f;
  if (current) {
    // Current scaling: the scale comes from this very tensor, so its amax is measured (a cast at
    // scale 1 with a fused amax into the scratch the real cast overwrites next) and read before
    // the scale is asked for: the one host wait this scaling needs per operand.
    auto probe = policy_->operand_scaling(operand);
    if (dst.data.empty() || dst.data.dtype() != probe.dtype ||
        dst.data.shape().numel() < src.numel())
      dst.data = Tensor(backend, probe.dtype, src.shape);
    backend->fill(amax_slot, 0.0f);
    sdk::CastArgs measure;
    measure.saturate = true;
    measure.amax = amax_slot;
    backend->cast(src, TensorView{dst.data.view().data, probe.dtype, src.shape}, measure);
    backend->copy_to_host(&measured, amax_slot);
    policy_->record_amax(operand, measured);
  }
  const auto s = policy_->operand_scaling(operand);
  if (dst.data.empty() || dst.data.dtype() != s.dtype || dst.data.shape().numel() < src.numel())
    dst.data = Tensor(backend, s.dtype, src.shape);
  TensorView out{dst.data.view().data, s.dtype, src.shape};
  sdk::CastArgs args;
  args.scale = s.scale;
  args.saturate = true;
  if (!current) {
    // Delayed scaling: the amax of this cast feeds later steps' scales only, so it stays on the
    // device until flush_operand_amaxes() (after the step's found_inf read). Micro-batches after
    // the first of a step add to the same measurement: the step's amax is their maximum.
    if (micro_batch_ == 0 || !amax_pending_[slot]) backend->fill(amax_slot, 0.0f);
    args.amax = amax_slot;
    amax_pending_[slot] = true;
  }
  backend->cast(src, out, args);
  dst.scale_inv = s.scale_inv;
  if (weight) {
    weight_source_ = src.data;
    weight_numel_ = src.numel();
  }
  if (stats != nullptr) {
    // Diagnostics only: what saturated and what flushed to zero in this cast.
    float amax = measured;
    if (!current) backend->copy_to_host(&amax, amax_slot);
    std::vector<float> in(static_cast<std::size_t>(src.numel())), back(in.size());
    TensorView as_fp32{nullptr, DType::fp32, src.shape};
    Tensor tmp(backend, DType::fp32, src.shape);
    as_fp32.data = tmp.view().data;
    backend->cast(src, as_fp32);
    backend->copy_to_host(in.data(), as_fp32);
    backend->cast(out, as_fp32);
    backend->copy_to_host(back.data(), as_fp32);
    const float max_finite = s.dtype == DType::fp8_e5m2 ? 57344.0f : 448.0f;
    Layer::ScaledOperandStats st{operand.name(), s.dtype, amax, s.scale, src.numel(), 0, 0, 0};
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (in[i] == 0.0f) continue;
      ++st.nonzero;
      if (std::abs(in[i] * s.scale) > max_finite) ++st.saturated;
      if (back[i] == 0.0f) ++st.underflowed;
    }
    stats->push_back(st);
  }
  return {out, false, s.scale_inv};
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
