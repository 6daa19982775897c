// CpuBackend: the CPU DeviceBackend and the numerical reference for every other backend.
//
// Contract (in addition to sdk/device_backend.h)
// - Memory is host memory, 64-byte aligned, tracked per backend object (thread-safe stats).
// - GEMM runs through cached oneDNN matmul primitives with FP32 accumulation: fp32 natively;
//   bf16 natively through oneDNN's bf16 matmul where the CPU has AMX-BF16 / AVX512-BF16 (decided
//   at run time, see cpu_gemm.h) else emulated; tf32, fp16 and fp8 (its codes; scale_inv scales
//   the result with alpha) emulated by exact decoding (tf32: RNE rounding) into scratch + the
//   fp32 matmul. A bf16/fp16 C is the fp32
//   result rounded once (RNE). capabilities() says which is which and names oneDNN's kernels.
// - Every format conversion is sdk/float_formats.h (one definition of each format).
// - memory_stats() includes the grow-only scratch of the GEMM (decoded operands, fp32 C) and of
//   the convolution, pooling and batch-norm kernels in current/peak bytes, not in the allocation
//   count; the scratch facet reports that part alone. oneDNN's own scratchpad is not counted.
// - Kernels on small tensors (< kParallelMin elements, cpu_access.h) run on the calling thread.
// - Element-wise kernels accept fp32 / bf16 / fp16 storage where the SDK says "storage dtype"
//   and compute in fp32; reductions are fp32 or double.
// - Threading: one OpenMP pool shared with oneDNN; `threads` (0 = OMP_NUM_THREADS, else all
//   cores) is applied with omp_set_num_threads on the calling thread before every op. Ops run
//   synchronously, so synchronize() is a no-op.
// - Facets: all fourteen (gemm, activation, residual, gradient_check, foreach, layer_norm,
//   batch_norm, loss, optimizer, attention, embedding, convolution, dropout, scratch), each an
//   object of its own source file under facets/ made over the backend's CpuContext (cpu_context.h)
//   and registered with sdk/support/facet_registry.h; find_facet answers from that set. supports()
//   is the SDK's table (op_signatures.h) unnarrowed: every dtype it lists runs, natively or
//   emulated (which one is capabilities()' business, not supports()').
// - Convolution and pooling run oneDNN primitives created once per (geometry, dtypes,
//   op) and cached (cpu_primitive_cache.h); activations are channels-last (nhwc) end to end, and
//   weights are reordered from PyTorch's OIHW into the layout the primitive prefers by a cached
//   reorder. bf16 convolutions run natively where the CPU has bf16 dot products (see
//   bf16_conv_native()), everything else on the exact fp32 values (facets/cpu_convolution.cpp).
//   With conv_algorithm = winograd, eligible pure fp32 3x3 convolutions run oneDNN's Winograd
//   F(4,3) with their activations reordered to and from oneDNN's blocked layout around the call.
// - gemm_strided_batched runs one cached 3-D oneDNN matmul where one can express the call
//   (cpu_gemm.h) and a loop over gemm() otherwise.
// - flush_denormals() (the `flush_denormals` option) flushes subnormal floats to zero on the
//   backend's threads for the backend's lifetime (cpu_denormals.h).
// - Errors: sdk::BackendError naming the op, the offending tensor, its dtype/shape, and a fix.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cpu_context.h"
#include "cpu_denormals.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"  // the interfaces find_facet serves, for its callers
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

// The backend is the DeviceBackend core and its diagnostics; its facets are objects over its
// context, found by name (sdk::facet<F>(backend) reaches them).
class CpuBackend final : public sdk::DeviceBackend {
 public:
  explicit CpuBackend(int threads = 0, Bf16GemmPath bf16_gemm = Bf16GemmPath::automatic,
                      Bf16ConvPath bf16_conv = Bf16ConvPath::automatic,
                      ConvAlgorithm conv_algorithm = ConvAlgorithm::direct);
  ~CpuBackend() override;

