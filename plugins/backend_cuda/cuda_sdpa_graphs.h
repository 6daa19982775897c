// SdpaGraphs: the CUDA backend's flash attention, cuDNN's fused scaled dot-product attention
// (SDPA) forward and backward graphs built through the cuDNN frontend, cached per shape. Compiled
// only when CMake finds the frontend's headers and cuDNN 9 (MIXTRAIN_HAVE_CUDNN_FRONTEND); the
// frontend's headers stay inside cuda_sdpa_graphs.cpp.
//
// Contract
// - Layouts, dims and strides: cuda_sdpa_rules.h. Causal (query i sees keys j <= i), softmax
//   scaled by key.scale, statistics (the row log-sum-exp, FP32) written by forward and read by
//   backward; compute FP32, io in key.dtype (fp16 or bf16).
// - refusal(key) builds (and caches) both graphs for the key and returns "" or cuDNN's reason for
//   declining one; forward() and backward() build on first use too and raise sdk::BackendError
//   naming the key and cuDNN's reason when cuDNN declines it.
// - The backward runs cuDNN's deterministic kernels when key.deterministic (no atomics: the same
//   bits every run).
// - Pointers: qkv, out, dout and dqkv 16-byte aligned (the caller's tensors are; k's and v's views
//   are when H·D is a multiple of 8, which static_refusal() requires). `workspace` holds at least
//   workspace_bytes(key) bytes.
// - Thread safety: one host thread at a time (the backend's).
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_cudnn.h"
#include "cuda_scratch.h"
#include "cuda_sdpa_rules.h"

namespace mixtrain::backend_cuda {

class SdpaGraphs {
 public:
  SdpaGraphs();
  ~SdpaGraphs();
  SdpaGraphs(const SdpaGraphs&) = delete;
  SdpaGraphs& operator=(const SdpaGraphs&) = delete;

  std::string refusal(const sdpa::Key& key, cudnnHandle_t handle);
  // Both graphs of the key as refusal() builds them, through the frontend's validate() only, for
  // the architecture sm (90: Hopper): its checks of the inputs' dims against each other, the
  // dtypes and the options (the head dim's multiple of 8, the mask), on the host (no handle, no
  // device). It does not check the outputs' strides (cuda_sdpa_rules' tests do). "" or the first
  // graph's reason; what a device decides (the engines, their support) stays refusal()'s.
  static std::string host_validate(const sdpa::Key& key, int sm);
  // The larger of the two graphs' workspaces.
  std::int64_t workspace_bytes(const sdpa::Key& key, cudnnHandle_t handle, const char* op);
  void forward(const sdpa::Key& key, cudnnHandle_t handle, const void* qkv, void* out, float* lse,
               void* workspace, const char* op);
  void backward(const sdpa::Key& key, cudnnHandle_t handle, const void* qkv, const void* out,
                const void* dout, const float* lse, void* dqkv, void* workspace, const char* op);
  // One line per key: its shape and workspace, or why cuDNN declined it.
  std::vector<std::string> report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The backend's flash-attention state, created on the first flash call or refusal asked: the cuDNN
// handle, the graphs, and cuDNN's grow-only workspace.
struct SdpaState {
  CudnnHandle handle;
  SdpaGraphs graphs;
  DeviceScratch workspace;
  std::size_t device_bytes() const { return workspace.capacity(); }
};

}  // namespace mixtrain::backend_cuda
