// Automatic escalation (docs/precision-autopilot.md, "Escalation"): the bookkeeping that promotes
// an op one format wider when it keeps producing non-finite values, and optionally demotes it
// again after a long clean stretch. Host-only and deterministic: it sees, per training step,
// whether the step was skipped and which node the non-finite replay blamed; the trainer rebuilds
// the model under overrides() when an event fires.
//
// Contract
// - The ladder: fp8_e4m3/fp8_e5m2 → bf16 → fp32, fp16 → fp32, tf32 → fp32. widen() moves every
//   field of an OpPrecision one rung; an op already all fp32 cannot widen (can_widen false).
// - observe(step, skipped, node): a skipped step blamed on `node` (non-empty) counts one blame
//   at `step`; blames older than `window` steps (step - b >= window) are forgotten. The `after`-th
//   blame within the window promotes the node (its stack gains widen(current)) and clears its
//   blames. A blamed node that cannot widen is reported once (Event::stuck) and never promoted.
//   With deescalate_after > 0, after that many applied steps in a row with no skip, the most
//   recent promotion still standing is undone (demoted one rung) and the count restarts. A node
//   promoted again to a rung it was demoted from is pinned there (Event::pinned): its overflow
//   was no transient, so de-escalation passes over its rungs up to that one for the rest of the
//   run, where each demote-and-fail cycle would cost `after` skipped steps and as many halvings
//   of a dynamic loss scale.
//   At most one event per step; without `enabled` nothing fires but the promotions restored from
//   a checkpoint stand.
// - start_from(node, plan): the node's plan before any promotion (the config's), needed once per
//   node before its first promotion; the trainer passes the current plan when a node is blamed.
// - overrides(): one PrecisionOverride per promoted node, exact name, every field set: appended
//   after the config's [[precision.override]] entries they beat them.
// - drop_replanned(plan_now): forgets every node whose recorded starting plan is not the one the
//   config gives it now (see the method).
// - to_json()/from_json(): the whole state (stacks, blames, clean count, events) for checkpoints;
//   from_json throws sdk::CheckpointError naming the field on any malformed or out-of-range value.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/precision/planning.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::core {

bool can_widen(const sdk::OpPrecision& p);
sdk::OpPrecision widen(const sdk::OpPrecision& p);
// "fp16" when every field is one dtype, else "weight=fp8_e4m3 gemm_input=... ...".
std::string precision_text(const sdk::OpPrecision& p);

class Escalation {
 public:
  struct Event {
    enum class Kind { promote, demote, stuck };
    Kind kind = Kind::promote;
    std::int64_t step = 0;
    std::string node;
    sdk::OpPrecision from, to;
    std::vector<std::int64_t> blames;  // the steps that promoted it (promote only)
    bool pinned = false;  // a promotion back to a rung it was demoted from: never undone again
  };

  explicit Escalation(EscalationSettings settings = {}) : settings_(settings) {}

  const EscalationSettings& settings() const { return settings_; }
  void set_settings(const EscalationSettings& s) { settings_ = s; }

  // The node's plan as the config has it, recorded the first time (later calls are ignored).
  void start_from(const std::string& node, const sdk::OpPrecision& plan);
  std::optional<Event> observe(std::int64_t step, bool skipped, const std::string& node);

  std::vector<PrecisionOverride> overrides() const;
  bool any_promoted() const;
  // A resume whose config plans a node otherwise than the plan its promotions started from (an
  // override added since, a calibrated file merged): the config's plan stands, so the node's
  // state is dropped, and a later demotion cannot report a format the node never returns to.
  // `plan_now` gives the config's plan of a node (nullopt: no such node). Returns what was
  // dropped, each {node, the plan it started from, its promoted plan, the config's plan}.
  struct Replanned {
    std::string node;
    sdk::OpPrecision started_from, promoted, planned_now;
  };
  std::vector<Replanned> drop_replanned(
      const std::function<std::optional<sdk::OpPrecision>(const std::string&)>& plan_now);
  const std::vector<Event>& events() const { return events_; }
  std::int64_t promotions_standing() const;

  nlohmann::json to_json() const;
  // `file` names the checkpoint in errors.
  static Escalation from_json(const nlohmann::json& j, EscalationSettings settings,
                              const std::string& file);

 private:
  struct NodeState {
    std::vector<sdk::OpPrecision> stack;  // [config's plan, after 1st promotion, ...]
    std::deque<std::int64_t> blames;
    bool reported_stuck = false;
    // The highest stack size a demotion took it down from (0: never demoted), and the stack size
    // up to which its promotions are pinned (0: none).
    std::size_t demoted_from = 0, pinned_size = 0;
  };
  EscalationSettings settings_;
  std::map<std::string, NodeState> nodes_;
  std::vector<std::string> promotion_order_;  // nodes in the order their standing promotions fired
  std::int64_t clean_steps_ = 0;
  std::vector<Event> events_;
};

nlohmann::json escalation_event_json(const Escalation::Event& e);

}  // namespace mixtrain::core
