// measure_gradient_underflow: an all-FP32 replay of the backward; see diagnostics.h.
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/memory_plan.h"
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

}  // namespace

std::vector<UnderflowCount> measure_gradient_underflow(Model& model, std::int64_t rows,
                                                       float grad_scale) {
  std::vector<UnderflowCount> out;
  std::vector<float> host;
  sdk::DeviceBackend& backend = model.backend();
  auto count = [&](const std::string& name, TensorView v, DType stored_as) {
    UnderflowCount c{name, stored_as, 0, 0};
    host.resize(static_cast<std::size_t>(v.numel()));
    backend.copy_to_host(host.data(), v);
    for (float g : host) {
      if (g == 0.0f) continue;
      ++c.nonzero;
      if (flushes_to_zero(g, stored_as)) ++c.flushed;
    }
    out.push_back(c);
  };
  Executor& exec = model.executor();
  const GraphPlan& plan = model.plan();
  const auto& ops = model.layers();
  // Every gradient in FP32 for this pass, counted against the dtype the plan stores it in. The
  // pass's parameter gradients are discarded: the step's real backward overwrites them.
  Tensor storage;
  const GradientBuffers fp32 = exec.fp32_gradients(storage);
  exec.start_gradients();
  const Extent e = Extent::batch_of(rows);
  exec.compute_loss(rows, grad_scale, model.label_smoothing(), fp32);
  count("logits gradient", exec.gradient(plan.logits(), e, fp32), logits_grad_dtype(plan, ops));
  exec.backward(e, fp32, /*last_micro_batch=*/false,
                [&](std::size_t i, std::span<const TensorView> dxs) {
                  for (const TensorView& dx : dxs)
                    if (!dx.empty())
                      count(ops[i]->name() + " input gradient", dx, contribution_dtype(ops, i));
                  return true;
                });
  exec.start_gradients();
  return out;
}

}  // namespace mixtrain::core
