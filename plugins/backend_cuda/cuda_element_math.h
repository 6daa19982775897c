// Per-element math of the CUDA backend's kernels, callable from host and device: storage decodes
// and encodes (sdk/float_format_rules.h, the SDK's own definition of sdk/float_formats.h), tf32
// rounding, the fp32 clamp, relu / gelu and their gradients, the amax and argmax combines, the
// attention softmax's steps, the cross-entropy's label smoothing, the residual join's (and its
// backward's) / embedding / dropout element rules, batch norm's per-element steps (with the
// residual add), the average pool's divide, the fused optimizer steps, and the underflow tally's
// per-value rule.
//
// Contract
// - One source for host and device, built only from integer operations and fp32 / fp64 operations
//   that IEEE-754 rounds exactly on both (+, -, *, /, sqrt, an explicit fused multiply-add,
//   int <-> float): no other libm call, no CUDA conversion intrinsic. A host build of these
//   functions therefore computes the device's bits, and
//   tests/unit/plugins/backend_cuda/test_cuda_element_math.cpp checks them against the SDK on the
//   CPU, without a GPU. Two conditions: no FMA contraction (the .cu files build with --fmad=false,
//   host users with -ffp-contract=off) and no fast math (nvcc's defaults: IEEE division and square
//   root, denormals kept).
// - Exceptions:
//   - a NaN produced by fp32 arithmetic carries the hardware's payload (x86 propagates the
//     input's, NVIDIA GPUs give 0x7FFFFFFF). Pure data movement (decode, encode, relu, clamp)
//     keeps payloads exactly as the SDK does;
//   - xent_probability calls expf, as the loss kernel's row sum does (cuda_loss.cu): within 2 ulp
//     on the device and 1 on the host, so its host test bounds the error against the exact
//     quotient instead of comparing bits.
// - Why not __float2bfloat16_rn, __float2half_rn, __nv_cvt_float_to_fp8, __half2float & co.: their
//   NaN results are canonical (sign and payload dropped; e4m3 -NaN becomes +NaN) and the decodes
//   do not quiet signalling NaNs, where sdk/float_formats.h keeps the sign and the top payload
//   bits; and the host emulation of an intrinsic is not the instruction the device runs, so a host
//   test of one would prove nothing about the other. For finite values and infinities they agree.
// - Plain C++17 (nvcc's dialect for the .cu files) and no CUDA header, so any host file can
//   include it; of the SDK it includes only float_format_rules.h, written for the same use.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "mixtrain/sdk/support/float_format_rules.h"

#define MIXTRAIN_HD MIXTRAIN_SDK_HOST_DEVICE

namespace mixtrain::backend_cuda::element {

using u32 = std::uint32_t;

// --- bit access and formats: the SDK's rules, the one definition the CPU also uses ---------------

using sdk::format_rules::abs_bits;
using sdk::format_rules::bits_of;
using sdk::format_rules::float_of;
namespace format = sdk::format_rules;

// inf or NaN.
MIXTRAIN_HD bool nonfinite(float x) {
  return (bits_of(x) & 0x7F800000u) == 0x7F800000u;
}

MIXTRAIN_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);  // IEEE whatever -prec-sqrt says
#else
  return std::sqrt(x);
#endif
}

using sdk::format_rules::decode_bf16;
MIXTRAIN_HD float decode_fp16(std::uint16_t v) {
  return format::decode<format::Fp16>(v);
}
MIXTRAIN_HD float decode_e4m3(std::uint8_t v) {
  return format::decode<format::E4M3>(v);
}
MIXTRAIN_HD float decode_e5m2(std::uint8_t v) {
  return format::decode<format::E5M2>(v);
}

MIXTRAIN_HD std::uint16_t encode_bf16(float x, bool saturate) {
  return static_cast<std::uint16_t>(format::encode<format::Bf16>(x, saturate));
}
MIXTRAIN_HD std::uint16_t encode_fp16(float x, bool saturate) {
  return static_cast<std::uint16_t>(format::encode<format::Fp16>(x, saturate));
}
MIXTRAIN_HD std::uint8_t encode_e4m3(float x, bool saturate) {
  return static_cast<std::uint8_t>(format::encode<format::E4M3>(x, saturate));
}
MIXTRAIN_HD std::uint8_t encode_e5m2(float x, bool saturate) {
  return static_cast<std::uint8_t>(format::encode<format::E5M2>(x, saturate));
}

