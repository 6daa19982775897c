// ParameterMemory: what a model's parameters take on the device, by role, measured on the
// allocated tensors: the frozen base (its quantized part counted apart), and for the trainable
// parameters their FP32 masters, gradients, low-precision working copies and the optimizer's
// state. `mixtrain check` prints it as bytes per parameter and summary.json records it
// (README, "Freezing and LoRA").
//
// Contract
// - Counts are elements; bytes are the tensors' own bytes (a quantized weight: its codes plus its
//   scales: NF4's packed codes and fp32 absmax values, an FP8 block format's code bytes and
//   scales). The JSON names the quantized part by its format ("nf4_parameters", "fp8_block_bytes",
//   bytes_per_parameter.mxfp8). Scratch that the GEMMs decode into is not a parameter's: the memory
//   report lists it with the step's buffers.
// - full_fine_tune_bytes() is what masters and optimizer state would take if every parameter
//   trained with the same state per parameter as the trainable ones now have.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mixtrain/core/graph/freezing.h"

namespace mixtrain::core {

class Model;

struct ParameterMemory {
  // quantized: the frozen ones stored in a quantized train.frozen_format (NF4, fp8-block, mxfp8);
  // quantized_bytes is part of frozen_bytes.
  std::int64_t frozen = 0, quantized = 0, trainable = 0;
  std::size_t frozen_bytes = 0, quantized_bytes = 0;
  std::size_t master_bytes = 0, gradient_bytes = 0, working_bytes = 0, optimizer_state_bytes = 0;
  FrozenFormat quantized_format = FrozenFormat::compute;
  std::string quantized_detail;  // "blocks of 64", the block layout

  static double per(std::size_t bytes, std::int64_t count) {
    return count > 0 ? static_cast<double>(bytes) / static_cast<double>(count) : 0.0;
  }
  std::size_t masters_and_state_bytes() const { return master_bytes + optimizer_state_bytes; }
  double full_fine_tune_bytes() const {
    return per(masters_and_state_bytes(), trainable) * static_cast<double>(frozen + trainable);
  }
};

// `optimizer_state_bytes`: the bound optimizer's state tensors, which the model does not hold.
ParameterMemory measure_parameter_memory(const Model& model, std::size_t optimizer_state_bytes);

// "# bytes per parameter: frozen base 0.56 (…), trainable: masters 4.00, …" for `check`.
std::string parameter_memory_line(const ParameterMemory& m);
// Its JSON for summary.json: graph/parameter_memory_json.h, inside the core (an installed header
// includes only SDK, std and Boost headers).

}  // namespace mixtrain::core
