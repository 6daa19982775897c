#include "mixtrain/core/precision/planning.h"

#include <fnmatch.h>

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "console/short_list.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::core {

namespace {
// A pattern with fnmatch wildcards matches by shape; one without names a node exactly. A
// wildcard after a backslash is the character itself (exact_pattern()).
bool is_glob(const std::string& pattern) {
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      ++i;
      continue;
    }
    if (pattern[i] == '*' || pattern[i] == '?' || pattern[i] == '[') return true;
  }
  return false;
}

std::string dtypes_of(const sdk::OpPrecision& p) {
  return "weight " + std::string(sdk::dtype_name(p.weight)) + ", gemm_input " +
         std::string(sdk::dtype_name(p.gemm_input)) + ", activation " +
         std::string(sdk::dtype_name(p.activation)) + ", activation_grad " +
         std::string(sdk::dtype_name(p.activation_grad));
}

// " fc2 forward in=48 by 128, dgrad out=10 by 128" for the weight GEMMs of `op` whose forward
// (over in) or dgrad (over out, when the op computes its input's gradient) reduction dim the
// policy's blocks do not divide; "" otherwise.
std::string padded_reductions(const sdk::OpDescription& op, const sdk::BlockScalingFacet& blocks,
                              bool dgrad) {
  std::string out;
  for (const auto& gemm : op.gemms) {
    if (!gemm.reads_weight()) continue;
    const struct {
      sdk::OperandRole role;
      sdk::GemmPass pass;
      const char* dim;
      std::int64_t k;
    } uses[] = {{sdk::OperandRole::input, sdk::GemmPass::forward, "in", op.in_features},
                {sdk::OperandRole::grad_output, sdk::GemmPass::dgrad, "out", op.out_features}};
    std::string these;
    for (const auto& u : uses) {
      if (u.pass == sdk::GemmPass::dgrad && !dgrad) continue;
      const sdk::OperandSlot slot(op.name, gemm.name, u.role);
      const std::int64_t block =
          blocks.operand_plan(slot, u.pass, sdk::ReductionAxis::cols).layout.block_cols;
      if (block > 1 && u.k % block != 0)
        these += std::string(these.empty() ? " " : ", ") +
                 std::string(sdk::gemm_pass_name(u.pass)) + " " + u.dim + "=" +
                 std::to_string(u.k) + " by " + std::to_string(block);
    }
    if (!these.empty())
      out += std::string(out.empty() ? " " : "; ") + op.name +
             (op.gemms.size() > 1 ? "." + gemm.name : "") + these;
  }
  return out;
}

// Refuses a block-scaled node whose planned layouts the backend's device does not run (gemm facet
// 1.3's block_layout_refusal: the backend's reason names the device or library), as a ConfigError
// at the node. A backend without the 1.2 ops, or of an older minor, is left to check_backend
// (supports() and the facet's version).
void check_block_layouts(Model& model, std::size_t i, const sdk::BlockScalingFacet& blocks,
                         bool dgrad) {
  sdk::Facet* found = model.backend().find_facet(sdk::GemmFacet::kName);
  if (found == nullptr || found->name() != sdk::GemmFacet::kName) return;
  const sdk::FacetVersion v = found->version();
  if (v.major != sdk::GemmFacet::kVersion.major || v.minor < 3) return;
  const auto& gemm = static_cast<const sdk::GemmFacet&>(*found);
  const Layer& layer = *model.layers()[i];
  const sdk::OpDescription op = layer.description();
  const struct {
    sdk::OperandRole role;
    sdk::GemmPass pass;
    sdk::ReductionAxis axis;
  } uses[] = {{sdk::OperandRole::input, sdk::GemmPass::forward, sdk::ReductionAxis::cols},
              {sdk::OperandRole::weight, sdk::GemmPass::forward, sdk::ReductionAxis::cols},
              {sdk::OperandRole::grad_output, sdk::GemmPass::wgrad, sdk::ReductionAxis::rows},
              {sdk::OperandRole::input, sdk::GemmPass::wgrad, sdk::ReductionAxis::rows},
              {sdk::OperandRole::grad_output, sdk::GemmPass::dgrad, sdk::ReductionAxis::cols},
              {sdk::OperandRole::weight, sdk::GemmPass::dgrad, sdk::ReductionAxis::rows}};
  for (const auto& g : op.gemms) {
    if (!g.reads_weight()) continue;
    for (const auto& u : uses) {
      if (u.pass == sdk::GemmPass::dgrad && !dgrad) continue;
      const sdk::OperandSlot slot(op.name, g.name, u.role);
      const sdk::BlockScaledLayout layout = blocks.operand_plan(slot, u.pass, u.axis).layout;
      const std::string why = gemm.block_layout_refusal(layout);
      if (why.empty()) continue;
      const PlannedNode& node = model.plan().node(i);
      throw sdk::ConfigError(
          node.where, node.key,
          "node '" + layer.name() + "' (" + layer.type() + "): the precision policy block-scales " +
              slot.name() + " in " + std::string(sdk::gemm_pass_name(u.pass)) + " as " +
              sdk::describe(layout) + ", which backend '" + model.backend().capabilities().kind +
              "' does not run here: " + why,
          "run this policy on the CPU backend's exact simulator (--set backend.type=cpu), or "
          "choose a precision.policy this device runs natively");
    }
  }
}