  int threads() const noexcept { return context_.threads(); }
  // Subnormal operands and results become 0 on this backend's threads until it is destroyed
  // (cpu_denormals.h); BackendError where the CPU has no such mode.
  void flush_denormals();
  bool flushes_denormals() const noexcept { return flush_ != nullptr; }
  // The `conv_workspace` option: false keeps every convolution's scratch in the backend's own
  // slots (conv2d_workspace_bytes answers 0), as before convolution facet 1.2.
  void set_conv_workspace(bool on) noexcept { context_.set_conv_workspace(on); }
  // The `conv_gemm` option (cpu_conv_gemm_rule.h): which convolutions run as one GEMM,
  // and a line saying which do here.
  void set_conv_gemm(ConvGemm choice) noexcept { context_.set_conv_gemm(choice); }
  std::string conv_gemm_note() const { return context_.conv_gemm_note(); }
  // The `flash_products` option (cpu_flash_attention.h): flash attention's tile products in bf16
  // or FP32, and a line saying which run here.
  void set_flash_products(FlashProductsChoice choice) noexcept {
    context_.set_flash_products(choice);
  }
  std::string flash_products_note() const { return context_.flash_products_note(); }
  // oneDNN matmul primitives created so far (one per distinct GEMM key); for tests and tuning.
  std::size_t cached_gemm_primitives() const noexcept;
  // oneDNN's implementation ("gemm:jit", "brg:avx512_core", ...) of the last GEMM primitive run
  // by gemm() or gemm_strided_batched(); for tests and tuning.
  std::string last_gemm_implementation() const;
  // True when bf16 x bf16 GEMMs run in oneDNN's bf16 matmul here, false when emulated.
  bool bf16_gemm_native() const;
  // oneDNN primitives (convolution, pooling, with their reorders) created so far, one entry per
  // distinct (op, algorithm, geometry, dtypes, flags); a Winograd key oneDNN cannot serve is an
  // entry too (it records why, and the call runs direct); for tests.
  std::size_t cached_dnnl_primitives() const noexcept;
  // True when bf16 convolutions run in oneDNN's bf16 kernels, false when emulated; and why.
  bool bf16_conv_native() const { return context_.bf16_conv_native(); }
  std::string bf16_conv_note() const { return context_.bf16_conv_note(); }
  // oneDNN's implementation of the last convolution primitive run ("brgconv:avx512_core",
  // "jit_wino_4x3:avx512_core", ...).
  const std::string& last_conv_implementation() const noexcept {
    return context_.last_conv_implementation();
  }
  // The requested convolution algorithm; whether oneDNN has a (non-reference) fp32 Winograd
  // convolution on this CPU; and a line saying what runs ("conv_algorithm = direct", or the
  // Winograd kernel and the rule, or why Winograd is unavailable).
  ConvAlgorithm conv_algorithm() const noexcept { return context_.conv_algorithm(); }
  bool conv_winograd_available() const { return context_.conv_winograd_available(); }
  std::string conv_algorithm_note() const { return context_.conv_algorithm_note(); }
  // Σ x² in double over storage-dtype tensors (what unscale_check_and_sum_squares reports).
  double sum_of_squares(std::span<const sdk::TensorView> tensors) const;

  sdk::BackendCapabilities capabilities() const override;

  void* allocate(std::size_t bytes) override { return context_.allocate(bytes); }
  void deallocate(void* ptr) noexcept override { context_.deallocate(ptr); }
  sdk::MemoryStats memory_stats() const override { return context_.memory_stats(); }
  void copy_from_host(sdk::TensorView dst, const void* src) override;
  void copy_to_host(void* dst, sdk::TensorView src) override;
  void copy(sdk::TensorView dst, sdk::TensorView src) override;
  void synchronize() override {}
  void cast(sdk::TensorView src, sdk::TensorView dst, const sdk::CastArgs& args = {}) override;
  void fill(sdk::TensorView x, float value) override;

  sdk::Facet* find_facet(std::string_view name) override { return facets_.find(name); }

 private:
  CpuContext context_;
  sdk::FacetSet facets_ = sdk::make_facets(context_);  // after context_: they refer to it
  std::unique_ptr<DenormalFlush> flush_;
};

}  // namespace mixtrain::backend_cpu