// fp32 rounded to 10 mantissa bits, RNE (sdk::round_to_tf32; not cvt.rna.tf32.f32, which rounds
// ties away from zero).
MIXTRAIN_HD float round_tf32(float x, bool saturate) {
  return float_of(format::encode<format::Tf32>(x, saturate) << 13);
}

// fp64 square root, correctly rounded on both (IEEE sqrt; the CPU's std::sqrt on doubles).
MIXTRAIN_HD double sqrt_rn(double x) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// a*b + c rounded once: an explicit fused multiply-add (--fmad=false only stops the compiler from
// contracting a*b + c by itself), the CPU's std::fma.
MIXTRAIN_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Clamp to +-m; NaN compares false and passes through unchanged.
MIXTRAIN_HD float clamp_finite(float v, float m) {
  return v > m ? m : (v < -m ? -m : v);
}

// fp32 -> int32 toward zero, saturating, NaN -> 0: the SDK's rule, the CPU's fill too.
MIXTRAIN_HD std::int32_t to_int32(float v) {
  return sdk::format_rules::int32_toward_zero(v);
}

// --- storage types: what a kernel reads and writes
// ------------------------------------------------ S::T is the element as stored; S::load decodes
// it exactly; S::store(v, saturate) encodes RNE (saturate: clamp to the largest finite value
// instead of overflowing to inf / NaN).
namespace storage {
struct F32 {
  using T = float;
  static MIXTRAIN_HD float load(T v) { return v; }
  static MIXTRAIN_HD T store(float v, bool saturate) {
    return saturate ? clamp_finite(v, FLT_MAX) : v;
  }
};
struct Tf32 {  // fp32 storage whose stores round to tf32
  using T = float;
  static MIXTRAIN_HD float load(T v) { return v; }
  static MIXTRAIN_HD T store(float v, bool saturate) { return round_tf32(v, saturate); }
};
struct Bf16 {
  using T = std::uint16_t;
  static MIXTRAIN_HD float load(T v) { return decode_bf16(v); }
  static MIXTRAIN_HD T store(float v, bool saturate) { return encode_bf16(v, saturate); }
};
struct F16 {
  using T = std::uint16_t;
  static MIXTRAIN_HD float load(T v) { return decode_fp16(v); }
  static MIXTRAIN_HD T store(float v, bool saturate) { return encode_fp16(v, saturate); }
};
struct E4M3 {
  using T = std::uint8_t;
  static MIXTRAIN_HD float load(T v) { return decode_e4m3(v); }
  static MIXTRAIN_HD T store(float v, bool saturate) { return encode_e4m3(v, saturate); }
};
struct E5M2 {
  using T = std::uint8_t;
  static MIXTRAIN_HD float load(T v) { return decode_e5m2(v); }
  static MIXTRAIN_HD T store(float v, bool saturate) { return encode_e5m2(v, saturate); }
};
struct I32 {  // fill() only
  using T = std::int32_t;
  static MIXTRAIN_HD float load(T v) { return static_cast<float>(v); }
  static MIXTRAIN_HD T store(float v, bool /*saturate*/) { return to_int32(v); }
};
}  // namespace storage

// --- activations
// -------------------------------------------------------------------------------------

// The CPU reference's comparisons: relu keeps NaN and -0; its gradient is 0 where x is NaN or <= 0.
MIXTRAIN_HD float relu(float x) {
  return x < 0.0f ? 0.0f : x;
}
MIXTRAIN_HD float relu_grad(float x, float dy) {
  return x > 0.0f ? dy : 0.0f;
}

// Cephes expf's reduction and polynomial: e^r for r = y - k ln2 with ln2 in two parts (the first
// product kf * 0.693359375f is exact: at most 17 significant bits for the |k| <= 150 the callers
// pass), degree 6. The callers scale by 2^k.
MIXTRAIN_HD float exp_reduced(float y, float kf) {
  float r = y - kf * 0.693359375f;
  r = r - kf * -2.12194440e-4f;
  const float p = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                     4.1665795894e-2f) *
                        r +
                    1.6666665459e-1f) *
                       r +
                   5.0000001201e-1f) *
                      (r * r) +
                  r + 1.0f;
  return p;
}

