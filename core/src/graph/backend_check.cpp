#include "graph/backend_check.h"

#include <variant>

#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/precision/planning.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

using sdk::DType;

void check_backend(const GraphPlan& plan, const Ops& ops, sdk::DeviceBackend& backend) {
  const sdk::BackendCapabilities caps = backend.capabilities();
  const std::string& kind = caps.kind;
  auto stop = [&](std::size_t i, const std::string& who, const BackendNeed& need,
                  const std::string& why) {
    const PlannedNode& node = plan.node(i);
    // The node's name as a pattern that matches only it, in TOML: names may hold glob characters.
    const std::string layers = sdk::option_value_to_string(exact_pattern(ops[i]->name()));
    if (const auto* op = std::get_if<sdk::QuantizedWeightOp>(&need.op)) {  // a quantized base
      const bool nf4 = *op == sdk::QuantizedWeightOp::dequantize_nf4;
      throw sdk::ConfigError(
          node.where, node.key,
          who + " stores its frozen weight as " +
              (nf4 ? std::string("NF4 (train.frozen_format = \"nf4\")")
                   : std::string("an FP8 block format (train.frozen_format)")) +
              " and needs " + need_op_name(need) + " on " + need_dtypes(need) +
              ", which backend '" + kind + "' does not provide: " + why,
          "set train.frozen_format = \"compute\", or use a backend that offers the "
          "quantized_weight facet (backend.type = \"cpu\"; `mixtrain plugins` lists them)");
    }
    const auto* gemm_op = std::get_if<sdk::GemmOp>(&need.op);
    if (gemm_op != nullptr && (*gemm_op == sdk::GemmOp::quantize_block_scaled ||
                               *gemm_op == sdk::GemmOp::gemm_block_scaled)) {
      // A block-scaled recipe on a backend (or device) without block-scaled GEMMs: never run
      // something else in its place; name the device and the simulator that runs the recipe.
      throw sdk::ConfigError(
          node.where, node.key,
          who + " is block-scaled by the precision policy and needs " + need_op_name(need) +
              " on " + need_dtypes(need) + ", which backend '" + kind + "' on " + caps.device_name +
              " does not provide: " + why,
          "run the recipe on the CPU backend's exact simulator (--set backend.type=cpu), keep "
          "the node out of block scaling with [[precision.override]] layers = " +
              layers + ", gemm_input = \"bf16\", or choose another precision.policy");
    }
    throw sdk::ConfigError(
        node.where, node.key,
        who + " needs " + need_op_name(need) + " on " + need_dtypes(need) + ", which backend '" +
            kind + "' does not provide: " + why,
        "override the node's precision with [[precision.override]] layers = " + layers +
            ", compute = \"fp32\" (or choose another precision.policy), or "
            "use a backend that offers it (`mixtrain plugins` lists them)");
  };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Layer& op = *ops[i];
    const auto& inputs = plan.node(i).inputs;
    const DType input =
        inputs.empty() ? plan.input().dtype : activation_dtype(plan, ops, inputs[0]);
    for (const BackendNeed& need : op.backend_needs(input))
      if (auto why = unmet(backend, need))
        stop(i, "node '" + op.name() + "' (" + op.type() + ")", need, *why);
  }
  // The loss reads the logits; several readers of one tensor accumulate their gradients in FP32.
  const BackendNeed loss{sdk::LossOp::softmax_cross_entropy, {logits_grad_dtype(plan, ops)}};
  if (auto why = unmet(backend, loss))
    stop(ops.size() - 1, "the loss on node '" + ops.back()->name() + "'", loss, *why);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const BackendNeed accumulate{sdk::ActivationOp::axpy,
                                 {contribution_dtype(ops, i), DType::fp32}};
    if (auto why = unmet(backend, accumulate))
      stop(i, "the gradient accumulation of node '" + ops[i]->name() + "'", accumulate, *why);
  }
}

}  // namespace mixtrain::core
