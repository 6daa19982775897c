// DeviceBackend: memory, copies, casts and fill on one device, plus optional facets of kernels.
//
// Contract
// - The required core (this class): capabilities, memory, copies, cast, fill, synchronize.
// - Everything else lives in facets (facet.h), each in its own header, backend_<facet>.h, and
//   versioned on its own (major.minor); docs/architecture.md's facet table lists them. The host
//   asks for a facet by name, major and minimum minor (sdk::facet<F>(backend)); a backend answers
//   find_facet(name) with the facet or nullptr (the default). Adding a facet never changes this
//   class. Each facet answers supports(op, dtypes) (by default from the SDK's table,
//   op_signatures.h); the host asks before the first step, so a model that needs a missing facet,
//   op or dtype stops at plan time naming them.
// - Memory: allocate() returns 64-byte aligned device memory (host memory for the CPU) or throws
//   BackendError naming the bytes asked and free; deallocate(nullptr) is a no-op. memory_stats()
//   counts live bytes allocated through this backend and their peak.
// - Tensors are TensorViews into memory this backend allocated, contiguous row-major. Shapes are
//   given per op as [rows, cols]; a view of rank > 2 is folded to [rows(), cols()].
// - Floating-point math runs in FP32 whatever the storage dtype (fp32, bf16, fp16; fp8 where the
//   op says so); reductions and statistics are FP32 (or wider).
// - Ops are enqueued in order on one stream; only copy_to_host, synchronize() and the facet
//   methods returning host values synchronise.
// - Errors: a dtype or shape the backend cannot run raises BackendError listing what it can.
// - Threading: one backend object is used by one host thread at a time.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/component.h"
#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

struct MemoryStats {
  std::size_t current_bytes = 0;
  std::size_t peak_bytes = 0;
  std::size_t allocations = 0;  // live allocations
};

struct DTypeSupport {
  DType dtype;
  bool native = false;  // runs on hardware units for this format (e.g. AMX / AVX512-BF16)
  std::string how;      // "oneDNN brgemm avx512_core_amx", "emulated: RNE rounding + fp32 GEMM"
};

struct BackendCapabilities {
  std::string kind;         // "cpu", "cuda"
  std::string device_name;  // "Intel Xeon ... (2 threads)"
  std::size_t memory_bytes = 0;
  int threads = 1;
  std::vector<DTypeSupport>
      gemm_inputs;                    // every dtype the gemm facet accepts for A/B (how it runs it)
  std::vector<std::string> features;  // "avx512f", "avx512_bf16", "amx_bf16", "f16c", ...

  const DTypeSupport* find(DType t) const {
    for (const auto& s : gemm_inputs)
      if (s.dtype == t) return &s;
    return nullptr;
  }
  bool supports(DType t) const { return find(t) != nullptr; }
  bool native(DType t) const {
    auto* s = find(t);
    return s != nullptr && s->native;
  }
};

// dst = saturate?(src * scale) in dst.dtype, round-to-nearest-even; when `amax` (fp32 [1]) is
// given, amax[0] = max(amax[0], max|src|) over the unscaled source. `saturate` clamps to the
// format's largest finite value instead of producing inf (fp8_e4m3 has no inf: NaN when off).
struct CastArgs {
  float scale = 1.0f;
  bool saturate = false;
  TensorView amax;
};

class MIXTRAIN_SDK_API DeviceBackend : public Component {
 public:
  ~DeviceBackend() override;
  virtual BackendCapabilities capabilities() const = 0;

  // --- memory and copies ---------------------------------------------------------------------
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr) noexcept = 0;
  virtual MemoryStats memory_stats() const = 0;
  // dst.bytes() bytes, read before the call returns; from a HostBuffer (backend_host_memory.h),
  // in stream order instead.
  virtual void copy_from_host(TensorView dst, const void* src) = 0;
  virtual void copy_to_host(void* dst, TensorView src) = 0;
  // Same dtype and numel; dst and src are one tensor or disjoint (a partial overlap is refused:
  // BackendArgumentChecks::copy_args).
  virtual void copy(TensorView dst, TensorView src) = 0;
  virtual void synchronize() = 0;  // waits for every enqueued op (benchmarks time with it)

  // --- casts and fill --------------------------------------------------------------------------
  virtual void cast(TensorView src, TensorView dst, const CastArgs& args = {}) = 0;
  virtual void fill(TensorView x, float value) = 0;  // any storage dtype

  // --- facets --------------------------------------------------------------------------------
  // The facet named `name` (a facet's kName), converted from that facet's own class (so that
  // sdk::facet<F> may cast it back), or nullptr when the backend has none. It lives as long as
  // the backend (an object it owns, made over its device context: support/facet_registry.h; or
  // the backend itself, through facet_among in facet.h).
  virtual Facet* find_facet(std::string_view /*name*/) { return nullptr; }
};

// The backend's facet F when it has one of F's major and a minor >= min_minor, else nullptr.
// "At least" is safe because a facet's minor steps only append methods (facet.h). Call it once,
// when planning, and keep the pointer: it compares names.
template <class F>
F* facet(DeviceBackend& backend, std::uint16_t min_minor = F::kVersion.minor) {
  Facet* f = backend.find_facet(F::kName);
  return facet_serves<F>(f, min_minor) ? static_cast<F*>(f) : nullptr;
}

}  // namespace mixtrain::sdk
