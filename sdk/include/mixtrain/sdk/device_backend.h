// DeviceBackend: memory and kernels on one device.
//
// Contract
// - Memory: allocate() returns 64-byte aligned device memory (host memory for the CPU) or throws
//   BackendError naming the bytes asked and free; deallocate(nullptr) is a no-op. memory_stats()
//   counts live bytes allocated through this backend and their peak.
// - Tensors are TensorViews into memory this backend allocated, contiguous row-major. Shapes are
//   given per op below as [rows, cols]; a view of rank > 2 is folded to [rows(), cols()].
// - Floating-point math runs in FP32 whatever the storage dtype (fp32, bf16, fp16; fp8 where the
//   op says so); reductions and statistics are FP32 (or wider).
// - Ops are enqueued in order on one stream; only the methods returning host values
//   (unscale_and_check_finite, unscale_check_and_sum_squares, sum_of_squares, first_nonfinite,
//   copy_to_host) synchronise.
// - Errors: a dtype or shape the backend cannot run raises BackendError listing what it can.
// - Threading: one backend object is used by one host thread at a time.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/component.h"
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
  std::vector<DTypeSupport> gemm_inputs;  // every dtype gemm() accepts for A/B
  std::vector<std::string> features;      // "avx512f", "avx512_bf16", "amx_bf16", "f16c", ...

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

enum class Activation { relu, gelu };  // gelu: tanh approximation, as GPT-2 / PyTorch 'tanh'

struct GemmOperand {
  TensorView view;         // stored [rows, cols]; op() transposes when `transpose`
  bool transpose = false;
  float scale_inv = 1.0f;  // fp8 only: real value = stored value * scale_inv
};

// z[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C (+ bias[n] broadcast over rows);
// C = act(z) when `has_activation`, else z. A and B: fp32, tf32 (fp32 storage, inputs rounded
// to tf32), bf16, fp16, fp8_e4m3/e5m2 (either mix). Accumulation in FP32. C: fp32, bf16 or fp16;
// bias: fp32 [n] or empty.
// Activation epilogue: act runs on the FP32 z, before the single rounding into C's dtype (so a
// fused GEMM rounds once where GEMM + activation_forward rounds twice). `pre_activation`
// (optional, only with an activation): [m, n] in fp32, bf16 or fp16, receives z rounded to its
// dtype: the input activation_backward needs for gelu (relu's backward can use C itself, since
// relu(z) > 0 exactly where z > 0). It must not overlap C.
struct GemmArgs {
  GemmOperand a, b;
  TensorView c;
  float alpha = 1.0f;
  float beta = 0.0f;
  TensorView bias;
  DType compute = DType::fp32;  // tf32 asks for tf32 rounding of fp32 inputs
  bool has_activation = false;
  Activation activation = Activation::relu;  // read only when has_activation
  TensorView pre_activation;
};

// dst = saturate?(src * scale) in dst.dtype, round-to-nearest-even; when `amax` (fp32 [1]) is
// given, amax[0] = max(amax[0], max|src|) over the unscaled source. `saturate` clamps to the
// format's largest finite value instead of producing inf (fp8_e4m3 has no inf: NaN when off).
struct CastArgs {
  float scale = 1.0f;
  bool saturate = false;
  TensorView amax;
};

struct ParamTensors {
  TensorView master;   // fp32, updated in place
  TensorView grad;     // fp32, already unscaled
  TensorView working;  // low-precision copy refreshed from master after the update; may be empty
  TensorView state1;   // optimizer slot (momentum / exp_avg), fp32; may be empty
  TensorView state2;   // second slot (exp_avg_sq), fp32; may be empty
};

// PyTorch torch.optim.SGD semantics: g = grad*grad_scale + wd*p; buf = first ? g :
// momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g.
struct SgdHyper {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = true;  // momentum buffer is initialised to g on the first step
  float grad_scale = 1.0f; // gradient multiplier (global-norm clipping coefficient)
};

// PyTorch torch.optim.AdamW semantics: p *= 1 - lr*wd; m = b1*m + (1-b1)g; v = b2*v + (1-b2)g²;
// p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  std::int64_t step = 1;  // 1-based count of applied steps, for bias correction
  float grad_scale = 1.0f;
};

class MIXTRAIN_SDK_API DeviceBackend : public Component {
 public:
  ~DeviceBackend() override;
  virtual BackendCapabilities capabilities() const = 0;

