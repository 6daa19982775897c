// StepGraphFacet: record a run of enqueued ops once and replay it with one launch (CUDA graphs),
// so a static training step pays the host's per-op launch cost once instead of every step.
//
// Contract
// - A backend offers it as find_facet("step_graph") (nullptr: none, or switched off by the
//   backend's options). The host decides what to record (docs/architecture.md, "Step graphs"):
//   only a run whose every op has the same arguments, shapes and addresses at each replay.
// - begin_capture(): from now until end_capture(), the backend's ops are recorded, NOT run.
//   Returns false when it cannot record now (nothing changed then).
// - While recording, an op that cannot be recorded (a host upload, a host read, a wait, a device
//   allocation) raises BackendError; the recording is then void. end_capture() must still be
//   called: it always ends the recording.
// - end_capture(): returns a graph id >= 0, or -1 when the recording is void. Either way none of
//   the recorded ops has run: the caller replays the graph, or runs the ops again without
//   recording.
// - replay(id): enqueues the recorded ops in order on the backend's stream, as if each had been
//   called again with its recorded arguments (memory contents are read at replay time).
// - release(id): frees a graph; ids of released graphs are not reused by later captures' callers.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <string_view>

#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

class MIXTRAIN_SDK_API StepGraphFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "step_graph";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual bool begin_capture() = 0;
  virtual int end_capture() = 0;
  virtual void replay(int graph) = 0;
  virtual void release(int graph) noexcept = 0;

 protected:
  ~StepGraphFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
