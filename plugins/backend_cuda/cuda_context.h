// CudaContext: the device state every part of the CUDA backend shares — the device and what it
// is, the one stream, the caching allocator, the cuBLASLt engine, grow-only scratch, the pinned
// staging slots, the image input's copy stream and byte slots, the device-side error records of
// the label and id checks, and the cuDNN state of the convolutions and of flash attention.
// CudaBackend owns one; each facet object holds a reference to it.
//
// Contract
// - Construction selects `device` and throws sdk::BackendError carrying CUDA's own error text when
//   there is no usable device (no driver, no GPU, index out of range, no machine code for it);
//   nothing stays allocated then.
// - Lifetime: created before and destroyed after every facet object of its backend. Destruction
//   waits for the stream first, then for the copy stream (ByteUpload) before the staging slots
//   it may still read go.
// - Threading: one host thread at a time; activate() makes the device current on the calling
//   thread (or throws) and every call of a facet starts with it.
// - Scratch (tables, partial, partial2, flags, id_check) is shared by the facets: its contents are
//   valid only within one call, in stream order. Buffers grow only; while live_graphs > 0 they keep
//   every address a recorded graph holds (DeviceScratch::set_graph_guard).
// - Deferred errors: a kernel that finds a bad label (softmax_cross_entropy) or id (gather,
//   scatter_add) leaves it in a device record and sets labels_pending / ids_pending; sync() raises
//   it as sdk::BackendError after waiting for the stream.
// - Memory statistics: account_buffers() folds growth of the context's own buffers (grow-only
//   scratch, the convolution's and flash attention's workspaces, the image input's byte slots)
//   into the allocator's count; the fixed cuBLASLt workspace is not counted. buffer_bytes() is
//   what was folded in, the scratch facet's figure.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_access.h"
#include "cuda_allocator.h"
#include "cuda_backend_options.h"
#include "cuda_host_staging.h"
#include "cuda_kernel_types.h"
#include "cuda_scratch.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::backend_cuda {

class GemmEngine;             // cuda_gemm.h
class BlockScaledGemmEngine;  // cuda_block_scaled_gemm.h
class ByteUpload;             // cuda_byte_upload.h
struct ConvState;  // cuda_conv_plans.h
struct SdpaState;  // cuda_sdpa_graphs.h

class CudaContext {
 public:
  // On options.device; the other options configure the GEMM engine and flash attention
  // (cuda_backend_options.h).
  explicit CudaContext(const CudaOptions& options);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // Number of visible CUDA devices, or throws BackendError with CUDA's error text.
  static int device_count();

  // Makes the context's device current on this thread; throws BackendError with CUDA's text when
  // it cannot (a lost device), since every call after it would run on whichever device was current.
  void activate() const;
  // The same for destructors and noexcept releases: best effort, false when the device was not
  // made current.
  bool activate_quietly() const noexcept;
  // Waits for the stream, then raises any error a kernel left (bad labels, bad ids) or a launch
  // failure.
  void sync(const char* op);
  // Folds growth of the context's own buffers into the memory statistics.
  void account_buffers();
  // The own buffers as last folded in (what the scratch facet reports).
  std::size_t buffer_bytes() const { return buffer_bytes_; }
  // The device as sdk::BackendCapabilities describes it (GEMM input dtypes, features).
  sdk::BackendCapabilities capabilities() const;

  // Uploads the tensor and chunk tables of a multi-tensor op (through the pinned staging slots: no
  // wait on the stream); returns the number of chunks.
  template <class Ref>
  int upload_tables(const std::vector<Ref>& refs, const std::vector<std::int64_t>& numels,
                    const Ref** dev_refs, const kernels::Chunk** dev_chunks, const char* op);
  // Pinned host memory for `count` results read back, or nullptr when they do not fit.
  template <class T>
  T* host_result(std::size_t count) {
    if (count * sizeof(T) > kPinnedBytes) return nullptr;
    return static_cast<T*>(pinned_);
  }

  // The embedding ids' error record (allocated and cleared on first use).
  kernels::ErrorRecord* id_record(const char* op);
  // Frees scratch that recorded graphs kept alive and returns the allocator's retired blocks to its
  // cache; call with the stream idle and no graph left.
  void free_retired_scratch() noexcept;
  // cuDNN scratch: the convolution's and flash attention's (0 before either runs).
  std::size_t cudnn_bytes() const;
  // The image input's copy stream and two byte slots, created by the first decode_images.
  ByteUpload& byte_upload(const char* op);
#ifdef MIXTRAIN_HAVE_CUDNN
  // Created by the first convolution (cuDNN's handle loads its engine libraries).
  ConvState& conv_state();
#endif
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  // Created by the first flash-attention call or plan-time check.
  SdpaState& sdpa_state();
#endif

