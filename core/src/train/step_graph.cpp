#include "train/step_graph.h"

#include <exception>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

StepGraph::StepGraph(sdk::StepGraphFacet* facet, StepGraphRequest request,
                     const std::string& not_static, sdk::Logger log)
    : log_(std::move(log)) {
  if (request == StepGraphRequest::off) return;
  // A step that is not static says why first: it holds on any backend (and --profile's reason
  // comes this way, the profiler offering no graphs).
  if (!not_static.empty())
    disabled_ = not_static;
  else if (facet == nullptr)
    disabled_ = "the backend records no step graphs";
  if (!disabled_.empty()) {
    const std::string said = "run.step_graphs: off (" + disabled_ + "); steps run op by op";
    if (request == StepGraphRequest::on)
      log_.info(said);
    else
      log_.debug(said);
    return;
  }
  facet_ = facet;
  log_.info(
      "run.step_graphs: forward, loss and backward are recorded once per batch shape and "
      "loss scale and replayed with one launch");
}

StepGraph::~StepGraph() {
  drop();
}

void StepGraph::drop() noexcept {
  if (facet_ != nullptr && graph_ >= 0) facet_->release(graph_);
  graph_ = -1;
}

void StepGraph::disable(const std::string& why) {
  drop();
  facet_ = nullptr;
  disabled_ = why;
  log_.warn("step graphs off for this run: " + why + "; steps run op by op");
}

void StepGraph::run(const StepGraphKey& key, bool eager, const std::function<void()>& body,
                    const std::function<void()>& restart) {
  if (facet_ == nullptr || eager) {
    body();
    return;
  }
  if (graph_ >= 0 && key == key_) {
    facet_->replay(graph_);
    ++replays_;
    return;
  }
  if (!(warm_ && key == key_)) {
    // A new shape or loss scale: one eager step creates every plan and scratch buffer the
    // recording will use (a recording cannot allocate).
    drop();
    key_ = key;
    warm_ = true;
    body();
    return;
  }
  if (!facet_->begin_capture()) {
    disable("the backend could not start a recording");
    body();
    return;
  }
  std::string failure;
  try {
    body();
  } catch (const sdk::BackendError& e) {
    failure = e.what();
  } catch (...) {
    // Always end the recording, and free a graph it made: a live graph holds scratch and memory
    // in the backend. The error is the caller's.
    if (const int made = facet_->end_capture(); made >= 0) facet_->release(made);
    throw;
  }
  const int graph = facet_->end_capture();
  if (!failure.empty() || graph < 0) {
    if (graph >= 0) facet_->release(graph);
    disable(failure.empty() ? "the backend could not record the step" : failure);
    if (restart) restart();
    body();  // nothing recorded ran: run the step now
    return;
  }
  graph_ = graph;
  ++captures_;
  facet_->replay(graph_);
  ++replays_;
}

}  // namespace mixtrain::core
