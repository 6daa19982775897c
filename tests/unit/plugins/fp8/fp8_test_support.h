// Builders shared by the fp8 suites: policies made from test.toml-style options with a capturing
// log sink, and the node / role shorthands the tests drive them with.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "current_scaling_policy.h"
#include "delayed_scaling_policy.h"
#include "mixtrain/sdk/error.h"
#include "plugin_test_support.h"

namespace mixtrain::fp8::testing {

using Values = std::vector<std::pair<std::string, sdk::OptionValue>>;
using sdk::OperandRole;

inline std::unique_ptr<DelayedScalingPolicy> make_delayed(test::CapturingSink& sink,
                                                          Values values = {}) {
  return std::make_unique<DelayedScalingPolicy>(
      test::resolve("precision", DelayedScalingPolicy::option_schema(), std::move(values)),
      test::context(&sink, "fp8", "policy", "fp8-delayed"));
}

inline std::unique_ptr<CurrentScalingPolicy> make_current(test::CapturingSink& sink,
                                                          Values values = {}) {
  return std::make_unique<CurrentScalingPolicy>(
      test::resolve("precision", CurrentScalingPolicy::option_schema(), std::move(values)),
      test::context(&sink, "fp8", "policy", "fp8-current"));
}

// The operand `role` of the one GEMM of linear node `node`: slot "<node>.matmul.<role>".
inline sdk::OperandSlot operand(const std::string& node, OperandRole role) {
  return {node, "matmul", role};
}

// Op descriptions the plans are asked for.
inline sdk::OpDescription linear_op(const std::string& name = "fc1") {
  return {name,
          "linear",
          8,
          16,
          {{"matmul", {OperandRole::input, OperandRole::weight, OperandRole::grad_output}}},
          false};
}
inline sdk::OpDescription op_without_gemm(const std::string& kind, bool sensitive = false) {
  return {kind + "1", kind, 16, 16, {}, sensitive};
}

// One applied (or skipped) step in which fc1's input was cast with the given amax.
inline void step(sdk::PrecisionPolicy& p, float input_amax, bool applied = true) {
  p.operand_scaling(operand("fc1", OperandRole::input));
  p.record_amax(operand("fc1", OperandRole::input), input_amax);
  p.on_step_end(applied);
}

inline float input_scale(sdk::PrecisionPolicy& p) {
  return p.operand_scaling(operand("fc1", OperandRole::input)).scale;
}

inline bool has(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// Runs `load`, expects a CheckpointError and returns its message.
inline std::string checkpoint_error(const std::function<void()>& load) {
  try {
    load();
  } catch (const sdk::CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no CheckpointError thrown";
  return {};
}

}  // namespace mixtrain::fp8::testing