  // --- the device --------------------------------------------------------------------------
  const int device;
  int sm = 0;  // 90 for sm_90
  int multiprocessors = 0;
  std::string device_name;
  std::size_t total_memory = 0;
  std::size_t shared_memory_optin = 0;  // dynamic shared memory a block may opt in to, bytes
  const bool deterministic_attention;
  const bool deterministic_convolutions;
  const bool layernorm_backward_one_pass;  // cuda_layer_norm_plan.h
  const bool fp8_cast_transpose;           // the gemm facet offers cast_transpose (1.6)
  const bool fp8_gradient_cast;            // and cast_transpose_gradient (1.7)
  const bool conv_dgrad_accumulate;  // the convolution facet offers its accumulating dgrad (1.1)
  const int conv_autotune;           // candidates ConvPlans times per key (cuda_conv_plans.h)
  const bool conv_wgrad_in_operand_dtype;  // a 16-bit dw route first (conv::conv_routes)
  const bool conv_workspace;  // the convolution facet asks for the caller's workspace (1.2)
  // Logs text() (info) the first time `key` is said in this context; text() giving "" says nothing
  // (and may be asked again). Once said, a key costs a lookup: text() is not called.
  template <class Text>
  void say_once(std::string_view key, Text&& text) {
    if (said_.find(key) != said_.end()) return;
    const std::string said = text();
    if (said.empty()) return;
    said_.emplace(key);
    logger_.info(said);
  }

  // --- shared state (declaration order is destruction order, reversed) ---------------------
  cudaStream_t stream = nullptr;  // every op is enqueued on it, in call order
  CachingAllocator allocator;
  std::unique_ptr<GemmEngine> gemm;
  std::unique_ptr<BlockScaledGemmEngine> block_gemm;  // shares gemm's handle and workspace
  DeviceScratch tables, partial, partial2, flags;
  HostStaging staging;  // copy_from_host through pinned slots: no wait on the stream
  kernels::ErrorRecord* label_record = nullptr;  // device
  bool labels_pending = false;
  DeviceScratch id_check;  // kernels::ErrorRecord of gather / scatter_add (cuda_embedding.h)
  bool ids_pending = false;
  // A code per checking call, 1 .. 2^29: a device check claims its error record with it (atomicCAS
  // on the flag), so of the calls queued before the host reads the record the first failing one
  // keeps its row. Never 0 (the record's "no error").
  int next_check_code() {
    return static_cast<int>(check_sequence_++ % (1u << 29) + 1);
  }
  // Graphs recorded and not released (CudaStepGraph): while > 0 the scratch buffers keep every
  // address a graph holds, e.g. when an eval batch larger than the training one grows partial.
  int live_graphs = 0;
  std::unique_ptr<ByteUpload> bytes_in;  // decode_images' upload (nullptr before the first)
#ifdef MIXTRAIN_HAVE_CUDNN
  std::unique_ptr<ConvState> conv;
#endif
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  std::unique_ptr<SdpaState> sdpa;
#endif

 private:
  static constexpr std::size_t kPinnedBytes = 4096;

  void check_deferred_errors();
  void check_id_errors();
  // Clears the label-error record on the stream (ordered before later kernels).
  void reset_label_record(const char* op);

  unsigned check_sequence_ = 0;   // next_check_code()'s
  void* pinned_ = nullptr;        // host, kPinnedBytes for results read back
  std::size_t buffer_bytes_ = 0;  // own buffers already folded into the statistics
  std::vector<unsigned char> host_tables_;
  sdk::Logger logger_;          // CudaOptions::logger
  std::set<std::string, std::less<>> said_;  // say_once's keys
};

template <class Ref>
int CudaContext::upload_tables(const std::vector<Ref>& refs,
                               const std::vector<std::int64_t>& numels, const Ref** dev_refs,
                               const kernels::Chunk** dev_chunks, const char* op) {
  std::vector<kernels::Chunk> chunks;
  for (std::size_t t = 0; t < numels.size(); ++t)
    for (std::int64_t b = 0; b < numels[t]; b += kernels::kChunkElems)
      chunks.push_back({static_cast<std::int32_t>(t),
                        static_cast<std::int32_t>(std::min(kernels::kChunkElems, numels[t] - b)),
                        b});
  if (chunks.size() > static_cast<std::size_t>(INT32_MAX))
    fail(op, "too many elements for one call", "split the tensor list");
  const std::size_t refs_bytes = (refs.size() * sizeof(Ref) + 255) / 256 * 256;
  const std::size_t total = refs_bytes + chunks.size() * sizeof(kernels::Chunk);
  host_tables_.resize(std::max<std::size_t>(total, 1));
  if (!refs.empty()) std::memcpy(host_tables_.data(), refs.data(), refs.size() * sizeof(Ref));
  if (!chunks.empty())
    std::memcpy(host_tables_.data() + refs_bytes, chunks.data(),
                chunks.size() * sizeof(kernels::Chunk));
  auto* dev = static_cast<unsigned char*>(tables.get(std::max<std::size_t>(total, 1), stream, op));
  account_buffers();
  // Through the pinned staging slots: no wait on the stream, and the host vector is free for the
  // next op on return.
  staging.copy(dev, host_tables_.data(), total, stream, op);
  *dev_refs = reinterpret_cast<const Ref*>(dev);
  *dev_chunks = reinterpret_cast<const kernels::Chunk*>(dev + refs_bytes);
  return static_cast<int>(chunks.size());
}

}  // namespace mixtrain::backend_cuda
