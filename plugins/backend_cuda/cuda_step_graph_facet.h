// CudaStepGraph: the CUDA backend's StepGraphFacet (sdk/backend_step_graph.h): a step recorded by
// stream capture of the context's stream into a CUDA graph (thread-local mode), one
// cudaGraphExec per id, replayed with one cudaGraphLaunch.
//
// Contract (in addition to sdk/backend_step_graph.h)
// - While recording, host uploads raise BackendError (HostStaging), as do waits and device
//   allocations (CUDA refuses them in a capture; check_cuda raises).
// - A recorded graph that holds a label or id check arms that deferred error when replayed, as
//   the calls did.
// - While graphs live, the context's scratch keeps every address they hold; the last release
//   frees what was retired meanwhile. Destruction waits for the stream, then frees every graph.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_step_graph.h"

namespace mixtrain::backend_cuda {

class CudaStepGraph final : public sdk::StepGraphFacet {
 public:
  explicit CudaStepGraph(CudaContext& context) : context_(context) {}

  ~CudaStepGraph() override;
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;

  bool begin_capture() override;
  int end_capture() override;
  void replay(int graph) override;
  void release(int graph) noexcept override;

 private:
  struct RecordedGraph {
    cudaGraphExec_t exec = nullptr;
    // It holds a label or id check: replaying arms that deferred error, as the calls did.
    bool checks_labels = false, checks_ids = false;
  };
  CudaContext& context_;
  std::vector<RecordedGraph> graphs_;
  bool recording_ = false;
};

}  // namespace mixtrain::backend_cuda
