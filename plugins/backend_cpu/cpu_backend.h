// CpuBackend: the CPU DeviceBackend and the numerical reference for every other backend.
//
// Contract (in addition to sdk/device_backend.h)
// - Memory is host memory, 64-byte aligned, tracked per backend object (thread-safe stats).
// - GEMM runs through cached oneDNN matmul primitives with FP32 accumulation: fp32 natively;
//   bf16 natively through oneDNN's bf16 matmul where the CPU has AMX-BF16 / AVX512-BF16 (decided
//   at run time, see cpu_gemm.h) else emulated; tf32, fp16 and fp8 (x scale_inv) emulated by
//   exact decoding (tf32: RNE rounding) into scratch + the fp32 matmul. A bf16/fp16 C is the fp32
//   result rounded once (RNE). capabilities() says which is which and names oneDNN's kernels.
// - Every format conversion is sdk/float_formats.h (one definition of each format).
// - memory_stats() includes the GEMM's grow-only scratch (decoded operands, fp32 C) in
//   current/peak bytes, not in the allocation count; oneDNN's own scratchpad is not counted.
// - Kernels on small tensors (< kParallelMin elements, cpu_access.h) run on the calling thread.
// - Element-wise kernels accept fp32 / bf16 / fp16 storage where the SDK says "storage dtype"
//   and compute in fp32; reductions are fp32 or double.
// - Threading: one OpenMP pool shared with oneDNN; `threads` (0 = all cores) is applied with
//   omp_set_num_threads on the calling thread before every op. Ops run synchronously, so
//   synchronize() is a no-op.
// - Facets: all thirteen (gemm, activation, residual, gradient_check, foreach, layer_norm,
//   batch_norm, loss, optimizer, attention, embedding, convolution, dropout); supports() is the
//   SDK's table (op_signatures.h) unnarrowed: every dtype it lists runs, natively or emulated
//   (which one is capabilities()' business, not supports()').
// - Convolution and pooling run oneDNN primitives created once per (geometry, dtypes,
//   op) and cached (cpu_primitive_cache.h); activations are channels-last (nhwc) end to end, and
//   weights are reordered from PyTorch's OIHW into the layout the primitive prefers by a cached
//   reorder. bf16 convolutions run natively where the CPU has bf16 dot products (see
//   bf16_conv_native()), everything else on the exact fp32 values (cpu_convolution.cpp). With
//   conv_algorithm = winograd, eligible pure fp32 3x3 convolutions run oneDNN's Winograd F(4,3)
//   with their activations reordered to and from oneDNN's blocked layout around the call.
// - gemm_strided_batched runs one cached 3-D oneDNN matmul where one can express the call
//   (cpu_gemm.h) and a loop over gemm() otherwise.
// - Errors: sdk::BackendError naming the op, the offending tensor, its dtype/shape, and a fix.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"

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
// Which algorithm pure fp32 convolutions use. `direct` (the default and the reference) always
// runs oneDNN's direct convolution. `winograd` runs oneDNN's Winograd F(4,3) for the fp32
// 3x3 / stride 1 / dilation 1 / groups 1 convolutions where the static rule of
// cpu_conv_algorithm.h says it pays (per direction and shape) and oneDNN has a JIT kernel for it;
// everything else stays direct. Winograd rounds differently from a direct sum (its transforms
// add terms of other magnitudes), so it is opt-in. `winograd_everywhere` (C++ only, not a plugin
// option) skips the rule: Winograd for every shape it can compute; for the measurements behind
// the rule.
enum class ConvAlgorithm { direct, winograd, winograd_everywhere };

