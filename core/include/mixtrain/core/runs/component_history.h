// The components a run trained under, range of steps by range of steps. A resume may switch the
// precision policy deliberately (--set precision.policy=...), so one run can hold several; its
// records must not credit the whole run to the last. Checkpoints carry the history (metadata
// "history"), summary.json writes it as "segments" when the run holds more than one, and
// `mixtrain compare` labels such a run by its chain ("fp32→fp16-mixed@21/none").
//
// Contract
// - A segment's components trained from its first_step (1-based) up to the next segment's
//   first_step − 1, the last one to the run's end. Segments are in step order, and each differs
//   from the one before in at least one component (extend_history() merges a repeat).
// - resolved_policy: what a choosing policy (auto) applied; empty for a policy that is itself.
// - history_text(): one component's chain, "a" for one value, "a→b@21" when it changed at step
//   21; `policy` labels a choosing policy with its choice ("auto→bf16-mixed").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain::core {

struct ComponentSegment {
  std::int64_t first_step = 1;
  std::string policy, resolved_policy, scaler, optimizer;
  bool same_components(const ComponentSegment& other) const {
    return policy == other.policy && resolved_policy == other.resolved_policy &&
           scaler == other.scaler && optimizer == other.optimizer;
  }
};
using ComponentHistory = std::vector<ComponentSegment>;

// Appends `next` unless it holds the last segment's components.
void extend_history(ComponentHistory& history, ComponentSegment next);

enum class HistoryPart { policy, scaler, optimizer };
std::string history_text(const ComponentHistory& history, HistoryPart part);

}  // namespace mixtrain::core
