// What an allocation of the model's memory plan that the backend refused (out of memory, most
// often) is reported with: which buffer and its bytes, the plan's predicted total for the batch,
// what the backend held and the device's memory, and how to need less. Internal to the core
// (Executor::allocate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

// a + b, or SIZE_MAX where it would wrap: forecasts of absurd configs stay absurd, not plausible.
constexpr std::size_t saturating_add(std::size_t a, std::size_t b) {
  return b > std::numeric_limits<std::size_t>::max() - a ? std::numeric_limits<std::size_t>::max()
                                                         : a + b;
}

// a · b, or SIZE_MAX where it would wrap.
constexpr std::size_t saturating_mul(std::size_t a, std::size_t b) {
  return b != 0 && a > std::numeric_limits<std::size_t>::max() / b
             ? std::numeric_limits<std::size_t>::max()
             : a * b;
}

// The model's device memory as its plans predict it for batches of max_rows rows.
struct MemoryForecast {
  std::int64_t max_rows = 0;
  std::size_t input = 0;            // the batch and its labels
  std::size_t activations = 0;      // the step's arena: activations and their gradients
  std::size_t parameters = 0;       // FP32 masters and gradients, low-precision working copies
  bool parameter_gradients = true;  // false: a model that plans no training pass has none
  bool activations_narrow = false;  // the activation plan already stores narrower than fp32
  // The op types whose outputs model.recompute would drop from the training step and does not
  // yet (memory_plan.h), in forward order; empty: none would.
  std::vector<std::string> recompute_types;
  std::size_t total() const {
    return saturating_add(saturating_add(input, activations), parameters);
  }
};

// "312.0 MiB", "1.25 GiB", "512 bytes".
std::string memory_text(std::size_t bytes);

// The error for `what` (`bytes` of it) the backend refused with `cause`: cause's text and hint,
// then the buffer, the forecast, the backend's live bytes and the device's memory, and the ways
// to shrink the plan. A BackendError (exit code 2 at the CLI).
sdk::BackendError allocation_error(const sdk::BackendError& cause, const std::string& what,
                                   std::size_t bytes, const MemoryForecast& forecast,
                                   const sdk::DeviceBackend& backend);

}  // namespace mixtrain::core
