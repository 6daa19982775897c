// CpuContext: what the CPU backend's facet objects share (FacetRegistry's Context for
// backend_cpu): the thread count, the oneDNN engines and primitive caches, the bf16-convolution
// and Winograd decisions, and the memory accounting.
//
// Contract
// - One per CpuBackend, owned by it and declared before its facet objects, which hold a
//   reference to it and must not outlive it. Not copyable or movable (the facets point at it).
// - use_threads() makes the calling thread's OpenMP team (shared by oneDNN) threads() wide; every
//   facet op calls it first, as ops run synchronously on the caller's thread.
// - Memory: allocate() returns 64-byte aligned host memory and records it; deallocate() frees
//   only what allocate() returned (anything else, nullptr included, is ignored). account_scratch()
//   folds growth of the GEMM's, the primitive cache's and the eltwise engine's scratch
//   (grow-only) into current / peak bytes, not into the allocation count; the facets that use
//   scratch call it after each op.
//   scratch_bytes() is that scratch as last folded in (what the scratch facet reports).
//   Statistics are guarded by a mutex; the destructor frees what is still allocated.
// - The bf16-convolution and Winograd decisions are probed once (lazily, on first use) by asking
//   oneDNN which kernel a ResNet-like convolution runs (cpu_conv_decisions.cpp); the rules for
//   gradients as GEMMs and for flash attention's bf16 tile products read the CPU's features once.
// - Errors: sdk::BackendError (a negative thread count; an allocation the host cannot serve).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cpu_conv_algorithm.h"
#include "cpu_conv_gemm_rule.h"
#include "cpu_flash_attention.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::backend_cpu {

class GemmEngine;      // cpu_gemm.h
class EltwiseEngine;   // cpu_eltwise.h
class PrimitiveCache;  // cpu_primitive_cache.h

// How bf16 x bf16 GEMMs run: `automatic` decides from the CPU's features at run time.
enum class Bf16GemmPath { automatic, onednn, emulated };
// How bf16 convolutions (x and w, or dy and w, or x and dy both bf16) run: `automatic` uses
// oneDNN's bf16 convolution where the CPU has bf16 dot-product instructions (AVX512-BF16 or
// AMX-BF16) and oneDNN has a JIT kernel for it; `emulated` decodes to fp32 exactly.
enum class Bf16ConvPath { automatic, onednn, emulated };
// Which algorithm convolutions use. `direct` (the default and the reference) runs oneDNN's direct
// convolution: in nhwc, or in oneDNN's blocked layout where cpu_conv_algorithm.h's rule says that
// pays on this CPU (3x3 convolutions on AVX2). `winograd` runs oneDNN's Winograd F(4,3) for the
// fp32 3x3 / stride 1 / dilation 1 / groups 1 convolutions where the static rule of
// cpu_conv_algorithm.h says it pays (per direction and shape) and oneDNN has a JIT kernel for it;
// everything else as `direct`. Winograd rounds differently from a direct sum (its transforms add
// terms of other magnitudes), so it is opt-in. C++ only, not plugin options, for the
// measurements behind the rules and for tests on any CPU: `winograd_everywhere` skips the
// Winograd rule (Winograd for every shape it can compute); `direct_nhwc` never takes the blocked
// layout; `blocked_everywhere` takes it for every direct convolution oneDNN has a JIT kernel for.
enum class ConvAlgorithm { direct, winograd, winograd_everywhere, direct_nhwc, blocked_everywhere };

class CpuContext {
 public:
  CpuContext(int threads, Bf16GemmPath bf16_gemm, Bf16ConvPath bf16_conv,
             ConvAlgorithm conv_algorithm);
  ~CpuContext();
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;

  int threads() const noexcept { return threads_; }
  // Makes this thread's OpenMP team size (shared by oneDNN) equal to threads().
  void use_threads() const;

  GemmEngine& gemm() const noexcept { return *gemm_; }
  EltwiseEngine& eltwise() const noexcept { return *eltwise_; }
  // Convolution and pooling primitives and their scratch.
  PrimitiveCache& prims() const noexcept { return *prims_; }

