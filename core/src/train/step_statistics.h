// The numerics a step can report besides its loss, as metrics.jsonl records. Internal to the core.
//
// - gradient_underflow_record(): per activation-gradient tensor stored in < 32 bits, the share of
//   its non-zero values that flush to zero in that dtype at this step's loss scale (the underflow
//   loss scaling exists to prevent), from an FP32 replay of the backward seeded with `grad_seed`
//   (the loss scale / run.accumulate: each micro-batch's share), which gives every row the
//   gradient a whole-batch step at `loss_scale` would; the record and the one-line summary it
//   logs name `loss_scale`.
// - fp8_operand_record(): per FP8 operand slot of this step, amax, scale and the shares that
//   saturated or flushed to zero in the cast (the layers collected them during the forward).
// - nonfinite_skip_message(): the warning for a skipped step, naming the first non-finite tensor.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/loss_scaler.h"

namespace mixtrain::core {

nlohmann::json gradient_underflow_record(Model& model, std::int64_t step, std::int64_t rows,
                                         float grad_seed, float loss_scale, sdk::Logger& log);
nlohmann::json fp8_operand_record(const Model& model, std::int64_t step);
std::string nonfinite_skip_message(std::int64_t step, const std::string& first_nonfinite,
                                   const sdk::ScalerDecision& decision);

}  // namespace mixtrain::core
