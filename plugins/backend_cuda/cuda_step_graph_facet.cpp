// CudaStepGraph: stream capture into CUDA graphs, their replay and release.
//
// Why thread-local capture mode: it refuses, inside this thread, the calls that cannot be
// recorded (cudaMalloc, a stream or event wait, a blocking copy) by failing them, which check_cuda
// turns into BackendError; the trainer then voids the recording and runs the step op by op. Other
// threads (a data loader, another backend) are not affected, as they would be in global mode.
#include <cuda_runtime_api.h>

#include <string>

#include "cuda_access.h"
#include "cuda_step_graph_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

CudaStepGraph::~CudaStepGraph() {
  context_.activate_quietly();
  // A launch may still be running: cudaGraphExecDestroy does not wait for it.
  cudaStreamSynchronize(context_.stream);
  for (auto& g : graphs_)
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
}

bool CudaStepGraph::begin_capture() {
  context_.activate();
  if (recording_) return false;
  // Errors the stream already holds belong to earlier ops: raise them before recording starts.
  context_.sync("begin_capture");
  // Every block the recording may touch keeps its address for the graph's life (cuda_allocator.h).
  // Held before the capture begins: holding can throw (host memory), and nothing may throw once
  // the stream captures, since the caller would not end a capture begin_capture did not return.
  const auto undo_hold = [&] {
    context_.allocator.end_recording();
    if (context_.live_graphs == 0) context_.allocator.release_held();
  };
  try {
    context_.allocator.hold_for_recording();
  } catch (...) {
    undo_hold();
    throw;
  }
  const cudaError_t began =
      cudaStreamBeginCapture(context_.stream, cudaStreamCaptureModeThreadLocal);
  if (began != cudaSuccess) {
    undo_hold();
    check_cuda(began, "begin_capture", "cudaStreamBeginCapture");
  }
  // sync() raised or cleared every deferred check, so what the recorded calls arm is theirs.
  recording_ = true;
  context_.staging.set_recording(true);
  return true;
}

int CudaStepGraph::end_capture() {
  context_.activate();
  if (!recording_) return -1;
  recording_ = false;
  context_.staging.set_recording(false);
  context_.allocator.end_recording();
  // No graph came of it and none lives: nothing holds the retired blocks. (The recorded work
  // never ran; the earlier ops' use of a block is ordered by the one stream, as always.)
  const auto no_graph = [&] {
    if (context_.live_graphs == 0) context_.allocator.release_held();
    return -1;
  };
  // Nothing recorded has run: no check is pending yet; replay() arms them.
  const bool checks_labels = context_.labels_pending, checks_ids = context_.ids_pending;
  context_.labels_pending = context_.ids_pending = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(context_.stream, &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    // An op the capture refused invalidated it; clear the error so the next op does not see it.
    (void)cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return no_graph();
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    (void)cudaGetLastError();
    return no_graph();
  }
  graphs_.push_back({exec, checks_labels, checks_ids});
  ++context_.live_graphs;
  return static_cast<int>(graphs_.size()) - 1;
}

void CudaStepGraph::replay(int graph) {
  context_.activate();
  if (graph < 0 || graph >= static_cast<int>(graphs_.size()) || graphs_[graph].exec == nullptr)
    fail("replay", "graph " + std::to_string(graph) + " was never recorded or was released",
         "replay an id end_capture() returned and release() has not freed");
  check_cuda(cudaGraphLaunch(graphs_[graph].exec, context_.stream), "replay", "cudaGraphLaunch");
  context_.labels_pending = context_.labels_pending || graphs_[graph].checks_labels;
  context_.ids_pending = context_.ids_pending || graphs_[graph].checks_ids;
}

void CudaStepGraph::release(int graph) noexcept {
  if (graph < 0 || graph >= static_cast<int>(graphs_.size())) return;
  context_.activate_quietly();
  if (graphs_[graph].exec != nullptr) {
    // A launch may still be running: the stream's order protects it, cudaGraphExecDestroy does not
    // wait for it.
    cudaStreamSynchronize(context_.stream);
    cudaGraphExecDestroy(graphs_[graph].exec);
    // The last graph gone (and the stream idle): scratch outgrown while graphs lived is freed.
    if (--context_.live_graphs == 0) {
      context_.free_retired_scratch();
    }
  }
  graphs_[graph].exec = nullptr;
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::StepGraphFacet, CudaStepGraph> kCudaStepGraphRegistration;

}  // namespace mixtrain::backend_cuda