// Stored tensors (a weight's working copy, which the optimizer refreshes from the master; an
// activation and its gradient, which GEMMs and kernels write) are fp32, tf32, bf16 or fp16: fp8
// is a GEMM operand dtype (gemm_input), cast with the policy's scale just before the GEMM reads
// it. unstorable() gives the first stored role of a plan outside those, with its dtype.
struct StoredRole {
  const char* role;  // "weight", "activation", "activation_grad"
  sdk::DType dtype;
  // "weight is fp8_e4m3, but stored tensors are ...": why the plan cannot be.
  std::string why() const {
    return std::string(role) + " is " + std::string(sdk::dtype_name(dtype)) +
           ", but stored tensors are fp32, tf32, bf16 or fp16" +
           (sdk::is_fp8(dtype)
                ? " (fp8 is a GEMM operand dtype: gemm_input, which the policy scales)"
                : "");
  }
};

std::optional<StoredRole> unstorable(const sdk::OpPrecision& p) {
  for (const StoredRole r : {StoredRole{"weight", p.weight}, StoredRole{"activation", p.activation},
                             StoredRole{"activation_grad", p.activation_grad}})
    if (r.dtype != sdk::DType::fp32 && r.dtype != sdk::DType::tf32 && r.dtype != sdk::DType::bf16 &&
        r.dtype != sdk::DType::fp16)
      return r;
  return std::nullopt;
}

bool all_fp32(const sdk::OpPrecision& p) {
  return p.weight == sdk::DType::fp32 && p.gemm_input == sdk::DType::fp32 &&
         p.activation == sdk::DType::fp32 && p.activation_grad == sdk::DType::fp32;
}

// The policy's refusal of the backend (`refused`, a BackendError), raised again at the first node
// whose final plan computes its GEMMs in a dtype the backend does not declare: a ConfigError at
// the node's config location naming the node and the dtype, with the policy's message and hint.
// Rethrows the refusal as it is when no node needs such a dtype (or the backend declares none).
[[noreturn]] void refuse_at_first_node(const Model& model,
                                       const sdk::BackendCapabilities& capabilities,
                                       const std::exception_ptr& refused) {
  std::string what, hint;
  try {
    std::rethrow_exception(refused);
  } catch (const sdk::BackendError& e) {
    what = e.what();
    hint = e.hint();
  }
  if (!capabilities.gemm_inputs.empty())
    for (std::size_t i = 0; i < model.layers().size(); ++i) {
      const Layer& layer = *model.layers()[i];
      if (!layer.has_gemm()) continue;
      for (sdk::DType t : {layer.precision().gemm_input, layer.precision().weight}) {
        if (capabilities.supports(t)) continue;
        const PlannedNode& node = model.plan().node(i);
        throw sdk::ConfigError(node.where, node.key,
                               "node '" + layer.name() + "' (" + layer.type() +
                                   ") would compute its GEMMs on " +
                                   std::string(sdk::dtype_name(t)) + " operands: " + what,
                               (hint.empty() ? std::string() : hint + "; ") +
                                   "for example --set precision.policy=bf16-mixed");
      }
    }
  std::rethrow_exception(refused);
}

