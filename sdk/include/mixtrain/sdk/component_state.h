// Serializable state of a component (scaler, policy, optimizer scalars).
//
// Contract: a component's `save_state()` returns a ComponentState; `load_state()` receives one
// written by the same component kind and name, possibly by an older `version`. Values are plain
// scalars, strings or float vectors (amax histories), so the host can store them in any checkpoint
// format and print them. Large per-parameter state (optimizer moments) lives in device tensors and
// is exposed separately as named TensorViews.
//
// Counter entries with a fixed meaning: a component that saves an int64 entry under one of these
// names counts exactly this, and on resume the host rejects a checkpoint whose entry disagrees
// with the host's own progress (a damaged or hand-edited file), before load_state():
//   LossScaler        "steps"          update() calls            = steps taken
//                     "skipped_steps"  update() that skipped      = steps skipped
//   Optimizer         "step"           step() calls              = steps applied
//   PrecisionPolicy   "applied_steps"  on_step_end(true) calls   = steps applied
// counted since the component's state began: the run's start, or the resume that switched to it
// (--set scaler.type=..., optimizer.type=..., precision.policy=...), whose step the checkpoint
// records beside the state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace mixtrain::sdk {

using StateValue = std::variant<bool, std::int64_t, double, std::string, std::vector<float>>;

struct ComponentState {
  std::int64_t version = 1;
  std::map<std::string, StateValue> values;

  template <class T>
  const T& get(const std::string& key) const;  // throws CheckpointError when missing / mistyped
  bool has(const std::string& key) const { return values.count(key) != 0; }
};

}  // namespace mixtrain::sdk

#include "mixtrain/sdk/error.h"

namespace mixtrain::sdk {
template <class T>
const T& ComponentState::get(const std::string& key) const {
  auto it = values.find(key);
  if (it == values.end())
    throw CheckpointError("component state has no entry '" + key + "'",
                          "the checkpoint was written by another component or is damaged");
  if (auto* p = std::get_if<T>(&it->second)) return *p;
  throw CheckpointError("component state entry '" + key + "' has an unexpected type",
                        "the checkpoint was written by another component version or is damaged");
}
}  // namespace mixtrain::sdk