  // --- memory -------------------------------------------------------------------------------
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr) noexcept = 0;
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak_memory() = 0;
  virtual void copy_from_host(TensorView dst, const void* src) = 0;  // dst.bytes() bytes
  virtual void copy_to_host(void* dst, TensorView src) = 0;
  virtual void copy(TensorView dst, TensorView src) = 0;  // same dtype and numel
  virtual void synchronize() = 0;

  // --- GEMM and casts --------------------------------------------------------------------------
  virtual void gemm(const GemmArgs& args) = 0;
  virtual void cast(TensorView src, TensorView dst, const CastArgs& args = {}) = 0;

  // --- layer kernels (compute in FP32) -----------------------------------------------------------
  // y[rows, n] += bias[n]
  virtual void add_bias(TensorView y, TensorView bias) = 0;
  // dbias[n] (fp32) = (accumulate ? dbias : 0) + sum over rows of dy[rows, n]
  virtual void bias_grad(TensorView dy, TensorView dbias, bool accumulate) = 0;
  // y = act(x); x and y may alias (same dtype).
  virtual void activation_forward(Activation act, TensorView x, TensorView y) = 0;
  // dx = dy * act'(x), with x the pre-activation input; dx may alias dy.
  virtual void activation_backward(Activation act, TensorView x, TensorView dy, TensorView dx) = 0;
  // y = (x - mean) * rstd * gamma + beta per row; mean, rstd: fp32 [rows] written for backward.
  virtual void layernorm_forward(TensorView x, TensorView gamma, TensorView beta, float eps,
                                 TensorView y, TensorView mean, TensorView rstd) = 0;
  // dx (overwritten); dgamma, dbeta fp32 [n] accumulated when `accumulate`, else overwritten.
  virtual void layernorm_backward(TensorView dy, TensorView x, TensorView gamma, TensorView mean,
                                  TensorView rstd, TensorView dx, TensorView dgamma,
                                  TensorView dbeta, bool accumulate) = 0;
  // logits [rows, classes], labels int32 [rows]. loss (fp32 [1]) = mean cross-entropy of the
  // softmax in FP32; correct (int32 [1], optional) = rows whose argmax equals the label;
  // dlogits (optional) = (softmax - onehot) * grad_scale / rows. A label outside [0, classes)
  // raises BackendError.
  virtual void softmax_cross_entropy(TensorView logits, TensorView labels, float grad_scale,
                                     TensorView loss, TensorView correct, TensorView dlogits) = 0;

  // --- element-wise --------------------------------------------------------------------------
  virtual void fill(TensorView x, float value) = 0;
  virtual void scale(TensorView x, float alpha) = 0;                  // x *= alpha
  virtual void axpy(float alpha, TensorView x, TensorView y) = 0;     // y += alpha * x (fp32 y)

  // --- mixed-precision machinery ---------------------------------------------------------------
  // One pass over every fp32 gradient: g *= inv_scale, and report whether any element of any
  // tensor was inf or NaN (before or after scaling): returns found_inf, true when one was.
  // The single host sync of a step.
  virtual bool unscale_and_check_finite(std::span<const TensorView> grads, float inv_scale) = 0;
  // Σ x² over all tensors, accumulated in double (fp32 inputs). Non-finite in → non-finite out.
  virtual double sum_of_squares(std::span<const TensorView> tensors) = 0;
  // unscale_and_check_finite, then sum_of_squares of the unscaled gradients, with one wait for
  // both: the step that clips or logs the gradient norm still waits once. The result must equal
  // the two calls made in turn (this default makes them; a device backend overrides it to
  // enqueue both and read both results at once). sum_of_squares is not finite when found_inf is.
  struct GradientCheck {
    bool found_inf = false;
    double sum_of_squares = 0.0;
  };
  virtual GradientCheck unscale_check_and_sum_squares(std::span<const TensorView> grads,
                                                      float inv_scale) {
    GradientCheck r;
    r.found_inf = unscale_and_check_finite(grads, inv_scale);
    r.sum_of_squares = sum_of_squares(grads);
    return r;
  }
  // Index of the first tensor holding an inf/NaN, or -1. For diagnostics, not the hot path.
  virtual int first_nonfinite(std::span<const TensorView> tensors) = 0;

  // --- fused optimizer updates (also refresh `working` copies when present) -------------------
  virtual void sgd_update(const SgdHyper& h, std::span<const ParamTensors> params) = 0;
  virtual void adamw_update(const AdamWHyper& h, std::span<const ParamTensors> params) = 0;
};

}  // namespace mixtrain::sdk