// e^y for 0 <= y <= 20 (Cephes expf: y = k ln2 + r with a two-part ln2, degree-6 polynomial).
MIXTRAIN_HD float exp_nonneg(float y) {
  const int k = static_cast<int>(y * 1.44269504088896341f + 0.5f);  // round(y / ln2), y >= 0
  const float p = exp_reduced(y, static_cast<float>(k));
  return p * float_of(static_cast<u32>(k + 127) << 23);
}

// tanh in fp32 (Cephes tanhf): odd polynomial below 0.625, 1 - 2/(e^2|x| + 1) above, +-1 from 10
// (tanh(10) rounds to 1). NaN passes through; the sign of zero is kept. Within 2 ulps of the
// correctly rounded tanh (the test measures it).
MIXTRAIN_HD float tanh_f32(float x) {
  const u32 sign = bits_of(x) & 0x80000000u;
  const float z = float_of(bits_of(x) & 0x7FFFFFFFu);
  float r;
  if (z >= 10.0f) {
    r = 1.0f;
  } else if (z >= 0.625f) {
    r = 1.0f - 2.0f / (exp_nonneg(z + z) + 1.0f);
  } else {  // also NaN
    const float q = z * z;
    r = ((((-5.70498872745e-3f * q + 2.06390887954e-2f) * q - 5.37397155531e-2f) * q +
          1.33314422036e-1f) *
             q -
         3.33332819422e-1f) *
            q * z +
        z;
  }
  return float_of(bits_of(r) | sign);
}

// GELU, tanh approximation: the CPU reference's formula (cpu_activation_kernels.cpp), operation
// for operation, with tanh_f32 in place of std::tanh.
inline constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluC = 0.044715f;

MIXTRAIN_HD float gelu(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  return 0.5f * x * (1.0f + tanh_f32(u));
}