// A precision-sensitive op that may (Layer trait output_may_take_readers_gemm_dtype: a layer
// norm) stores its output in bf16 when every reader reads it as a bf16 GEMM operand: they round
// it to bf16 on every read anyway (a cast in the forward and another in the backward), so
// storing it rounded once gives them the same bits, without the casts and in half the memory.
// bf16 only: its range is FP32's, so the rounding cannot overflow where FP32 did not (fp16 could,
// and escalation would then blame the op whose output it is, which has nothing wider to go to).
// Not for an op that an override names exactly: the user's plan stands.
void store_outputs_for_gemm_readers(Model& model, const std::vector<PrecisionOverride>& overrides,
                                    const sdk::Logger& log) {
  const GraphPlan& plan = model.plan();
  auto& layers = model.layers();
  const TensorId logits = plan.root(plan.logits());
  for (std::size_t p = 0; p < layers.size(); ++p) {
    Layer& op = *layers[p];
    if (!op.traits().output_may_take_readers_gemm_dtype || TensorId::node(p) == logits) continue;
    bool named = false;
    for (const auto& o : overrides)
      named =
          named || (!is_glob(o.pattern) && fnmatch(o.pattern.c_str(), op.name().c_str(), 0) == 0);
    if (named) continue;
    int readers = 0;
    bool all_bf16_gemms = true;
    for (std::size_t q = p + 1; q < layers.size(); ++q)
      for (TensorId t : plan.node(q).inputs)
        if (t == TensorId::node(p)) {
          ++readers;
          const Layer& r = *layers[q];
          all_bf16_gemms = all_bf16_gemms && r.traits().reads_input_as_gemm_operand &&
                           r.precision().gemm_input == sdk::DType::bf16;
        }
    if (readers == 0 || !all_bf16_gemms || op.precision().activation == sdk::DType::bf16) continue;
    sdk::OpPrecision stored = op.precision();
    stored.activation = sdk::DType::bf16;
    op.set_precision(stored);
    log.debug("op '" + op.name() + "' (" + op.type() +
              ") stores its output in bf16, the dtype its readers' GEMMs read it in");
  }
}

// Per-tensor FP8's logits node in the policy's 16-bit activations (planning.h says why).
void keep_logits_in_16_bits(Model& model, const sdk::Logger& log) {
  const TensorId logits = model.plan().root(model.plan().logits());
  if (!logits.is_node()) return;
  Layer& head = *model.layers()[logits.position()];
  sdk::OpPrecision p = head.precision();
  if (!head.has_gemm() || !sdk::is_fp8(p.gemm_input) || sdk::is_fp8(p.activation)) return;
  p.gemm_input = p.activation;
  head.set_precision(p);
  log.info("the logits node '" + head.name() + "' computes its GEMMs in " +
           std::string(sdk::dtype_name(p.activation)) +
           ", not FP8, as Transformer Engine keeps the output layer (one amax over the batch "
           "would make its logits whole, and an FP8 GEMM needs classes in multiples of 16); a "
           "[[precision.override]] layers = " +
           sdk::option_value_to_string(exact_pattern(head.name())) +
           ", gemm_input = \"fp8_e4m3\" keeps it in FP8");
}

}  // namespace

