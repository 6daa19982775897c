// CudaBackend's StepGraphFacet (sdk/backend_step_graph.h): a step recorded by stream capture into
// a CUDA graph and replayed with one cudaGraphLaunch.
//
// Why thread-local capture mode: it refuses, inside this thread, the calls that cannot be
// recorded (cudaMalloc, a stream or event wait, a blocking copy) by failing them, which check_cuda
// turns into BackendError; the trainer then voids the recording and runs the step op by op. Other
// threads (a data loader, another backend) are not affected, as they would be in global mode.
#include <cuda_runtime_api.h>

#include <string>

#include "cuda_access.h"
#include "cuda_backend.h"
#include "cuda_gemm.h"
#ifdef MIXTRAIN_HAVE_CUDNN
#include "cuda_conv_plans.h"
#endif

namespace mixtrain::backend_cuda {

bool CudaBackend::begin_capture() {
  activate();
  if (recording_) return false;
  // Errors the stream already holds belong to earlier ops: raise them before recording starts.
  sync("begin_capture");
  check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin_capture",
             "cudaStreamBeginCapture");
  // sync() raised or cleared every deferred check, so what the recorded calls arm is theirs.
  recording_ = true;
  staging_.set_recording(true);
  return true;
}

int CudaBackend::end_capture() {
  activate();
  if (!recording_) return -1;
  recording_ = false;
  staging_.set_recording(false);
  // Nothing recorded has run: no check is pending yet; replay() arms them.
  const bool checks_labels = labels_pending_, checks_ids = ids_pending_;
  labels_pending_ = ids_pending_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    // An op the capture refused invalidated it; clear the error so the next op does not see it.
    (void)cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return -1;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  graphs_.push_back({exec, checks_labels, checks_ids});
  ++live_graphs_;
  return static_cast<int>(graphs_.size()) - 1;
}

void CudaBackend::replay(int graph) {
  activate();
  if (graph < 0 || graph >= static_cast<int>(graphs_.size()) || graphs_[graph].exec == nullptr)
    fail("replay", "graph " + std::to_string(graph) + " was never recorded or was released",
         "replay an id end_capture() returned and release() has not freed");
  check_cuda(cudaGraphLaunch(graphs_[graph].exec, stream_), "replay", "cudaGraphLaunch");
  labels_pending_ = labels_pending_ || graphs_[graph].checks_labels;
  ids_pending_ = ids_pending_ || graphs_[graph].checks_ids;
}

void CudaBackend::release(int graph) noexcept {
  if (graph < 0 || graph >= static_cast<int>(graphs_.size())) return;
  activate();
  if (graphs_[graph].exec != nullptr) {
    // A launch may still be running: the stream's order protects it, cudaGraphExecDestroy does not
    // wait for it.
    cudaStreamSynchronize(stream_);
    cudaGraphExecDestroy(graphs_[graph].exec);
    // The last graph gone (and the stream idle): scratch outgrown while graphs lived is freed.
    if (--live_graphs_ == 0) {
      gemm_->free_retired_scratch();
      for (DeviceScratch* s : {&tables_, &partial_, &partial2_, &flags_, &id_check_})
        s->free_retired();
#ifdef MIXTRAIN_HAVE_CUDNN
      if (conv_)
        for (DeviceScratch* s : {&conv_->workspace, &conv_->a, &conv_->b, &conv_->out})
          s->free_retired();
#endif
    }
  }
  graphs_[graph].exec = nullptr;
}

}  // namespace mixtrain::backend_cuda
