// ComponentHistory as JSON (runs/component_history.h): an array of {"first_step", "policy",
// "resolved_policy" (when not empty), "scaler", "optimizer"}, as checkpoints ("history") and
// summary.json ("segments") hold it.
//
// Contract
// - history_of_checkpoint() never throws: a damaged entry falls back as a missing one does (the
//   history labels records; the training state is checked elsewhere).
// - component_history_from_json() returns nullopt for anything that is not such an array with
//   first_step ≥ 1 in increasing order: a checkpoint written before the history existed, or
//   damaged. The caller falls back to what else the file records.
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "mixtrain/core/runs/component_history.h"

namespace mixtrain::core {

nlohmann::json component_history_to_json(const ComponentHistory& history);
std::optional<ComponentHistory> component_history_from_json(const nlohmann::json& j);
// What a checkpoint's metadata records of the components that trained it: its "history", or for a
// checkpoint written before that existed, one segment from its policy, scaler and optimizer
// states' components (the steps before any switch are then unknown); empty when it has neither.
ComponentHistory history_of_checkpoint(const std::map<std::string, std::string>& metadata);

}  // namespace mixtrain::core