  // --- convolution decisions (cpu_conv_decisions.cpp) ------------------------------------------
  // True when bf16 convolutions run in oneDNN's bf16 kernels, false when emulated; and why.
  bool bf16_conv_native() const;
  std::string bf16_conv_note() const;
  ConvAlgorithm conv_algorithm() const noexcept { return conv_algorithm_; }
  // Whether oneDNN has a (non-reference) fp32 Winograd convolution on this CPU.
  bool conv_winograd_available() const;
  std::string conv_algorithm_note() const;
  // conv_algorithm is winograd (or winograd_everywhere) and oneDNN has a Winograd kernel here.
  bool winograd_on() const {
    return (conv_algorithm_ == ConvAlgorithm::winograd ||
            conv_algorithm_ == ConvAlgorithm::winograd_everywhere) &&
           conv_winograd_available();
  }
  // Whether oneDNN's direct kernel for an nhwc fp32 3x3 convolution here is its AVX2 one
  // (jit:avx2), where the blocked layout pays (cpu_conv_algorithm.h); probed once.
  bool blocked_layout_pays() const;
  // Whether a direct convolution of this direction and shape takes the blocked layout: the rule
  // where the algorithm allows it (not direct_nhwc), every shape under blocked_everywhere.
  bool blocked_layout_for(Direction dir, const sdk::Conv2dGeometry& g) const;
  // Whether a convolution takes its scratch from the caller's workspace (convolution facet 1.2;
  // the option conv_workspace, default true), or keeps it in the primitive cache's slots.
  bool conv_workspace() const noexcept { return conv_workspace_; }
  void set_conv_workspace(bool on) noexcept { conv_workspace_ = on; }
  // The `conv_gemm` option (cpu_conv_gemm_rule.h): which convolutions run as one GEMM.
  ConvGemm conv_gemm() const noexcept { return conv_gemm_; }
  void set_conv_gemm(ConvGemm choice) noexcept { conv_gemm_ = choice; }
  // Whether this weight gradient runs as one GEMM (cpu_conv_gemm_rule.h's rule for the operands
  // its route reads); an fp8 dy with a bias gradient never does.
  bool wgrad_as_gemm(const sdk::Conv2dGeometry& g, ConvGemmOperands operands,
                     bool fp8_dy_with_bias) const;
  // Whether this data gradient (accumulating: into an fp32 dx) runs as one GEMM
  // (cpu_conv_gemm_rule.h's rule), and whether the facet offers conv2d_backward_data_accumulate
  // for these {dy, w, dx} dtypes (it does where the rule can take a 1x1 one; other shapes then
  // run the convolution into fp32 scratch and an add).
  bool dgrad_as_gemm(const sdk::Conv2dGeometry& g, ConvGemmOperands operands, sdk::DType dx,
                     bool accumulate) const;
  bool offers_dgrad_accumulate(sdk::DType dy, sdk::DType w, sdk::DType dx) const;
  // Whether this forward runs as one GEMM (cpu_conv_gemm_rule.h's rule for the operands its route
  // reads).
  bool fprop_as_gemm(const sdk::Conv2dGeometry& g, ConvGemmOperands operands) const;
  // A line saying which convolutions run as GEMMs here, and why.
  std::string conv_gemm_note() const;
  // oneDNN's implementation of the last convolution primitive run ("gemm " and the matmul's for a
  // gradient run as a GEMM).
  const std::string& last_conv_implementation() const noexcept { return last_conv_impl_; }
  void record_conv_implementation(const std::string& implementation) {
    last_conv_impl_ = implementation;
  }

  // --- flash attention (cpu_flash_attention.h) ---------------------------------------------------
  // The `flash_products` option: `automatic` takes bf16 tile products for bf16 q, k and v where
  // the CPU has AMX-BF16 and the GEMM engine's bf16 GEMMs are native, fp32 ones elsewhere.
  void set_flash_products(FlashProductsChoice choice) noexcept { flash_products_ = choice; }
  // The products flash attention runs for q, k and v of this dtype: FP32 wherever oneDNN has no
  // bf16 matmul (Bf16TileMatmul::available()), whatever the option says.
  FlashProducts flash_products(sdk::DType qkv) const;
  // A line saying which products flash attention runs here, and why.
  std::string flash_products_note() const;

  // --- memory ----------------------------------------------------------------------------------
  void* allocate(std::size_t bytes);
  void deallocate(void* ptr) noexcept;
  sdk::MemoryStats memory_stats() const;
  void account_scratch();
  std::size_t scratch_bytes() const;

 private:
  int threads_;
  std::unique_ptr<GemmEngine> gemm_;
  std::unique_ptr<EltwiseEngine> eltwise_;
  std::unique_ptr<PrimitiveCache> prims_;  // conv, pooling; scratch (mutable through const)
  Bf16ConvPath bf16_conv_request_;
  bool conv_workspace_ = true;
  mutable int bf16_conv_state_ = -1;  // -1 undecided, 0 emulated, 1 oneDNN
  mutable std::string bf16_conv_note_;
  ConvAlgorithm conv_algorithm_;
  std::string direct_note() const;
  mutable int blocked_state_ = -1;     // -1 unprobed, 0 nhwc everywhere, 1 the blocked rule
  mutable std::string direct_impl_;    // blocked_layout_pays()'s probe: the nhwc 3x3 kernel
  mutable int winograd_state_ = -1;    // -1 unprobed, 0 unavailable, 1 available
  mutable std::string winograd_impl_;  // the probe's implementation name, or why none
  ConvGemm conv_gemm_ = ConvGemm::automatic;
  FlashProductsChoice flash_products_ = FlashProductsChoice::automatic;
  mutable int amx_state_ = -1;  // -1 undetected, 0 no AMX-BF16, 1 AMX-BF16
  bool has_amx_bf16() const;
  bool amx_bf16_gemms() const;  // AMX-BF16 and the GEMM engine's bf16 GEMMs native
  std::string last_conv_impl_;

  mutable std::mutex memory_mutex_;
  std::unordered_map<void*, std::size_t> live_;
  std::size_t current_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace mixtrain::backend_cpu
