#include "fp8_precision_policy.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string_view>

#include "mixtrain/sdk/error.h"

namespace mixtrain::fp8 {

namespace {
const char* kDamagedHint =
    "the checkpoint is damaged or was written by another policy; resume from another checkpoint "
    "or start the run without it";
}  // namespace

Fp8PrecisionPolicy::Fp8PrecisionPolicy(std::string component, const sdk::Options& options,
                                       const sdk::PluginContext& context)
    : component_(std::move(component)),
      format_(parse_fp8_format(options.get_string("fp8_format"))),
      margin_(static_cast<int>(options.get_int("margin"))),
      base_(&base_recipe(options.get_string("base"))),
      logger_(context.logger) {}

sdk::OptionSchema Fp8PrecisionPolicy::common_option_schema() {
  using sdk::OptionSpec;
  return {
      OptionSpec::string(
          "fp8_format", "hybrid",
          "hybrid: E4M3 for input and weight, E5M2 for grad_output; e4m3: E4M3 for all")
          .one_of(fp8_format_names()),
      OptionSpec::integer("margin", 0,
                          "scale = (fp8_max / amax) / 2^margin: headroom in powers of two")
          .at_least(0)
          .at_most(32),
      OptionSpec::string(
          "base", "bf16-mixed",
          "recipe of the non-FP8 parts: working weights, activations and their gradients")
          .one_of(base_recipe_names()),
  };
}

sdk::OpPrecision Fp8PrecisionPolicy::plan(const sdk::OpDescription& op) const {
  sdk::OpPrecision p;  // all fp32
  if (op.has_gemm()) {
    p.weight = base_->weight;
    // FP8 for the GEMMs with a weight (Transformer Engine's Linear); products of two activations
    // (attention's q·kᵀ and P·v) keep the base recipe's 16 bits.
    p.gemm_input = op.has_weight_gemm() ? sdk::DType::fp8_e4m3 : base_->activation;
  }
  p.activation = base_->activation;
  p.activation_grad = base_->activation_grad;
  return p;
}

void Fp8PrecisionPolicy::adapt_to(const sdk::BackendCapabilities& capabilities) {
  std::vector<sdk::DType> needed{sdk::DType::fp8_e4m3};
  if (format_ == Fp8Format::hybrid) needed.push_back(sdk::DType::fp8_e5m2);
  // An empty list means the backend did not declare its GEMM dtypes; the host's plan check
  // is then the only guard.
  if (!capabilities.gemm_inputs.empty()) {
    for (auto dtype : needed) {
      if (!capabilities.supports(dtype))
        throw sdk::BackendError(
            "policy '" + component_ + "' needs " + std::string(sdk::dtype_name(dtype)) +
                " GEMM operands, which the " + capabilities.kind + " backend on " +
                (capabilities.device_name.empty() ? std::string("this device")
                                                  : capabilities.device_name) +
                " does not accept",
            dtype == sdk::DType::fp8_e5m2
                ? "set fp8_format = \"e4m3\" in [precision], or use a backend with fp8_e5m2 GEMMs"
                : "use a backend with fp8 GEMMs, or a bf16-mixed policy");
    }
  }
  for (auto dtype : needed) {
    if (capabilities.supports(dtype) && !capabilities.native(dtype))
      logger_.info("policy " + component_ + ": the " + capabilities.kind + " backend emulates " +
                   std::string(sdk::dtype_name(dtype)) + " GEMMs (exact numerics, no speedup)");
  }
  logger_.debug("policy " + component_ + ": fp8_format " + std::string(fp8_format_name(format_)) +
                ", margin " + std::to_string(margin_) + ", base " + std::string(base_->name));
}

void Fp8PrecisionPolicy::fail_state(const std::string& what) const {
  throw sdk::CheckpointError("policy '" + component_ + "' state: " + what, kDamagedHint);
}

void Fp8PrecisionPolicy::check_state_version(const sdk::ComponentState& state,
                                             std::int64_t current) const {
  if (state.version < 1 || state.version > current)
    throw sdk::CheckpointError("policy '" + component_ + "' state has version " +
                                   std::to_string(state.version) + ", this build reads 1.." +
                                   std::to_string(current),
                               "resume with the mixtrain version that wrote the checkpoint");
}

std::int64_t Fp8PrecisionPolicy::read_int(const sdk::ComponentState& state, const std::string& key,
                                          std::int64_t min, std::int64_t max) const {
  const auto value = state.get<std::int64_t>(key);
  if (value < min || value > max)
    fail_state("entry '" + key + "' = " + std::to_string(value) + " is outside [" +
               std::to_string(min) + ", " + std::to_string(max) + "]");
  return value;
}

float Fp8PrecisionPolicy::read_scale(const sdk::ComponentState& state,
                                     const std::string& key) const {
  const auto value = state.get<double>(key);
  if (!std::isfinite(value) || value <= 0.0 || value > static_cast<double>(FLT_MAX))
    fail_state("entry '" + key + "' = " + format_float(value) + " is not a positive finite float");
  return static_cast<float>(value);
}

const std::string& Fp8PrecisionPolicy::read_string(const sdk::ComponentState& state,
                                                   const std::string& key) const {
  return state.get<std::string>(key);
}

std::pair<std::string, sdk::OperandRole> Fp8PrecisionPolicy::read_slot_name(
    const sdk::ComponentState& state, const std::string& key) const {
  const auto& saved = read_string(state, key);
  if (state.version == 1) {
    const auto renamed = slot_name_from_v1(saved);
    if (!renamed)
      fail_state("entry '" + key + "' = '" + saved +
                 "' is not a version-1 slot name \"<layer>.<input|weight|grad_output>\"");
    return {*renamed, *slot_role(*renamed)};
  }
  const auto role = slot_role(saved);
  if (!role)
    fail_state("entry '" + key + "' = '" + saved +
               "' is not a slot name \"<node>.<gemm>.<input|weight|grad_output>\"");
  return {saved, *role};
}

void Fp8PrecisionPolicy::report_slot_migration(const sdk::ComponentState& state,
                                               std::size_t count) const {
  if (state.version != 1) return;
  logger_.info("policy " + component_ + ": the checkpoint's state has version 1, which named " +
               "scaling slots \"<layer>.<role>\"; renamed its " + std::to_string(count) +
               " slots to \"<layer>." + std::string(kV1SlotGemm) + ".<role>\" (version 2)");
}

void Fp8PrecisionPolicy::save_recipe(sdk::ComponentState& state) const {
  state.values["fp8_format"] = std::string(fp8_format_name(format_));
  state.values["margin"] = std::int64_t{margin_};
  state.values["base"] = std::string(base_->name);
}

bool Fp8PrecisionPolicy::report_recipe_changes(const sdk::ComponentState& state) const {
  const auto& saved_format = read_string(state, "fp8_format");
  if (std::find(fp8_format_names().begin(), fp8_format_names().end(), saved_format) ==
      fp8_format_names().end())
    fail_state("entry 'fp8_format' = '" + saved_format + "' is not a known format");
  const auto saved_margin = read_int(state, "margin", 0, 32);
  const auto& saved_base = read_string(state, "base");
  bool constants_changed = false;
  if (saved_format != fp8_format_name(format_)) {
    logger_.info("policy " + component_ + ": checkpoint used fp8_format " + saved_format +
                 ", the config says " + std::string(fp8_format_name(format_)) +
                 "; the config wins");
    constants_changed = true;
  }
  if (saved_margin != margin_) {
    logger_.info("policy " + component_ + ": checkpoint used margin " +
                 std::to_string(saved_margin) + ", the config says " + std::to_string(margin_) +
                 "; the config wins");
    constants_changed = true;
  }
  if (saved_base != base_->name)
    logger_.info("policy " + component_ + ": checkpoint used base " + saved_base +
                 ", the config says " + std::string(base_->name) + "; the config wins");
  return constants_changed;
}

}  // namespace mixtrain::fp8