MIXTRAIN_HD float gelu_grad(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  const float t = tanh_f32(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}

// kAct: 0 relu, 1 gelu (kernels::activation_forward's numbering).
template <int kAct>
MIXTRAIN_HD float activation(float x) {
  if constexpr (kAct == 0)
    return relu(x);
  else
    return gelu(x);
}
template <int kAct>
MIXTRAIN_HD float activation_grad(float x, float dy) {
  if constexpr (kAct == 0)
    return relu_grad(x, dy);
  else
    return dy * gelu_grad(x);
}

// --- reductions' element rules
// -----------------------------------------------------------------------

// amax slot (fp32 bits) after folding in m, the max |x| bits of some elements (every NaN pattern
// sorts above inf): the CPU backend's rule, NaN (0x7FC00000) if either is NaN, else
// std::max(slot, m). Monotone, commutative and idempotent, so blocks may fold in any order.
MIXTRAIN_HD u32 amax_combine(u32 slot, u32 m) {
  if ((slot & 0x7FFFFFFFu) > 0x7F800000u || m > 0x7F800000u) return 0x7FC00000u;
  return float_of(slot) < float_of(m) ? m : slot;
}

// Softmax argmax, as the CPU's sequential scan (start at z[0], move on a strictly greater z):
// whether candidate (z1, j1) beats (z2, j2), j < 0 meaning none. A NaN z[0] wins (the scan never
// leaves it); other NaNs never win; ties go to the lower index. Candidates of other NaNs must not
// be offered (skip them when scanning a slice).
MIXTRAIN_HD bool argmax_beats(float z1, long long j1, float z2, long long j2) {
  if (j1 < 0) return false;
  if (j2 < 0) return true;
  if (j2 == 0 && !(z2 == z2)) return false;
  if (j1 == 0 && !(z1 == z1)) return true;
  return z1 > z2 || (z1 == z2 && j1 < j2);
}

// --- softmax cross-entropy's label smoothing (facets/cpu_loss.cpp's expressions) ---------------

// The smoothed target t = (1 - eps)·onehot + eps / classes, in fp32: `off` for every class but the
// label, `on` for the label; eps = 0 gives exactly 0 and 1, so the gradient is plain
// cross-entropy's bit for bit.
MIXTRAIN_HD float xent_target_off(float eps, long long classes) {
  return eps / static_cast<float>(classes);
}
MIXTRAIN_HD float xent_target_on(float eps, long long classes) {
  return (1.0f - eps) + xent_target_off(eps, classes);
}
// A class's probability as the CPU's softmax_row (cpu_softmax_row.h) forms it: the shifted
// exponential e^(z - max) that the row's sum adds (expf: within 2 ulp on the device, 1 on the
// host), times the row's reciprocal sum rounded to fp32. Within a few ulp of the exact quotient,
// where a double e^(z - lse) costs a few dozen FP64 instructions a logit (GPT-2's padded head:
// 412 M a step).
MIXTRAIN_HD float xent_inverse_sum(double sum) {
  return static_cast<float>(1.0 / sum);
}
MIXTRAIN_HD float xent_probability(float z, float max, float inverse_sum) {
  return expf(z - max) * inverse_sum;
}
// dlogits of one class: (p - t) * grad_scale / rows.
MIXTRAIN_HD float xent_grad(float p, float target, float grad_factor) {
  return (p - target) * grad_factor;
}
// A row's loss -Σ_j t_j log p_j from its log-sum-exp, its label's logit and the sum of its
// logits (double): lse - (1 - eps)·z_y - eps / classes · Σ z; eps = 0: lse - z_y, as before it.
MIXTRAIN_HD double xent_row_loss(double lse, float zy, double z_sum, float eps, long long classes) {
  if (eps == 0.0f) return lse - static_cast<double>(zy);
  const double e = static_cast<double>(eps);
  return lse - (1.0 - e) * static_cast<double>(zy) - e / static_cast<double>(classes) * z_sum;
}

// --- attention softmax (cpu_attention.cpp's steps) ----------------------------------------------

// Keys query row i of a [rows, cols] score matrix sees: j < softmax_visible(...) (bottom-right
// aligned causal mask: key j <= i + cols - rows; every key when not causal).
MIXTRAIN_HD long long softmax_visible(long long rows, long long cols, long long i, bool causal) {
  if (!causal) return cols;
  const long long v = i + (cols - rows) + 1;
  return v < cols ? v : cols;
}

// The row maximum's fold, std::max(m, v) of the CPU: a NaN v never replaces m (the NaN still
// reaches the row through its own shifted score). Exact, so any fold order gives the same bits
// (up to the sign of a zero maximum, which the subtraction below cannot tell apart).
MIXTRAIN_HD float softmax_max(float m, float v) {
  return m < v ? v : m;
}

// z = scale * s - max, the CPU's shifted score.
MIXTRAIN_HD float softmax_shifted(float s, float scale, float max) {
  return scale * s - max;
}

// e^z for z <= 0 (shifted scores), also -inf -> +0 and NaN -> NaN: Cephes expf, z = k ln2 + r
// with a two-part ln2, degree-6 polynomial, scaled by 2^k once (one rounding also when the result
// is subnormal). Within 2 ulps of the correctly rounded exp (the host test measures it). The CPU
// backend uses oneDNN's vectorised exp, which is a different approximation of the same function.
MIXTRAIN_HD float exp_nonpos(float z) {
  if (!(z == z)) return z;
  if (z < -104.0f) return 0.0f;  // below half the smallest subnormal: e^z rounds to +0
  const int k = static_cast<int>(z * 1.44269504088896341f - 0.5f);  // round(z / ln2), z <= 0
  const float p = exp_reduced(z, static_cast<float>(k));
  if (k >= -125) return p * float_of(static_cast<u32>(k + 127) << 23);
  // 2^k is subnormal: scale by 2^(k + 64) exactly (the result stays normal), then by 2^-64 with
  // the one rounding into the subnormal range.
  return (p * float_of(static_cast<u32>(k + 64 + 127) << 23)) *
         float_of(static_cast<u32>(63) << 23);
}

// p = e / Σe, the division in double as the CPU does (sum: the row's exponentials summed in
// double).
MIXTRAIN_HD float softmax_normalise(float e, double sum) {
  return static_cast<float>(static_cast<double>(e) / sum);
}

// dscore = scale * p * (dp - dot) in double, rounded once (dot = Σ dp * p in double): the CPU's
// expression operation for operation.
MIXTRAIN_HD float softmax_grad(float p, float dp, double dot, float scale) {
  return static_cast<float>(static_cast<double>(scale) * p * (dp - dot));
}

// --- residual join, embedding, dropout -----------------------------------------------------------

// The residual join's result from its FP32 sum (inputs added in order, x1 + x2 + ...): the fused
// ReLU (NaN and -0 kept, as the CPU's sum < 0 ? 0 : sum) before the one rounding into y.
MIXTRAIN_HD float residual_output(float sum, bool relu_after) {
  return relu_after ? relu(sum) : sum;
}

// The residual join's backward (add_backward), one input's gradient before its one rounding: dy
// where y > 0 (relu'(s) = [s > 0] = [y > 0]), else +0, also where y is NaN; dy unchanged without
// the ReLU. The CPU masks dy's bits with all-ones or zero: the same bits as this select.
MIXTRAIN_HD float residual_grad(float dy, float y, bool relu_after) {
  return !relu_after || y > 0.0f ? dy : 0.0f;
}

// One contribution folded into an embedding accumulator in FP32: gather's out + table, and
// scatter_add's table-row sum, which adds its rows' dy in ascending row order.
MIXTRAIN_HD float embedding_accumulate(float acc, float x) {
  return acc + x;
}

// Dropout's value rule: a kept element (the mask is sdk::dropout_keeps itself, compiled for the
// device) times 1 / (1 - p) in FP32 (scale: sdk::dropout_scale(p)), a dropped one +0.
MIXTRAIN_HD float dropout_value(float x, bool keep, float scale) {
  return keep ? x * scale : 0.0f;
}

// --- fused optimizer steps (facets/cpu_optimizer.cpp, operation for operation)
// ----------------------------

// --- batch norm (cpu_batchnorm.cpp and cpu_batchnorm_kernels.cpp, operation for operation) -------

// The forward's per-channel scale and shift ((x - mean)*scale + shift): gamma / sqrt(var + eps) and
// beta, or 1 / sqrt(var + eps) and 0 when the norm is not affine; in double, rounded once.
struct BnScaleShift {
  float scale, shift;
};
MIXTRAIN_HD BnScaleShift bn_scale_shift(float var, float eps, bool affine, float gamma,
                                        float beta) {
  const double inv = 1.0 / sqrt_rn(static_cast<double>(var) + static_cast<double>(eps));
  return {static_cast<float>(affine ? gamma * inv : inv), affine ? beta : 0.0f};
}

// (x - mean)*scale + shift with one fused rounding: the one expression the forward and the fused
// ReLU's mask recomputation use.
MIXTRAIN_HD float bn_affine(float x, float mean, float scale, float shift) {
  return fma_rn(x - mean, scale, shift);
}
MIXTRAIN_HD float bn_forward(float x, float mean, float scale, float shift, bool relu_after) {
  const float v = bn_affine(x, mean, scale, shift);
  return relu_after ? relu(v) : v;  // NaN stays
}
// Batch norm + add + ReLU (batchnorm_add_forward): the affine value, never rounded, plus the
// residual in FP32, then the ReLU; the caller rounds once into y.
MIXTRAIN_HD float bn_add_forward(float x, float residual, float mean, float scale, float shift,
                                 bool relu_after) {
  const float v = bn_affine(x, mean, scale, shift) + residual;
  return relu_after ? relu(v) : v;  // NaN stays
}

// Running statistics (PyTorch's BatchNorm2d): r = (1 - m)*r + m*s in double, rounded once;
// unbiased = rows / (rows - 1) for the variance.
MIXTRAIN_HD float bn_running_mean(float r, double momentum, float mean) {
  return static_cast<float>((1.0 - momentum) * r + momentum * mean);
}
MIXTRAIN_HD float bn_running_var(float r, double momentum, double unbiased, float var) {
  return static_cast<float>((1.0 - momentum) * r + momentum * unbiased * var);
}

// The backward's coefficients from the per-channel sums of g (dy masked by the ReLU) and of
// g*(x - mean): dx = a*g + b*(x - mean) + d, dgamma = sum_gx * inv, dbeta = sum_g.
struct BnGradCoefficients {
  float a, b, d, dgamma, dbeta;
};
MIXTRAIN_HD BnGradCoefficients bn_grad_coefficients(float var, float eps, float gamma, double sum_g,
                                                    double sum_gx, double rows) {
  const double inv = 1.0 / sqrt_rn(static_cast<double>(var) + static_cast<double>(eps));
  const double a = gamma * inv;
  return {static_cast<float>(a), static_cast<float>(-a * inv * inv * sum_gx / rows),
          static_cast<float>(-a * sum_g / rows), static_cast<float>(sum_gx * inv),
          static_cast<float>(sum_g)};
}
// Synchronized batch norm's dx coefficients (batchnorm_backward_elementwise) from the global
// means of g and g*x_hat: a = gamma*inv, b = -a*inv*mean_gx_hat (x_hat = (x - mean)*inv),
// d = -a*mean_g; dx = bn_grad_input(g, x, mean, a, b, d), the fused backward's form.
struct BnSyncCoefficients {
  float a, b, d;
};
MIXTRAIN_HD BnSyncCoefficients bn_sync_coefficients(float var, float eps, float gamma, float mean_g,
                                                    float mean_gx_hat) {
  const double inv = 1.0 / sqrt_rn(static_cast<double>(var) + static_cast<double>(eps));
  const double a = gamma * inv;
  return {static_cast<float>(a), static_cast<float>(-a * inv * mean_gx_hat),
          static_cast<float>(-a * mean_g)};
}
// g: dy where the forward's ReLU let the value through (recomputed from x with the forward's
// scale and shift), else 0.
MIXTRAIN_HD float bn_relu_mask(float x, float dy, float mean, float scale, float shift) {
  return bn_affine(x, mean, scale, shift) > 0.0f ? dy : 0.0f;
}
MIXTRAIN_HD float bn_grad_input(float g, float x, float mean, float a, float b, float d) {
  return fma_rn(a, g, fma_rn(b, x - mean, d));
}

// --- pooling and permutes
// ----------------------------------------------------------------------------

// Average pooling's output from the fp32 window sum and the divisor (KH*KW with count_include_pad,
// else the window's in-image elements).
MIXTRAIN_HD float pool_average(float sum, int count) {
  return sum / static_cast<float>(count);
}

// A value moved between storage types: exact decode, one RNE encode (the permutes' rounding).
template <class Src, class Dst>
MIXTRAIN_HD typename Dst::T convert(typename Src::T v) {
  return Dst::store(Src::load(v), false);
}

// --- fused optimizer steps (facets/cpu_optimizer.cpp, operation for operation)
// ----------------------------

// torch.optim.SGD on one element; h: kernels::SgdArgs (lr, momentum, dampening, weight_decay,
// grad_scale, nesterov, first_step). Returns the new parameter; buf is the momentum buffer.
template <bool kMomentum, class Args>
MIXTRAIN_HD float sgd_step(const Args& h, float p, float grad, float& buf) {
  float g = grad * h.grad_scale + h.weight_decay * p;
  if constexpr (kMomentum) {
    const float m = h.first_step ? g : h.momentum * buf + (1.0f - h.dampening) * g;
    buf = m;
    g = h.nesterov ? g + h.momentum * m : m;
  }
  return p - h.lr * g;
}

// torch.optim.AdamW on one element; h: kernels::AdamWArgs (beta1, beta2, eps, grad_scale, decay =
// 1 - lr*wd, step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t)). Returns the new
// parameter; m, v are exp_avg and exp_avg_sq.
template <class Args>
MIXTRAIN_HD float adamw_step(const Args& h, float p, float grad, float& m, float& v) {
  const float g = grad * h.grad_scale;
  const float mi = h.beta1 * m + (1.0f - h.beta1) * g;
  const float vi = h.beta2 * v + (1.0f - h.beta2) * g * g;
  m = mi;
  v = vi;
  const float denom = sqrt_rn(vi) / h.bc2_sqrt + h.eps;
  return p * h.decay - h.step_size * mi / denom;
}

// count_underflow's rule for one value (gradient_check 1.2, the CPU backend's too): bit 0 set
// when v is not zero (a NaN is not), bit 1 also when its magnitude is at most threshold (a NaN
// compares false; the magnitude by a compare, not a libm call).
MIXTRAIN_HD int underflow_flags(float v, float threshold) {
  if (v == 0.0f) return 0;
  const float magnitude = v < 0.0f ? -v : v;
  return magnitude <= threshold ? 3 : 1;
}

}  // namespace mixtrain::backend_cuda::element
