// StepGraph: the trainer's use of a backend's step-graph facet (sdk/backend_step_graph.h, CUDA
// graphs): forward, loss and backward of a static training step recorded once and replayed with
// one launch (docs/architecture.md, "Step graphs"). Internal to the core.
//
// Contract
// - Eligible (fixed at construction): run.step_graphs asks for it (true, or unset: automatic),
//   the backend offers the facet,
//   the step has one micro-batch,
//   the policy scales no operands (FP8 scales are host arguments that move every step) and no op
//   varies per step (OpTraits::varies_per_step: dropout's mask key). Otherwise run() just calls
//   the body. Asked for (true), what is off and why is logged once (info); automatic, an off
//   that the backend or the step's shape decides is logged at debug only (the CPU records no
//   graphs: nothing to say on every CPU run).
// - run(key, body): key is what the body's arguments depend on besides memory contents: the rows
//   and the loss seed (scale / accumulate, which a dynamic scaler changes). A step with a new key
//   runs eagerly once (its plans, scratch and workspaces then exist: recording cannot allocate),
//   the next with the same key is recorded and replayed, and later ones replay. statistics steps
//   (underflow, FP8 operand records) read the device mid-step: the caller passes eager = true.
// - A recording that fails (an op that cannot be recorded raised BackendError; end_capture gave
//   -1) switches step graphs off for the run, logs why once, calls `restart` (when given) and runs
//   the body eagerly: the step is never lost. `restart` undoes the host state the voided
//   recording's body consumed (the gradients' first-write flags of the micro-batch it opened);
//   nothing of that body ran on the device. Other exceptions end the recording and propagate.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mixtrain/sdk/backend_step_graph.h"
#include "mixtrain/sdk/logging.h"

namespace mixtrain::core {

struct StepGraphKey {
  std::int64_t rows = 0;
  float seed = 0.0f;
  bool operator==(const StepGraphKey&) const = default;
};

// run.step_graphs: false, true, or unset.
enum class StepGraphRequest { off, on, automatic };

class StepGraph {
 public:
  // facet: nullptr when the backend offers none; not_static: why the step is not static ("" when
  // it is).
  StepGraph(sdk::StepGraphFacet* facet, StepGraphRequest request, const std::string& not_static,
            sdk::Logger log);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  void run(const StepGraphKey& key, bool eager, const std::function<void()>& body,
           const std::function<void()>& restart = {});

  bool active() const noexcept { return facet_ != nullptr; }
  std::int64_t captures() const noexcept { return captures_; }
  std::int64_t replays() const noexcept { return replays_; }
  // Why step graphs are off ("" while they are on or were never eligible).
  const std::string& disabled_reason() const noexcept { return disabled_; }

 private:
  void drop() noexcept;
  void disable(const std::string& why);

  sdk::StepGraphFacet* facet_ = nullptr;
  sdk::Logger log_;
  int graph_ = -1;
  StepGraphKey key_;
  bool warm_ = false;  // one eager step ran with key_
  std::int64_t captures_ = 0, replays_ = 0;
  std::string disabled_;
};

}  // namespace mixtrain::core