// The backend is its own facets: find_facet returns `this` as each of them.
class CpuBackend final : public sdk::DeviceBackend,
                         public sdk::GemmFacet,
                         public sdk::ActivationFacet,
                         public sdk::ResidualFacet,
                         public sdk::GradientCheckFacet,
                         public sdk::ForeachFacet,
                         public sdk::LayerNormFacet,
                         public sdk::BatchNormFacet,
                         public sdk::LossFacet,
                         public sdk::OptimizerFacet,
                         public sdk::AttentionFacet,
                         public sdk::EmbeddingFacet,
                         public sdk::ConvolutionFacet,
                         public sdk::DropoutFacet {
 public:
  explicit CpuBackend(int threads = 0, Bf16GemmPath bf16_gemm = Bf16GemmPath::automatic,
                      Bf16ConvPath bf16_conv = Bf16ConvPath::automatic,
                      ConvAlgorithm conv_algorithm = ConvAlgorithm::direct);
  ~CpuBackend() override;

  int threads() const noexcept { return threads_; }
  // oneDNN matmul primitives created so far (one per distinct GEMM key); for tests and tuning.
  std::size_t cached_gemm_primitives() const noexcept;
  // oneDNN's implementation ("gemm:jit", "brg:avx512_core", ...) of the last GEMM primitive run
  // by gemm() or gemm_strided_batched(); for tests and tuning.
  std::string last_gemm_implementation() const;
  // oneDNN primitives (convolution, pooling, with their reorders) created so far, one entry per
  // distinct (op, algorithm, geometry, dtypes, flags); a Winograd key oneDNN cannot serve is an
  // entry too (it records why, and the call runs direct); for tests.
  std::size_t cached_dnnl_primitives() const noexcept;
  // True when bf16 convolutions run in oneDNN's bf16 kernels, false when emulated; and why.
  bool bf16_conv_native() const;
  std::string bf16_conv_note() const;
  // oneDNN's implementation of the last convolution primitive run ("brgconv:avx512_core",
  // "jit_wino_4x3:avx512_core", ...).
  const std::string& last_conv_implementation() const noexcept { return last_conv_impl_; }
  // The requested convolution algorithm; whether oneDNN has a (non-reference) fp32 Winograd
  // convolution on this CPU; and a line saying what runs ("conv_algorithm = direct", or the
  // Winograd kernel and the rule, or why Winograd is unavailable).
  ConvAlgorithm conv_algorithm() const noexcept { return conv_algorithm_; }
  bool conv_winograd_available() const;
  std::string conv_algorithm_note() const;

  sdk::BackendCapabilities capabilities() const override;

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) noexcept override;
  sdk::MemoryStats memory_stats() const override;
  void copy_from_host(sdk::TensorView dst, const void* src) override;
  void copy_to_host(void* dst, sdk::TensorView src) override;
  void copy(sdk::TensorView dst, sdk::TensorView src) override;
  void synchronize() override {}
  void cast(sdk::TensorView src, sdk::TensorView dst, const sdk::CastArgs& args = {}) override;
  void fill(sdk::TensorView x, float value) override;

  sdk::Facet* find_facet(std::string_view name) override;

  // --- GemmFacet -------------------------------------------------------------------------------
  void gemm(const sdk::GemmArgs& args) override;
  // One cached 3-D oneDNN matmul (batch, m, k) x (batch, k, n), same dtype routing as gemm();
  // a loop over gemm() for what that cannot express (cpu_gemm.h).
  void gemm_strided_batched(const sdk::GemmBatchedArgs& args) override;

  // --- ActivationFacet, ResidualFacet ---------------------------------------------------------
  void bias_grad(sdk::TensorView dy, sdk::TensorView dbias, bool accumulate) override;
  void activation_forward(sdk::Activation act, sdk::TensorView x, sdk::TensorView y) override;
  void activation_backward(sdk::Activation act, sdk::TensorView x, sdk::TensorView dy,
                           sdk::TensorView dx) override;
  void axpy(float alpha, sdk::TensorView x, sdk::TensorView y) override;
  void add(std::span<const sdk::TensorView> xs, bool relu, sdk::TensorView y) override;

  // --- GradientCheckFacet ----------------------------------------------------------------------
  bool unscale_and_check_finite(std::span<const sdk::TensorView> grads, float inv_scale) override;
  GradientCheck unscale_check_and_sum_squares(std::span<const sdk::TensorView> grads,
                                              float inv_scale) override;
  int first_nonfinite(std::span<const sdk::TensorView> tensors) override;
  // Σ x² in double over storage-dtype tensors (what unscale_check_and_sum_squares reports).
  double sum_of_squares(std::span<const sdk::TensorView> tensors);

  // --- ForeachFacet ----------------------------------------------------------------------------

  void foreach_mul_scalar(std::span<const sdk::TensorView> self, float scalar) override;
  void foreach_mul(std::span<const sdk::TensorView> self,
                   std::span<const sdk::TensorView> other) override;
  void foreach_add_scalar(std::span<const sdk::TensorView> self, float scalar) override;
  void foreach_add(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> other,
                   float alpha = 1.0f) override;
  void foreach_addcmul(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> t1,
                       std::span<const sdk::TensorView> t2, float value = 1.0f) override;
  void foreach_sqrt(std::span<const sdk::TensorView> self) override;
  void foreach_sign(std::span<const sdk::TensorView> self) override;
  void foreach_lerp(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> end,
                    float weight) override;
  void foreach_clamp(std::span<const sdk::TensorView> self, float lo, float hi) override;

  // --- LayerNormFacet --------------------------------------------------------------------------
  void layernorm_forward(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta, float eps,
                         sdk::TensorView y, sdk::TensorView mean, sdk::TensorView rstd) override;
  void layernorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView gamma,
                          sdk::TensorView mean, sdk::TensorView rstd, sdk::TensorView dx,
                          sdk::TensorView dgamma, sdk::TensorView dbeta, bool accumulate) override;
  // --- BatchNormFacet (cpu_batchnorm.cpp) ------------------------------------------------------
  std::size_t batchnorm_workspace_bytes(const sdk::BatchNormShape& shape,
                                        sdk::DType x) const override;
  void batchnorm_forward_training(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta,
                                  const sdk::BatchNormShape& shape, float momentum,
                                  sdk::TensorView y, sdk::TensorView save_mean,
                                  sdk::TensorView save_var, sdk::TensorView running_mean,
                                  sdk::TensorView running_var, sdk::TensorView workspace) override;
  void batchnorm_forward_inference(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta,
                                   sdk::TensorView running_mean, sdk::TensorView running_var,
                                   const sdk::BatchNormShape& shape, sdk::TensorView y) override;
  void batchnorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                          sdk::TensorView gamma, sdk::TensorView save_mean,
                          sdk::TensorView save_var, const sdk::BatchNormShape& shape,
                          sdk::TensorView workspace, sdk::TensorView dx, sdk::TensorView dgamma,
                          sdk::TensorView dbeta, bool accumulate) override;
  // Version 2: synchronized batch norm's split ops (contract in backend_batch_norm.h).
  void batchnorm_statistics(sdk::TensorView x, const sdk::BatchNormShape& shape,
                            sdk::TensorView mean, sdk::TensorView var) override;
  void batchnorm_backward_reduce(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                 sdk::TensorView mean, sdk::TensorView var,
                                 const sdk::BatchNormShape& shape, sdk::TensorView sum_dy,
                                 sdk::TensorView sum_dy_xhat) override;
  void batchnorm_backward_elementwise(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                      sdk::TensorView gamma, sdk::TensorView mean,
                                      sdk::TensorView var, sdk::TensorView mean_dy,
                                      sdk::TensorView mean_dy_xhat,
                                      const sdk::BatchNormShape& shape,
                                      sdk::TensorView dx) override;

  // --- LossFacet -------------------------------------------------------------------------------
  void softmax_cross_entropy(sdk::TensorView logits, sdk::TensorView labels, float grad_scale,
                             float label_smoothing, sdk::TensorView loss, sdk::TensorView correct,
                             sdk::TensorView dlogits) override;

  // --- OptimizerFacet --------------------------------------------------------------------------
  void sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params) override;
  void adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params) override;

  // --- AttentionFacet (cpu_attention.cpp) ------------------------------------------------------
  void split_heads(sdk::TensorView x, const sdk::HeadLayout& layout, sdk::TensorView y) override;
  void merge_heads(sdk::TensorView y, const sdk::HeadLayout& layout, sdk::TensorView x) override;
  void softmax_forward(sdk::TensorView scores, const sdk::SoftmaxShape& shape, float scale,
                       sdk::TensorView probs) override;
  void softmax_backward(sdk::TensorView probs, sdk::TensorView dprobs,
                        const sdk::SoftmaxShape& shape, float scale,
                        sdk::TensorView dscores) override;

  // --- EmbeddingFacet (cpu_embedding.cpp) ------------------------------------------------------
  void gather(sdk::TensorView ids, sdk::TensorView table, sdk::TensorView out,
              bool accumulate) override;
  void scatter_add(sdk::TensorView ids, sdk::TensorView dy, sdk::TensorView dtable,
                   float beta) override;

  // --- ConvolutionFacet (cpu_convolution.cpp, cpu_pooling.cpp, cpu_permute.cpp) ---------------
  void conv2d_forward(const sdk::Conv2dForwardArgs& args) override;
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& args) override;
  void conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& args) override;
  std::size_t pool2d_workspace_bytes(const sdk::Pool2dGeometry& geometry,
                                     sdk::DType x) const override;
  void pool2d_forward(const sdk::Pool2dGeometry& geometry, sdk::TensorView x, sdk::TensorView y,
                      sdk::TensorView workspace) override;
  void pool2d_backward(const sdk::Pool2dGeometry& geometry, sdk::TensorView dy, sdk::TensorView x,
                       sdk::TensorView y, sdk::TensorView workspace, sdk::TensorView dx) override;
  void to_channels_last(sdk::TensorView src, std::int64_t channels, std::int64_t height,
                        std::int64_t width, sdk::TensorView dst) override;
  void to_channels_first(sdk::TensorView src, std::int64_t channels, std::int64_t height,
                         std::int64_t width, sdk::TensorView dst) override;

  // --- DropoutFacet (cpu_dropout.cpp) ----------------------------------------------------------
  void dropout_forward(sdk::TensorView x, sdk::TensorView y, float p, sdk::DropoutKey key) override;
  void dropout_backward(sdk::TensorView dy, sdk::TensorView dx, float p,
                        sdk::DropoutKey key) override;

 private:
  // conv_algorithm is winograd (or winograd_everywhere) and oneDNN has a Winograd kernel here.
  bool winograd_on() const {
    return conv_algorithm_ != ConvAlgorithm::direct && conv_winograd_available();
  }
  // Makes this thread's OpenMP team size (shared by oneDNN) equal to `threads_`.
  void use_threads() const;
  // Folds growth of the GEMM, convolution and batch-norm scratch into the memory statistics.
  void account_scratch();

  int threads_;
  std::unique_ptr<GemmEngine> gemm_;
  std::unique_ptr<EltwiseEngine> eltwise_;
  std::unique_ptr<PrimitiveCache> prims_;  // conv, pooling; scratch (mutable through const)
  Bf16ConvPath bf16_conv_request_;
  mutable int bf16_conv_state_ = -1;  // -1 undecided, 0 emulated, 1 oneDNN
  mutable std::string bf16_conv_note_;
  ConvAlgorithm conv_algorithm_;
  mutable int winograd_state_ = -1;    // -1 unprobed, 0 unavailable, 1 available
  mutable std::string winograd_impl_;  // the probe's implementation name, or why none
  std::string last_conv_impl_;

  mutable std::mutex memory_mutex_;
  std::unordered_map<void*, std::size_t> live_;
  std::size_t current_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace mixtrain::backend_cpu