std::string exact_pattern(const std::string& name) {
  std::string out;
  for (const char c : name) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

void plan_precision(Model& model, sdk::PrecisionPolicy& policy,
                    const sdk::BackendCapabilities& capabilities,
                    const std::vector<PrecisionOverride>& overrides, const sdk::Logger& log) {
  // A policy that refuses the backend (an FP8 policy on a GPU without FP8 Tensor Cores) names the
  // dtype but knows no node: the plan is made anyway, to name the first node that needs it.
  std::exception_ptr refused;
  try {
    policy.adapt_to(capabilities);
  } catch (const sdk::BackendError&) {
    refused = std::current_exception();
  }
  for (auto& layer : model.layers()) {
    const auto op = layer->description();
    sdk::OpPrecision p;
    try {
      p = policy.plan(op);
    } catch (...) {
      if (refused) std::rethrow_exception(refused);
      throw;
    }
    // Caught here, where the policy is known to be the cause: later a backend or the optimizer
    // would refuse the dtype in its own terms (an fp8 weight copy read as the optimizer's fault).
    if (const auto bad = unstorable(p))
      throw sdk::PluginError(
          "the precision policy planned op '" + op.name + "' (" + op.kind + ") as " + dtypes_of(p) +
              ": " + bad->why(),
          "fix the policy's plan() (a plugin's fault), or choose another policy");
    // The one place precision-sensitive ops are pinned: from the op's own trait, whatever the
    // policy planned (policies keep no deny-list of op kinds).
    if (op.precision_sensitive && !all_fp32(p)) {
      log.debug("op '" + op.name + "' (" + op.kind +
                ") is precision-sensitive: kept in fp32 (the " + "policy planned " + dtypes_of(p) +
                ")");
      p = sdk::OpPrecision{};
    }
    layer->set_precision(p);
  }
  if (policy.uses_scaled_operands()) keep_logits_in_16_bits(model, log);
  for (const auto& o : overrides) {
    bool matched = false;
    std::string sensitive_skipped;
    const bool glob = is_glob(o.pattern);
    for (auto& layer : model.layers()) {
      if (fnmatch(o.pattern.c_str(), layer->name().c_str(), 0) != 0) continue;
      // A glob leaves precision-sensitive ops pinned; naming one exactly overrides it.
      if (glob && layer->precision_sensitive()) {
        sensitive_skipped += (sensitive_skipped.empty() ? "" : ", ") + layer->name();
        continue;
      }
      matched = true;
      auto p = layer->precision();
      if (o.weight) p.weight = *o.weight;
      if (o.gemm_input) p.gemm_input = *o.gemm_input;
      if (o.activation) p.activation = *o.activation;
      if (o.activation_grad) p.activation_grad = *o.activation_grad;
      if (const auto bad = unstorable(p))
        throw sdk::ConfigError(
            o.where, std::string("precision.override.") + bad->role,
            "'" + layer->name() + "' would be " + dtypes_of(p) + ": " + bad->why(),
            sdk::is_fp8(bad->dtype)
                ? "set gemm_input = " + std::string(sdk::dtype_name(bad->dtype)) +
                      " instead, under an FP8 policy (fp8-delayed, "
                      "fp8-current) that scales it"
                : "choose fp32, tf32, bf16 or fp16");
      if (layer->precision_sensitive() && !all_fp32(p))
        log.warn("[[precision.override]] at " + o.where.to_string() +
                 " takes precision-sensitive op '" + layer->name() + "' (" + layer->type() +
                 ") out of fp32, as it names it: " + dtypes_of(p));
      layer->set_precision(p);
    }
    if (!matched && !sensitive_skipped.empty())
      throw sdk::ConfigError(
          o.layers_where.file.empty() ? o.where : o.layers_where, "precision.override.layers",
          "'" + o.pattern + "' matches only precision-sensitive ops (" + sensitive_skipped +
              "), which a glob leaves in fp32",
          "to change such an op's precision anyway, name it exactly: "
          "layers = " +
              sdk::option_value_to_string(
                  exact_pattern(sensitive_skipped.substr(0, sensitive_skipped.find(',')))));
    if (!matched) {
      std::string names;
      for (const auto& l : model.layers()) names += (names.empty() ? "" : ", ") + l->name();
      throw sdk::ConfigError(o.layers_where.file.empty() ? o.where : o.layers_where,
                             "precision.override.layers", "'" + o.pattern + "' matches no layer",
                             "layers in this model: " + names);
    }
  }
  store_outputs_for_gemm_readers(model, overrides, log);
  // FP8 GEMM operands under a policy that scales none (a per-tensor or a block scaling): each is
  // cast at a scale of 1, where values under fp8's smallest subnormal flush to zero. Allowed (a
  // study of unscaled fp8), but said once, naming the layers.
  if (!policy.uses_scaled_operands() &&
      dynamic_cast<const sdk::BlockScalingFacet*>(&policy) == nullptr) {
    std::vector<std::string> unscaled;
    for (const auto& layer : model.layers()) {
      if (!layer->has_gemm() || !sdk::is_fp8(layer->precision().gemm_input)) continue;
      if (layer->traits().fp8_only_scaled) {
        // The last override that set its gemm_input, else the policy's plan.
        const PrecisionOverride* by = nullptr;
        for (const auto& o : overrides)
          if (o.gemm_input && fnmatch(o.pattern.c_str(), layer->name().c_str(), 0) == 0) by = &o;
        const std::string what = "op '" + layer->name() + "' (" + layer->type() +
                                 ") would read fp8 GEMM inputs at a scale of 1, but a " +
                                 layer->type() +
                                 " reads fp8 operands only as a policy scales them, and the "
                                 "precision policy scales none";
        const std::string fix =
            "use an FP8 policy (precision.policy = \"fp8-delayed\" or \"fp8-current\"), or "
            "keep it in 16 bits: [[precision.override]] layers = " +
            sdk::option_value_to_string(exact_pattern(layer->name())) + ", gemm_input = \"bf16\"";
        if (by != nullptr)
          throw sdk::ConfigError(by->where, "precision.override.gemm_input", what, fix);
        throw sdk::PluginError(what + " (its plan() planned it)", fix);
      }
      unscaled.push_back("'" + layer->name() + "'");
    }
    if (!unscaled.empty())
      log.warn("GEMM inputs in fp8 at a scale of 1 for " + short_list(unscaled, 4) +
               ": the precision policy scales no operands, so small values (gradients, most of "
               "all) flush to zero. An FP8 policy scales them: precision.policy = "
               "\"fp8-delayed\" or \"fp8-current\"");
  }
  if (refused) refuse_at_first_node(model, capabilities, refused);
  // Scaled (FP8) operands only where the final plan still computes in FP8: an override that
  // keeps a layer in bf16 takes it out of the policy's scaling.
  if (policy.uses_scaled_operands())
    for (auto& layer : model.layers())
      if (layer->has_gemm() && sdk::is_fp8(layer->precision().gemm_input))
        layer->set_operand_scaling(&policy);
  // Block-scaled operands likewise, where the final plan keeps the policy's fp8 mark; an op with
  // such GEMMs but no block-scaled path is refused here rather than run some other way.
  if (const auto* blocks = dynamic_cast<const sdk::BlockScalingFacet*>(&policy)) {
    std::string padded;
    std::vector<std::size_t> pathless;  // nodes with no block-scaled path, all named at once
    for (std::size_t i = 0; i < model.layers().size(); ++i) {
      Layer& layer = *model.layers()[i];
      if (!layer.has_gemm() || !sdk::is_fp8(layer.precision().gemm_input)) continue;
      if (layer.set_block_scaling(blocks)) {
        const auto& inputs = model.plan().node(i).inputs;
        const bool dgrad = !inputs.empty() && model.plan().needs_grad(inputs[0]);
        check_block_layouts(model, i, *blocks, dgrad);
        const std::string these = padded_reductions(layer.description(), *blocks, dgrad);
        if (!these.empty()) padded += (padded.empty() ? "" : ";") + these;
        continue;
      }
      pathless.push_back(i);
    }
    if (!pathless.empty()) {
      // At the first one; the message names them all, so one edit fixes the config: a few with
      // their overrides, a model with many (a ResNet's convolutions) the first few and the glob
      // advice, not a hint of kilobytes.
      constexpr std::size_t kNamed = 4;
      const PlannedNode& node = model.plan().node(pathless.front());
      std::vector<std::string> named;
      std::string overrides;
      for (const std::size_t i : pathless) {
        const Layer& layer = *model.layers()[i];
        named.push_back("'" + layer.name() + "' (" + layer.type() + ")");
      }
      const std::string nodes = short_list(named, kNamed);
      for (std::size_t k = 0; k < pathless.size() && k < kNamed; ++k) {
        const Layer& layer = *model.layers()[pathless[k]];
        overrides +=
            (overrides.empty() ? "" : "; ") +
            ("[[precision.override]] layers = " +
             sdk::option_value_to_string(exact_pattern(layer.name())) + ", gemm_input = \"bf16\"");
      }
      if (pathless.size() > kNamed)
        overrides += "; and the same for the other " + std::to_string(pathless.size() - kNamed) +
                     " (`layers` takes a glob: one entry can match them all)";
      throw sdk::ConfigError(node.where, node.key,
                             (pathless.size() == 1 ? "node " : "nodes ") + nodes +
                                 (pathless.size() == 1 ? " has" : " have") +
                                 " no block-scaled GEMM path, which the precision policy plans "
                                 "for " +
                                 (pathless.size() == 1 ? "it" : "them"),
                             "keep " + std::string(pathless.size() == 1 ? "it" : "them") +
                                 " out of block scaling: " + overrides);
    }
    if (!padded.empty())
      log.info(
          "block-scaled GEMMs zero-pad the last block of a reduction dim the block does not "
          "divide (exact, as Transformer Engine pads, at the cost of the padding):" +
          padded + "; the wgrad GEMMs reduce over the batch rows and pad them alike");
  }
}

}  // namespace mixtrain::core
