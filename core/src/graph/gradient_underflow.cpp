// measure_gradient_underflow: an all-FP32 replay of the backward; see diagnostics.h.
#include "mixtrain/core/graph/diagnostics.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <map>

#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/graph/memory_plan.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

namespace {

bool flushes_to_zero(float v, DType dt) {
  switch (dt) {
    case DType::fp16:
      return sdk::decode_fp16(sdk::encode_fp16(v)) == 0.0f;
    case DType::bf16:
      return sdk::decode_bf16(sdk::encode_bf16(v)) == 0.0f;
    case DType::fp8_e4m3:
      return sdk::decode_fp8_e4m3(sdk::encode_fp8_e4m3(v, sdk::Overflow::saturate)) == 0.0f;
    case DType::fp8_e5m2:
      return sdk::decode_fp8_e5m2(sdk::encode_fp8_e5m2(v, sdk::Overflow::saturate)) == 0.0f;
    default:
      return false;
  }
}

// Every op's scratch is the pass's while it lives (Layer::set_pass_scratch), and freed after.
class PassScratch {
 public:
  explicit PassScratch(const std::vector<std::unique_ptr<Layer>>& ops) : ops_(ops) {
    for (const auto& op : ops_) op->set_pass_scratch(true);
  }
  ~PassScratch() {
    for (const auto& op : ops_) {
      op->release_pass_scratch();
      op->set_pass_scratch(false);
    }
  }
  PassScratch(const PassScratch&) = delete;
  PassScratch& operator=(const PassScratch&) = delete;

 private:
  const std::vector<std::unique_ptr<Layer>>& ops_;
};

}  // namespace

float underflow_threshold(DType dt) {
  // Positive floats order as their bit patterns, and rounding to a narrower format is monotone in
  // the magnitude: bisect between 0 (stored as zero) and infinity (not).
  std::uint32_t zero = 0, kept = 0x7f800000u;
  while (kept - zero > 1) {
    const std::uint32_t mid = zero + (kept - zero) / 2;
    (flushes_to_zero(std::bit_cast<float>(mid), dt) ? zero : kept) = mid;
  }
  return std::bit_cast<float>(zero);
}

std::vector<UnderflowCount> measure_gradient_underflow(Model& model, std::int64_t rows,
                                                       float grad_scale) {
  std::vector<UnderflowCount> out;
  std::vector<float> host;
  sdk::DeviceBackend& backend = model.backend();
  // The pass reads every activation gradient of the step, billions of values at a large input:
  // the backend tallies them where they are (gradient_check 1.2), else the host does, a compare
  // a value rather than an encode and a decode.
  auto* tally = unmet(backend, {sdk::GradientCheckOp::count_underflow, {DType::fp32}})
                    ? nullptr
                    : sdk::facet<sdk::GradientCheckFacet>(backend);
  std::map<DType, float> thresholds;
  auto count = [&](const std::string& name, TensorView v, DType stored_as) {
    auto [at, added] = thresholds.try_emplace(stored_as, 0.0f);
    if (added) at->second = underflow_threshold(stored_as);
    const float threshold = at->second;
    if (tally != nullptr) {
      const sdk::UnderflowTally t = tally->count_underflow(v, threshold);
      out.push_back({name, stored_as, t.nonzero, t.flushed});
      return;
    }
    host.resize(static_cast<std::size_t>(v.numel()));
    backend.copy_to_host(host.data(), v);
    std::int64_t nonzero = 0, flushed = 0;
    for (const float g : host) {
      nonzero += g != 0.0f;                                  // NaN counts, as a value kept
      flushed += (g != 0.0f) & (std::fabs(g) <= threshold);  // NaN compares false
    }
    out.push_back({name, stored_as, nonzero, flushed});
  };
  Executor& exec = model.executor();
  const GraphPlan& plan = model.plan();
  const auto& ops = model.layers();
  // Every gradient in FP32 for this pass, counted against the dtype the plan stores it in. The
  // pass's parameter gradients are discarded: the step's real backward overwrites them. Each op
  // casts its FP32 gradient into its own dtype: those casts are freed as its backward ends, so
  // the pass holds one op's at a time, not every op's for the rest of the run.
  PassScratch pass(ops);
  Tensor storage;
  const GradientBuffers fp32 = exec.fp32_gradients(storage);
  exec.start_gradients();
  const Extent e = Extent::batch_of(rows);
  exec.compute_loss(rows, grad_scale, model.label_smoothing(), fp32);
  // The chunked loss keeps no whole logits gradient, and its blocks are in their stored dtype:
  // there is no FP32 one to count.
  if (exec.loss_chunking().rows == 0)
    count("logits gradient", exec.gradient(plan.logits(), e, fp32), logits_grad_dtype(plan, ops));
  exec.backward(e, fp32, /*last_micro_batch=*/false,
                [&](std::size_t i, std::span<const TensorView> dxs) {
                  for (const TensorView& dx : dxs)
                    if (!dx.empty())
                      count(ops[i]->name() + " input gradient", dx, contribution_dtype(ops, i));
                  ops[i]->release_pass_scratch();
                  return true;
                });
  exec.start_gradients();
  return out;
}

}  // namespace mixtrain::core
