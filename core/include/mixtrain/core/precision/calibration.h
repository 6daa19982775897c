// Calibration: a few FP32 training steps of an experiment with every op's tensors measured
// (range_statistics.h), and the plan the experiment's own policy makes for each op — what the
// recommendation rules (recommendation.h) read.
//
// Contract
// - calibrate() trains `steps` optimizer steps from the experiment's initial weights on its data
//   with the same seed, data order, optimizer and schedule, but precision policy "fp32" and
//   scaler "none", no [[precision.override]], no [precision.escalate] and nothing written (no
//   run folder, no checkpoint, no evaluation during the steps). Steps past run.steps are not run:
//   the count is capped there (Calibration::steps says how many ran). The steps are the trainer's
//   own; an observer (train/trainer.h, StepObserver) copies tensors to the host after each node.
//   An FP32 run that does not stay finite (a step skipped for non-finite gradients, or stopped by
//   run.on_nonfinite) is sdk::UserError: its ranges would recommend from NaN and inf.
// - Per computing node (views are not listed), in forward order, the tensors measured, each
//   aggregated over the steps (one step_amax per optimizer step, micro-batches folded in):
//     gemm_input   the inputs its GEMMs read (ops with GEMMs), all inputs together
//     weight       its GEMM weights (parameters of rank >= 2 it uses; ops with GEMMs)
//     activation   its output (absent when a fused reader writes it: a linear with its relu)
//     activation_grad  the gradients it writes for its inputs (with fp16 loss-scale counts)
//     output_grad  the gradient of its output that its backward reads (ops with GEMMs; with
//                  fp16 loss-scale counts), the grad_output operand of an FP8 GEMM
// - `planned` is each listed node's OpPrecision under the experiment's policy as the trainer
//   plans it (plan_precision on the same model and backend, the config's [[precision.override]]
//   included: an override may be what lets the policy plan the model at all, a convolution kept
//   out of block scaling, and a recommendation builds on it). `config_overrides` holds them.
// - Block report (block_range_statistics.h), when CalibrationOptions::blocks asks for it or the
//   policy plans an FP8 GEMM (the FP8 and block-scaled policies): for each op with a
//   block-scaled path (a linear), its gemm_input, weight and output_grad get `blocks`, measured on
//   at most kBlockSampleSteps optimizer steps spread evenly over the run (the first, then every
//   ceil(steps / kBlockSampleSteps)-th), every micro-batch of those. `block_policies` holds, per
//   block-scaled policy the registry has, its plan of every listed op with default options and
//   the config's overrides, or
//   the plan-time refusal (a convolution, a backend without the block-scaled GEMM ops) in the
//   words `train` would print. `block_format` is set when the experiment's own policy is one of
//   them.
// - Errors: steps < 1 is sdk::UserError; a model the backend cannot run in FP32 is an
//   sdk::UserError saying calibration runs FP32, with Model::check_backend's message (the node,
//   its config line, the op, the backend) and hint; the config's policy failing to plan is its
//   ConfigError; data and component errors are the Trainer's.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/precision/block_range_statistics.h"
#include "mixtrain/core/precision/range_statistics.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::core {

enum class CalibratedTensor { gemm_input, weight, activation, activation_grad, output_grad };
const char* calibrated_tensor_name(CalibratedTensor t);  // "gemm_input", ...
bool is_gradient(CalibratedTensor t);

struct TensorCalibration {
  CalibratedTensor tensor;
  RangeStatistics stats;
  std::optional<BlockRangeStatistics> blocks = std::nullopt;  // with the block report, see above
};

struct OpCalibration {
  std::string node, type;
  bool precision_sensitive = false;
  bool has_gemm = false;
  bool block_path = false;                 // a block-scaled policy would quantize its GEMMs
  sdk::OpPrecision planned;                // under the experiment's policy
  std::vector<TensorCalibration> tensors;  // in CalibratedTensor order, those measured
  const TensorCalibration* find(CalibratedTensor t) const;
};

// A block-scaled policy's plan of the same model, or why it refuses it.
struct BlockPolicyPlan {
  BlockFormat format = BlockFormat::fp8_block;
  std::string refused;                    // the plan-time error; empty when it plans
  std::vector<sdk::OpPrecision> planned;  // per op of Calibration::ops (empty when refused)
};

struct Calibration {
  std::string policy;  // the experiment's policy, as the config names it or as "auto" chose it
  bool policy_needs_loss_scaling = false;
  // The format of a per-tensor FP8 GEMM's gradient operand, from the policy's fp8_format: e5m2
  // under "hybrid" (and without one), e4m3 under "e4m3", which flushes far more small gradients.
  // (Block-scaled GEMMs are judged per block, in their format.)
  sdk::DType fp8_gradient = sdk::DType::fp8_e5m2;
  std::optional<BlockFormat> block_format;  // the policy is this block-scaled one
  std::int64_t steps = 0;                   // optimizer steps that ran
  std::vector<OpCalibration> ops;           // forward order
  bool block_report = false;                // the block statistics were measured
  std::int64_t block_steps = 0;             // optimizer steps they were measured on
  std::vector<BlockPolicyPlan> block_policies;
  std::vector<PrecisionOverride> config_overrides;  // the experiment's, in config order
  // The config's [scaler.dynamic] min_scale and max_scale, whatever scaler it names now (the
  // recommendation's file sets the dynamic one): a recommended init_scale must lie within them,
  // or the merged config is refused. calibrate() leaves the defaults; its caller reads the table.
  double min_scale = 0.0;
  double max_scale = std::numeric_limits<double>::infinity();
};

inline constexpr std::int64_t kBlockSampleSteps = 8;

struct CalibrationOptions {
  std::int64_t steps = 50;
  bool blocks = false;  // measure the block report under any policy
};

Calibration calibrate(const Experiment& experiment, const PluginRegistry& registry,
                      const CalibrationOptions& options);

}  // namespace mixtrain::core
