// The convolution facet's conv2d ops (forward, backward-data, backward-weights) on oneDNN.
//
// Layout: activations are channels-last, oneDNN's nhwc ({N, C, H, W} dims, acdb memory), passed
// to the primitives as they are. Weights arrive in PyTorch's [O, C/g, KH, KW] (oihw; goihw with
// groups, which is the same memory); the primitive descriptors ask for weights in format `any`
// and one cached reorder moves the caller's weights into the primitive's layout on each call. The
// weight gradient comes out in the primitive's layout and one cached reorder (with a sum post-op
// when accumulating) moves it into the caller's fp32 OIHW.
//
// Precision (the GEMM's rules, cpu_gemm.h):
// - native bf16: both operands bf16 (x and w; dy and w; x and dy), compute not tf32, and
//   bf16_conv_native(): oneDNN's bf16 convolution (FP32 accumulation) reads them as stored.
// - everything else runs oneDNN's fp32 convolution on exact fp32 values: fp32 operands as stored;
//   tf32 (a tf32 view or compute = tf32) rounds fp32 storage to 10 mantissa bits (RNE) into
//   scratch; bf16, fp16 and fp8 are decoded exactly into scratch (bf16/fp16/fp8 already fit tf32).
// - fp8 scale_inv: the operands are decoded unscaled (exact) and the product of their scale_invs
//   (fp32, one rounding unless both are powers of two) multiplies the FP32 result once, before the
//   bias is added: y = s·Σ x·w + b. fp8 products are exact in FP32, so the only roundings are the
//   FP32 accumulation, s, and the one multiply by s.
// - The primitive writes fp32 (y itself when fp32); a bf16/fp16 y or dx is encoded once with the
//   SDK's RNE. Exception: on the native bf16 route a bf16 y / dx (no fp8 scale) is written by the
//   primitive itself, rounded RNE once by oneDNN. Its down-conversion flushes subnormals, which
//   that route's vdpbf16ps already does to its inputs and products; it saves an fp32 pass over
//   every output (the emulated route, the exact reference, keeps the SDK's encode).
// - Primitives, descriptors and reorders are cached per (op, algorithm, geometry, oneDNN dtypes,
//   bias) in the backend's PrimitiveCache; a bf16 key whose oneDNN kernel is a reference kernel
//   falls back to the fp32 route.
//
// Algorithm (the backend option conv_algorithm; cpu_backend.h):
// - "direct" (default, the reference): oneDNN's direct convolution, always.
// - "winograd": oneDNN's Winograd F(4,3) (jit_wino_4x3:avx512_core; oneDNN 2.6 has it for fp32
//   on AVX-512 CPUs only) for a convolution that is all of: on the pure fp32 route (both operands
//   fp32 as stored, compute fp32 — not tf32, not bf16 native or emulated, not fp16/fp8, whose
//   contract is exact FP32 on the rounded operands); 3x3, stride 1, dilation 1, groups 1; taken by
//   the rule below; and one oneDNN creates a non-reference Winograd kernel for (else the entry
//   records why not and the call runs direct, unchanged). The output's dtype, bias, dbias, the
//   accumulate of dw/dbias work as on the direct path (an fp8 scale cannot occur on this route).
//   Winograd takes blocked activations only (nChw16c; creating it with nhwc fails), so each call
//   reorders its activation inputs nhwc -> blocked and its activation output back, with reorders
//   cached in the entry and the blocked buffers in the cache's blocked_a / blocked_b scratch.
//   Its transforms round differently: against a double reference its rel-L2 error is ≈ 5e-7..9e-7
//   (the direct convolution's ≈ 1e-7..4e-7; the unit tests bound it at 3e-6).
// - The rule, static so that the same shape always takes the same algorithm (runs reproduce; no
//   timing at run time): Winograd when N·OH·OW·C·O >= 2^23 and C, O >= 16, and for the forward
//   C >= 32, for backward-data O >= 32 (the side Winograd's input transform reads); backward-
//   weights needs nothing more. Measured by bench/cnn/bench_conv_algorithm.cpp (each call as the
//   trainer makes it, so Winograd's time includes the activation and weight reorders), the best
//   of three sittings of 15 calls, 2 threads, AMD EPYC Zen 4 (AVX-512), load 1.9-2.1; ms direct /
//   Winograd, W = the rule takes Winograd:
//     C->O    HxW   N    work  forward          backward-data    backward-weights
//     16->16  32x32 128  2^25  2.68 / 3.53      2.54 / 3.59      2.54 / 2.06 W
//     32->32  16x16 128  2^25  2.48 / 1.68 W    2.38 / 1.50 W    2.47 / 1.62 W
//     64->64   8x8  128  2^25  2.23 / 1.19 W    2.19 / 1.10 W    2.34 / 1.30 W
//     16->32  32x32 128  2^26  5.57 / 5.94      5.97 / 4.52 W    5.35 / 4.68 W
//     32->16  32x32 128  2^26  5.81 / 4.39 W    5.15 / 6.16      5.66 / 5.44 W
//     16->16  16x16 128  2^23  0.69 / 0.89      0.60 / 0.91      0.63 / 0.55 W
//     32->32   8x8  128  2^23  0.61 / 0.45 W    0.56 / 0.43 W    0.60 / 0.42 W
//     128->128 4x4   32  2^23  0.63 / 0.49 W    0.55 / 0.61 W    0.72 / 0.59 W
//     64->64   8x8   32  2^23  0.62 / 0.34 W    0.58 / 0.36 W    0.67 / 0.38 W
//     16->32  32x32   8  2^22  0.33 / 0.61      0.32 / 0.27      0.33 / 0.27
//     32->32   8x8   32  2^21  0.17 / 0.13      0.15 / 0.13      0.16 / 0.28
//     64->64   8x8    8  2^21  0.20 / 0.18      0.17 / 0.20      0.18 / 0.23
//   With 16 channels in x the forward lost everywhere, with 16 in dy backward-data did; below
//   2^23 the fixed costs (the weights' transform, a reorder per activation) take over, and
//   backward-weights loses first. Misfits: 128->128 4x4 N=32 backward-data is taken and loses
//   0.06 ms; at 2^22 some directions would win ≈ 0.05 ms and are left direct.
//   16-channel activations need no reorder: nChw16c with 16 channels is nhwc byte for byte.
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <optional>
#include <string>
#include <string_view>

#include "cpu_access.h"
#include "cpu_backend.h"
#include "cpu_features.h"
#include "cpu_primitive_cache.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;
using sdk::DType;
using sdk::TensorView;
using Slot = PrimitiveCache::Slot;

namespace {

enum Tag : std::int64_t { kConvForward = 1, kConvBackwardData = 2, kConvBackwardWeights = 3 };

// The static Winograd rule's thresholds (measurements in the header): at least kWinogradMinWork
// multiply-adds per kernel tap (N·OH·OW·C·O), C and O at least kWinogradMinChannels (the fewest
// measured), and kWinogradInputChannels on the side the input transform reads in the forward
// (C) and backward-data (O).
constexpr double kWinogradMinWork = 8388608.0;  // 2^23
constexpr std::int64_t kWinogradMinChannels = 16;
constexpr std::int64_t kWinogradInputChannels = 32;

bool is_conv_operand(DType t) {
  return is_storage_float(t) || sdk::is_fp8(t);
}

std::string dims_text(std::initializer_list<std::int64_t> dims) {
  std::string s = "[";
  for (std::int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

void check_geometry(std::string_view op, const sdk::Conv2dGeometry& g) {
  const std::string hint = "check the layer's Conv2dGeometry";
  auto at_least = [&](const char* name, std::int64_t v, std::int64_t lo) {
    require_at_least(op, std::string("geometry.") + name, v, lo, hint);
  };
  at_least("batch", g.batch, 1);
  at_least("in_channels", g.in_channels, 1);
  at_least("height", g.height, 1);
  at_least("width", g.width, 1);
  at_least("out_channels", g.out_channels, 1);
  at_least("kernel_h", g.kernel_h, 1);
  at_least("kernel_w", g.kernel_w, 1);
  at_least("stride_h", g.stride_h, 1);
  at_least("stride_w", g.stride_w, 1);
  at_least("dilation_h", g.dilation_h, 1);
  at_least("dilation_w", g.dilation_w, 1);
  at_least("groups", g.groups, 1);
  at_least("pad_h", g.pad_h, 0);
  at_least("pad_w", g.pad_w, 0);
  if (g.in_channels % g.groups != 0 || g.out_channels % g.groups != 0)
    fail(op,
         "groups = " + std::to_string(g.groups) +
             " must divide in_channels = " + std::to_string(g.in_channels) +
             " and out_channels = " + std::to_string(g.out_channels),
         hint);
  if (g.out_height() < 1 || g.out_width() < 1)
    fail(op,
         "the kernel " + std::to_string(g.kernel_h) + "x" + std::to_string(g.kernel_w) +
             " (dilation " + std::to_string(g.dilation_h) + "x" + std::to_string(g.dilation_w) +
             ") does not fit in the " + std::to_string(g.height) + "x" + std::to_string(g.width) +
             " image padded by " + std::to_string(g.pad_h) + "x" + std::to_string(g.pad_w),
         "use a smaller kernel or dilation, or more padding");
}

// A tensor of the geometry: `dims` exactly when the view is 4-D, else the same element count.
void check_tensor(std::string_view op, std::string_view name, const TensorView& v,
                  std::array<std::int64_t, 4> dims, std::string_view layout) {
  require_present(op, name, v);
  const std::int64_t n = checked_product(op, name, {dims[0], dims[1], dims[2], dims[3]});
  bool ok = v.numel() == n;
  if (ok && v.shape.rank == 4)
    for (int i = 0; i < 4; ++i) ok = ok && v.shape[i] == dims[static_cast<std::size_t>(i)];
  if (!ok)
    fail(op,
         std::string(name) + " is " + describe(v) + " but the geometry expects " +
             std::string(layout) + " = " + dims_text({dims[0], dims[1], dims[2], dims[3]}) + " (" +
             std::to_string(n) + " elements)",
         layout.find('O') == 0 && layout.find("KH") != std::string_view::npos
             ? "weights are PyTorch's layout [O, C/groups, KH, KW]; check the geometry"
             : "image activations are channels-last [N, H, W, C] (permute channels-first data "
               "with to_channels_last); check the geometry");
}

void check_operand(std::string_view op, std::string_view name, const sdk::GemmOperand& o) {
  if (!is_conv_operand(o.view.dtype))
    fail(op,
         std::string(name) + " is " + describe(o.view) +
             "; convolution operands are fp32, tf32, bf16, fp16, fp8_e4m3 or fp8_e5m2",
         "cast the tensor first (backend.cast)");
  if (o.transpose)
    fail(op, std::string(name) + " has transpose = true; convolution operands are never transposed",
         "pass the tensor in its own layout with transpose = false");
}

void check_output(std::string_view op, std::string_view name, const TensorView& v) {
  if (!is_storage_float(v.dtype))
    fail(op, std::string(name) + " is " + describe(v) + "; outputs are fp32, bf16 or fp16",
         "allocate the output in fp32, bf16 or fp16");
}

void check_compute(std::string_view op, DType compute) {
  if (compute != DType::fp32 && compute != DType::tf32)
    fail(op,
         "compute = " + std::string(sdk::dtype_name(compute)) + " is not supported (fp32 or tf32)",
         "set compute to fp32, or tf32 to round fp32 operands to tf32");
}

// How the operands enter oneDNN.
struct Route {
  bool native_bf16 = false;  // both bf16, read as stored by oneDNN's bf16 convolution
  bool tf32 = false;         // fp32 storage operands rounded to tf32 first
  memory::data_type dt = memory::data_type::f32;
};

Route route_of(DType a, DType b, DType compute, bool bf16_native) {
  Route r;
  r.tf32 = compute == DType::tf32 || a == DType::tf32 || b == DType::tf32;
  r.native_bf16 = a == DType::bf16 && b == DType::bf16 && !r.tf32 && bf16_native;
  r.dt = r.native_bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  return r;
}

Route fp32_route(Route r) {
  r.native_bf16 = false;
  r.dt = memory::data_type::f32;
  return r;
}

float fp8_scale(const sdk::GemmOperand& o) {
  return sdk::is_fp8(o.view.dtype) ? o.scale_inv : 1.0f;
}

// What the primitive writes y / dx in: bf16 itself on the native bf16 route when the output is
// bf16 and no fp8 scale follows (oneDNN rounds RNE once, flushing subnormals as vdpbf16ps already
// does on that route), else fp32 (the output itself when fp32, else scratch encoded once).
memory::data_type out_type(const Route& r, const TensorView& out, float scale) {
  return r.native_bf16 && out.dtype == DType::bf16 && scale == 1.0f ? memory::data_type::bf16
                                                                    : memory::data_type::f32;
}
bool writes_directly(const Route& r, const TensorView& out, float scale) {
  return scale == 1.0f &&
         (is_fp32_storage(out.dtype) || out_type(r, out, scale) == memory::data_type::bf16);
}

memory::desc activation_md(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                           memory::data_type dt) {
  return memory::desc({n, c, h, w}, dt, memory::format_tag::nhwc);
}

memory::dims weights_dims(const sdk::Conv2dGeometry& g) {
  if (g.groups == 1) return {g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
  return {g.groups, g.out_channels / g.groups, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
}

// The caller's weight layout: [O, C/g, KH, KW] is oihw, and goihw with groups (the same bytes).
memory::desc plain_weights_md(const sdk::Conv2dGeometry& g, memory::data_type dt) {
  return memory::desc(weights_dims(g), dt,
                      g.groups == 1 ? memory::format_tag::oihw : memory::format_tag::goihw);
}
memory::desc any_weights_md(const sdk::Conv2dGeometry& g, memory::data_type dt) {
  return memory::desc(weights_dims(g), dt, memory::format_tag::any);
}

struct ConvDims {
  memory::dims strides, dilates, pad_l, pad_r;
};
// oneDNN counts dilation from 0. The right padding equals the left: oneDNN floors
// (H + pad_l + pad_r - extent) / stride as PyTorch does, so the rows the floor drops are never
// read.
ConvDims conv_dims(const sdk::Conv2dGeometry& g) {
  return {{g.stride_h, g.stride_w},
          {g.dilation_h - 1, g.dilation_w - 1},
          {g.pad_h, g.pad_w},
          {g.pad_h, g.pad_w}};
}

PrimitiveCache::Key key_of(Tag tag, const sdk::Conv2dGeometry& g, memory::data_type dt,
                           memory::data_type out_dt, bool bias, dnnl::algorithm alg) {
  return {tag,
          static_cast<std::int64_t>(alg),
          static_cast<std::int64_t>(dt),
          static_cast<std::int64_t>(out_dt),
          bias ? 1 : 0,
          g.batch,
          g.in_channels,
          g.height,
          g.width,
          g.out_channels,
          g.kernel_h,
          g.kernel_w,
          g.stride_h,
          g.stride_w,
          g.pad_h,
          g.pad_w,
          g.dilation_h,
          g.dilation_w,
          g.groups};
}

// The activations a primitive of algorithm `alg` is described with: nhwc for the direct
// convolution (passed as they are), format `any` for Winograd (oneDNN's Winograd kernels take
// only its blocked layout, nChw16c; the entry reorders around the call).
memory::desc input_md(const sdk::Conv2dGeometry& g, memory::data_type dt, dnnl::algorithm alg) {
  if (alg == dnnl::algorithm::convolution_direct)
    return activation_md(g.batch, g.in_channels, g.height, g.width, dt);
  return memory::desc({g.batch, g.in_channels, g.height, g.width}, dt, memory::format_tag::any);
}
memory::desc output_md(const sdk::Conv2dGeometry& g, memory::data_type dt, dnnl::algorithm alg) {
  if (alg == dnnl::algorithm::convolution_direct)
    return activation_md(g.batch, g.out_channels, g.out_height(), g.out_width(), dt);
  return memory::desc({g.batch, g.out_channels, g.out_height(), g.out_width()}, dt,
                      memory::format_tag::any);
}

dnnl::convolution_forward::primitive_desc forward_pd(const dnnl::engine& engine,
                                                     const sdk::Conv2dGeometry& g,
                                                     memory::data_type dt, memory::data_type dst_dt,
                                                     bool bias, dnnl::algorithm alg) {
  const ConvDims d = conv_dims(g);
  const memory::desc bias_md =
      bias ? memory::desc({g.out_channels}, memory::data_type::f32, memory::format_tag::a)
           : memory::desc();
  return {{dnnl::prop_kind::forward_training, alg, input_md(g, dt, alg), any_weights_md(g, dt),
           bias_md, output_md(g, dst_dt, alg), d.strides, d.dilates, d.pad_l, d.pad_r},
          engine};
}

// The caller's plain weights -> the layout a primitive asked for (no reorder when they agree).
struct WeightsReorder {
  memory::desc plain_md, blocked_md;
  std::optional<dnnl::reorder> reorder;
};

WeightsReorder weights_reorder(const dnnl::engine& engine, const memory::desc& plain,
                               const memory::desc& wanted) {
  WeightsReorder w{plain, wanted, std::nullopt};
  if (plain != wanted)
    w.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, plain, engine, wanted));
  return w;
}

// An activation between the caller's nhwc and the layout the primitive was created with: no
// reorder when they agree (every direct convolution) or are the same bytes, else one cached
// reorder, nhwc -> the primitive's layout for an input and back for an output.
struct ActivationLayout {
  memory::desc plain_md, primitive_md;
  std::optional<dnnl::reorder> reorder;
};

// nChw16c with exactly 16 channels is nhwc byte for byte (one block, no padding): the primitive
// then reads or writes the caller's buffer itself.
bool same_bytes(const memory::desc& nhwc, const memory::desc& wanted) {
  const memory::dims dims = nhwc.dims();
  return nhwc == wanted || (dims[1] == 16 && wanted == memory::desc(dims, nhwc.data_type(),
                                                                    memory::format_tag::nChw16c));
}

ActivationLayout input_layout(const dnnl::engine& engine, const memory::desc& plain,
                              const memory::desc& wanted) {
  ActivationLayout a{plain, wanted, std::nullopt};
  if (!same_bytes(plain, wanted))
    a.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, plain, engine, wanted));
  return a;
}
ActivationLayout output_layout(const dnnl::engine& engine, const memory::desc& plain,
                               const memory::desc& given) {
  ActivationLayout a{plain, given, std::nullopt};
  if (!same_bytes(plain, given))
    a.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, given, engine, plain));
  return a;
}

// Every entry: `usable` is false only for a Winograd key oneDNN has no JIT kernel for (creation
// failed, or a reference kernel); `implementation` then says why, and the op runs direct.
struct ForwardEntry {
  dnnl::convolution_forward primitive;
  ActivationLayout src, dst;
  memory::desc bias_md;
  WeightsReorder weights;
  std::string implementation;
  bool usable = true;
};

struct BackwardDataEntry {
  dnnl::convolution_backward_data primitive;
  ActivationLayout diff_dst, diff_src;
  WeightsReorder weights;
  std::string implementation;
  bool usable = true;
};

struct BackwardWeightsEntry {
  dnnl::convolution_backward_weights primitive;
  ActivationLayout src, diff_dst;
  memory::desc diff_weights_md, plain_md, diff_bias_md;
  dnnl::reorder to_plain, add_to_plain;  // the primitive's layout -> OIHW fp32: =, +=
  bool plain = false;                    // the primitive writes OIHW itself
  std::string implementation;
  bool usable = true;
};

constexpr dnnl::algorithm kDirect = dnnl::algorithm::convolution_direct;
constexpr dnnl::algorithm kWinograd = dnnl::algorithm::convolution_winograd;

// For a Winograd key: the entry that says "not here" (the op then runs direct) when oneDNN
// cannot create the primitive or offers only a reference kernel. Direct keys keep their old
// behaviour (creation errors are reported; the bf16 route's reference-kernel check is the op's).
template <class Entry>
Entry unusable(std::string why) {
  Entry e;
  e.usable = false;
  e.implementation = std::move(why);
  return e;
}

[[noreturn]] void creation_failed(std::string_view op, const sdk::Conv2dGeometry& g,
                                  memory::data_type dt, const dnnl::error& e) {
  fail(op,
       "oneDNN cannot create a " + std::string(dt == memory::data_type::bf16 ? "bf16" : "fp32") +
           " convolution for N=" + std::to_string(g.batch) + " C=" + std::to_string(g.in_channels) +
           " HxW=" + std::to_string(g.height) + "x" + std::to_string(g.width) +
           " O=" + std::to_string(g.out_channels) + " kernel " + std::to_string(g.kernel_h) + "x" +
           std::to_string(g.kernel_w) + ": " + e.what(),
       "report this geometry");
}

ForwardEntry& forward_entry(PrimitiveCache& cache, std::string_view op,
                            const sdk::Conv2dGeometry& g, memory::data_type dt,
                            memory::data_type dst_dt, bool bias, dnnl::algorithm alg = kDirect) {
  return cache.get<ForwardEntry>(key_of(kConvForward, g, dt, dst_dt, bias, alg), [&] {
    try {
      const auto& engine = cache.engine();
      const auto pd = forward_pd(engine, g, dt, dst_dt, bias, alg);
      ForwardEntry e;
      e.implementation = pd.impl_info_str();
      if (alg != kDirect && is_reference_kernel(e.implementation))
        return unusable<ForwardEntry>(e.implementation);
      e.src = input_layout(engine, activation_md(g.batch, g.in_channels, g.height, g.width, dt),
                           pd.src_desc());
      e.dst = output_layout(
          engine, activation_md(g.batch, g.out_channels, g.out_height(), g.out_width(), dst_dt),
          pd.dst_desc());
      e.bias_md = pd.bias_desc();
      e.weights = weights_reorder(engine, plain_weights_md(g, dt), pd.weights_desc());
      e.primitive = dnnl::convolution_forward(pd);
      return e;
    } catch (const dnnl::error& err) {
      if (alg != kDirect) return unusable<ForwardEntry>(err.what());
      creation_failed(op, g, dt, err);
    }
  });
}

BackwardDataEntry& backward_data_entry(PrimitiveCache& cache, std::string_view op,
                                       const sdk::Conv2dGeometry& g, memory::data_type dt,
                                       memory::data_type diff_src_dt,
                                       dnnl::algorithm alg = kDirect) {
  return cache.get<BackwardDataEntry>(
      key_of(kConvBackwardData, g, dt, diff_src_dt, false, alg), [&] {
        try {
          const auto& engine = cache.engine();
          const auto hint = forward_pd(engine, g, dt, dt, false, alg);
          const ConvDims d = conv_dims(g);
          const dnnl::convolution_backward_data::primitive_desc pd(
              {alg, input_md(g, diff_src_dt, alg), any_weights_md(g, dt), output_md(g, dt, alg),
               d.strides, d.dilates, d.pad_l, d.pad_r},
              engine, hint);
          BackwardDataEntry e;
          e.implementation = pd.impl_info_str();
          if (alg != kDirect && is_reference_kernel(e.implementation))
            return unusable<BackwardDataEntry>(e.implementation);
          e.diff_dst = input_layout(
              engine, activation_md(g.batch, g.out_channels, g.out_height(), g.out_width(), dt),
              pd.diff_dst_desc());
          e.diff_src = output_layout(
              engine, activation_md(g.batch, g.in_channels, g.height, g.width, diff_src_dt),
              pd.diff_src_desc());
          e.weights = weights_reorder(engine, plain_weights_md(g, dt), pd.weights_desc());
          e.primitive = dnnl::convolution_backward_data(pd);
          return e;
        } catch (const dnnl::error& err) {
          if (alg != kDirect) return unusable<BackwardDataEntry>(err.what());
          creation_failed(op, g, dt, err);
        }
      });
}

BackwardWeightsEntry& backward_weights_entry(PrimitiveCache& cache, std::string_view op,
                                             const sdk::Conv2dGeometry& g, memory::data_type dt,
                                             bool bias, dnnl::algorithm alg = kDirect) {
  return cache.get<BackwardWeightsEntry>(
      key_of(kConvBackwardWeights, g, dt, memory::data_type::f32, bias, alg), [&] {
        try {
          const auto& engine = cache.engine();
          const auto hint = forward_pd(engine, g, dt, dt, bias, alg);
          const ConvDims d = conv_dims(g);
          const memory::desc bias_md =
              bias ? memory::desc({g.out_channels}, memory::data_type::f32, memory::format_tag::a)
                   : memory::desc();
          const dnnl::convolution_backward_weights::primitive_desc pd(
              {alg, input_md(g, dt, alg), any_weights_md(g, memory::data_type::f32), bias_md,
               output_md(g, dt, alg), d.strides, d.dilates, d.pad_l, d.pad_r},
              engine, hint);
          BackwardWeightsEntry e;
          e.implementation = pd.impl_info_str();
          if (alg != kDirect && is_reference_kernel(e.implementation))
            return unusable<BackwardWeightsEntry>(e.implementation);
          e.src = input_layout(engine, activation_md(g.batch, g.in_channels, g.height, g.width, dt),
                               pd.src_desc());
          e.diff_dst = input_layout(
              engine, activation_md(g.batch, g.out_channels, g.out_height(), g.out_width(), dt),
              pd.diff_dst_desc());
          e.diff_weights_md = pd.diff_weights_desc();
          e.diff_bias_md = pd.diff_bias_desc();
          e.plain_md = plain_weights_md(g, memory::data_type::f32);
          e.plain = e.diff_weights_md == e.plain_md;
          e.to_plain = dnnl::reorder(
              dnnl::reorder::primitive_desc(engine, e.diff_weights_md, engine, e.plain_md));
          dnnl::post_ops sum;
          sum.append_sum(1.0f);
          dnnl::primitive_attr attr;
          attr.set_post_ops(sum);
          e.add_to_plain = dnnl::reorder(
              dnnl::reorder::primitive_desc(engine, e.diff_weights_md, engine, e.plain_md, attr));
          e.primitive = dnnl::convolution_backward_weights(pd);
          return e;
        } catch (const dnnl::error& err) {
          if (alg != kDirect) return unusable<BackwardWeightsEntry>(err.what());
          creation_failed(op, g, dt, err);
        }
      });
}

// An activation or weight as it enters oneDNN: the caller's data (native bf16, or fp32 storage
// not rounded) or its exact fp32 values in scratch (tf32-rounded when the route says so).
const void* prepare(PrimitiveCache& cache, const TensorView& v, const Route& r, Slot slot) {
  const bool fp32 = is_fp32_storage(v.dtype);
  if (r.native_bf16 || (fp32 && !r.tf32)) return v.data;
  const std::int64_t n = v.numel();
  float* out = cache.scratch<float>(slot, static_cast<std::size_t>(n));
  decode_tensor(v, 1.0f, r.tf32 && fp32, out, n);  // bf16/fp16/fp8 already fit tf32
  return out;
}

// The weights in the layout the primitive asked for.
const void* prepare_weights(PrimitiveCache& cache, const TensorView& w, const Route& r,
                            const WeightsReorder& wr) {
  const void* plain = prepare(cache, w, r, Slot::weights);
  if (!wr.reorder) return plain;
  void* blocked = cache.scratch<char>(Slot::weights_blocked, wr.blocked_md.get_size());
  cache.execute(*wr.reorder, {{DNNL_ARG_FROM, cache.wrap(wr.plain_md, plain)},
                              {DNNL_ARG_TO, cache.wrap(wr.blocked_md, blocked)}});
  return blocked;
}

// An input activation in the layout the primitive reads: `data` itself (nhwc), or reordered
// into the blocked scratch `slot`.
const void* to_primitive(PrimitiveCache& cache, const ActivationLayout& a, const void* data,
                         Slot slot) {
  if (!a.reorder) return data;
  void* blocked = cache.scratch<char>(slot, a.primitive_md.get_size());
  cache.execute(*a.reorder, {{DNNL_ARG_FROM, cache.wrap(a.plain_md, data)},
                             {DNNL_ARG_TO, cache.wrap(a.primitive_md, blocked)}});
  return blocked;
}
// Where the primitive writes an output activation: `dst` itself (nhwc), or the blocked scratch
// `slot` that from_primitive() then reorders into `dst`.
void* primitive_output(PrimitiveCache& cache, const ActivationLayout& a, void* dst, Slot slot) {
  if (!a.reorder) return dst;
  return cache.scratch<char>(slot, a.primitive_md.get_size());
}
void from_primitive(PrimitiveCache& cache, const ActivationLayout& a, const void* written,
                    void* dst) {
  if (!a.reorder) return;
  cache.execute(*a.reorder, {{DNNL_ARG_FROM, cache.wrap(a.primitive_md, written)},
                             {DNNL_ARG_TO, cache.wrap(a.plain_md, dst)}});
}

// out = acc * scale (+ bias[c] over `cols` channels), rounded once into out's dtype; `acc` may
// be out's own data (fp32).
void finish_output(const float* acc, const TensorView& out, std::int64_t cols, float scale,
                   const float* bias) {
  const std::int64_t total = out.numel();
  if (scale == 1.0f && bias == nullptr) {
    encode_tensor(out, acc, total);
    return;
  }
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float buf[kChunk];
    for (std::int64_t i = 0; i < len; ++i) {
      const float v = acc[c0 + i] * scale;
      buf[i] = bias != nullptr ? v + bias[(c0 + i) % cols] : v;
    }
    commit_chunk(out, c0, len, buf);
  }
}

// dst[i] = src[i] * scale (+ dst[i] when accumulating), fp32.
void scale_into(const float* src, float* dst, std::int64_t n, float scale, bool accumulate) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale + (accumulate ? dst[i] : 0.0f);
}

// The shapes oneDNN's Winograd F(4,3) computes: 3x3, stride 1, no dilation, no groups.
bool winograd_shape(const sdk::Conv2dGeometry& g) {
  return g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 &&
         g.dilation_h == 1 && g.dilation_w == 1 && g.groups == 1;
}

enum class Direction { forward, backward_data, backward_weights };

// The static rule (measurements in the file's header): whether Winograd, with the reorders of
// its activations, is faster than the direct convolution for this direction and shape: at least
// 2^23 multiply-adds per tap and 16 channels on both sides, and for the forward at least 32
// input channels (x's C), for backward-data at least 32 in dy (O): with 16 there Winograd lost
// in every measurement. Backward-weights won down to 16 channels. Deterministic: the same shape
// always takes the same algorithm, so runs are reproducible.
bool winograd_pays(Direction dir, const sdk::Conv2dGeometry& g) {
  const double work = static_cast<double>(g.batch) * static_cast<double>(g.out_height()) *
                      static_cast<double>(g.out_width()) * static_cast<double>(g.in_channels) *
                      static_cast<double>(g.out_channels);
  if (work < kWinogradMinWork || g.in_channels < kWinogradMinChannels ||
      g.out_channels < kWinogradMinChannels)
    return false;
  switch (dir) {
    case Direction::forward:
      return g.in_channels >= kWinogradInputChannels;
    case Direction::backward_data:
      return g.out_channels >= kWinogradInputChannels;
    case Direction::backward_weights:
      return true;
  }
  return false;
}

// The algorithm of a convolution: Winograd where it is on, the operands are fp32 as stored with
// fp32 compute (not tf32, not bf16, not a decoded 16/8-bit type: their contract is exact FP32 on
// the rounded operands), the shape is one Winograd computes and the rule says it pays (or
// `everywhere`: ConvAlgorithm::winograd_everywhere skips the rule, for measurements).
dnnl::algorithm algorithm_for(bool winograd_on, bool everywhere, Direction dir,
                              const sdk::Conv2dGeometry& g, const Route& r, DType a, DType b) {
  const bool pure_fp32 = a == DType::fp32 && b == DType::fp32 && !r.tf32 && !r.native_bf16;
  return winograd_on && pure_fp32 && winograd_shape(g) && (everywhere || winograd_pays(dir, g))
             ? kWinograd
             : kDirect;
}

void require_disjoint(std::string_view op, std::string_view out_name, const TensorView& out,
                      std::string_view in_name, const TensorView& in) {
  if (overlaps(out, in))
    fail(op, std::string(out_name) + " overlaps " + std::string(in_name),
         "write the output into a separate buffer");
}

}  // namespace

bool CpuBackend::bf16_conv_native() const {
  if (bf16_conv_state_ >= 0) return bf16_conv_state_ == 1;
  // What oneDNN runs for a ResNet-like bf16 3x3 convolution here; none means no bf16 kernel.
  std::string impl;
  try {
    sdk::Conv2dGeometry g;
    g.batch = 8;
    g.in_channels = g.out_channels = 64;
    g.height = g.width = 16;
    g.kernel_h = g.kernel_w = 3;
    g.pad_h = g.pad_w = 1;
    impl = forward_pd(prims_->engine(), g, memory::data_type::bf16, memory::data_type::f32, false,
                      kDirect)
               .impl_info_str();
  } catch (const dnnl::error&) {
    impl.clear();
  }
  const bool usable = !impl.empty() && !is_reference_kernel(impl);
  bool native = false;
  switch (bf16_conv_request_) {
    case Bf16ConvPath::emulated:
      bf16_conv_note_ = "bf16_conv = emulated";
      break;
    case Bf16ConvPath::onednn:
      native = !impl.empty();
      bf16_conv_note_ = native ? "bf16_conv = onednn (" + impl + ")"
                               : "oneDNN has no bf16 convolution on this CPU";
      break;
    case Bf16ConvPath::automatic: {
      const CpuInfo cpu = detect_cpu();
      native = usable && onednn_bf16_preferred(cpu);
      if (impl.empty())
        bf16_conv_note_ = "oneDNN has no bf16 convolution on this CPU";
      else if (!usable)
        bf16_conv_note_ = "oneDNN's bf16 convolution here is a reference kernel (" + impl + ")";
      else if (!native)
        bf16_conv_note_ = "oneDNN's " + impl +
                          " is not preferred on this CPU (bf16 kernels run natively with AMX-BF16, "
                          "or AVX512-BF16 on AMD); bf16_conv = \"onednn\" forces it";
      else
        bf16_conv_note_ = impl + (cpu.has("amx_bf16") ? " (AMX-BF16)" : " (AVX512-BF16, AMD)");
      break;
    }
  }
  bf16_conv_state_ = native ? 1 : 0;
  return native;
}

std::string CpuBackend::bf16_conv_note() const {
  bf16_conv_native();
  return bf16_conv_note_;
}

bool CpuBackend::conv_winograd_available() const {
  if (winograd_state_ >= 0) return winograd_state_ == 1;
  // What oneDNN runs for a ResNet-like fp32 3x3 Winograd convolution here.
  bool usable = false;
  try {
    sdk::Conv2dGeometry g;
    g.batch = 8;
    g.in_channels = g.out_channels = 64;
    g.height = g.width = 16;
    g.kernel_h = g.kernel_w = 3;
    g.pad_h = g.pad_w = 1;
    winograd_impl_ = forward_pd(prims_->engine(), g, memory::data_type::f32, memory::data_type::f32,
                                false, kWinograd)
                         .impl_info_str();
    usable = !is_reference_kernel(winograd_impl_);
    if (!usable) winograd_impl_ = "only a reference kernel (" + winograd_impl_ + ")";
  } catch (const dnnl::error& e) {
    winograd_impl_ = std::string("no kernel: ") + e.what();
  }
  winograd_state_ = usable ? 1 : 0;
  return usable;
}

std::string CpuBackend::conv_algorithm_note() const {
  if (conv_algorithm_ == ConvAlgorithm::direct) return "conv_algorithm = direct";
  if (!conv_winograd_available())
    return "conv_algorithm = winograd, but oneDNN has no fp32 Winograd convolution on this CPU (" +
           winograd_impl_ + "; it needs AVX-512): every convolution runs direct";
  if (conv_algorithm_ == ConvAlgorithm::winograd_everywhere)
    return "conv_algorithm = winograd everywhere (no rule): oneDNN's " + winograd_impl_ +
           " for every fp32 3x3 stride-1 convolution it computes, direct elsewhere";
  return "conv_algorithm = winograd: oneDNN's " + winograd_impl_ +
         " for fp32 3x3 stride-1 convolutions with N*OH*OW*C*O >= 2^23 and C, O >= 16 "
         "(forward: C >= 32; backward-data: O >= 32), direct elsewhere";
}

void CpuBackend::conv2d_forward(const sdk::Conv2dForwardArgs& args) {
  constexpr std::string_view op = "conv2d_forward";
  use_threads();
  const sdk::Conv2dGeometry& g = args.geometry;
  check_geometry(op, g);
  check_operand(op, "x", args.x);
  check_operand(op, "w", args.w);
  check_output(op, "y", args.y);
  check_compute(op, args.compute);
  const std::int64_t oh = g.out_height(), ow = g.out_width();
  check_tensor(op, "x", args.x.view, {g.batch, g.height, g.width, g.in_channels}, "[N, H, W, C]");
  check_tensor(op, "w", args.w.view,
               {g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w},
               "[O, C/groups, KH, KW]");
  check_tensor(op, "y", args.y, {g.batch, oh, ow, g.out_channels}, "[N, OH, OW, O]");
  const bool has_bias = !args.bias.empty();
  if (has_bias) {
    require_fp32(op, "bias", args.bias);
    require_numel(op, "bias", args.bias, g.out_channels);
  }
  require_disjoint(op, "y", args.y, "x", args.x.view);
  require_disjoint(op, "y", args.y, "w", args.w.view);

  // With an fp8 scale the bias is added after it (y = s·conv + b), outside the primitive.
  const float scale = fp8_scale(args.x) * fp8_scale(args.w);
  const bool bias_inside = has_bias && scale == 1.0f;
  Route r = route_of(args.x.view.dtype, args.w.view.dtype, args.compute, bf16_conv_native());
  const dnnl::algorithm alg =
      algorithm_for(winograd_on(), conv_algorithm_ == ConvAlgorithm::winograd_everywhere,
                    Direction::forward, g, r, args.x.view.dtype, args.w.view.dtype);
  ForwardEntry* e =
      &forward_entry(*prims_, op, g, r.dt, out_type(r, args.y, scale), bias_inside, alg);
  if (!e->usable) e = &forward_entry(*prims_, op, g, r.dt, out_type(r, args.y, scale), bias_inside);
  if (r.native_bf16 && is_reference_kernel(e->implementation)) {
    r = fp32_route(r);
    e = &forward_entry(*prims_, op, g, r.dt, out_type(r, args.y, scale), bias_inside);
  }

  const void* src =
      to_primitive(*prims_, e->src, prepare(*prims_, args.x.view, r, Slot::src), Slot::blocked_a);
  const void* wei = prepare_weights(*prims_, args.w.view, r, e->weights);
  const bool direct = writes_directly(r, args.y, scale);
  void* dst = direct ? args.y.data
                     : prims_->scratch<float>(Slot::dst, static_cast<std::size_t>(args.y.numel()));
  void* written = primitive_output(*prims_, e->dst, dst, Slot::blocked_b);
  std::unordered_map<int, memory> exec{{DNNL_ARG_SRC, prims_->wrap(e->src.primitive_md, src)},
                                       {DNNL_ARG_WEIGHTS, prims_->wrap(e->weights.blocked_md, wei)},
                                       {DNNL_ARG_DST, prims_->wrap(e->dst.primitive_md, written)}};
  if (bias_inside) exec.emplace(DNNL_ARG_BIAS, prims_->wrap(e->bias_md, args.bias.data));
  prims_->execute(e->primitive, exec);
  from_primitive(*prims_, e->dst, written, dst);
  last_conv_impl_ = e->implementation;
  if (!direct)
    finish_output(static_cast<const float*>(dst), args.y, g.out_channels, scale,
                  has_bias && !bias_inside ? args.bias.as<const float>() : nullptr);
  account_scratch();
}

void CpuBackend::conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& args) {
  constexpr std::string_view op = "conv2d_backward_data";
  use_threads();
  const sdk::Conv2dGeometry& g = args.geometry;
  check_geometry(op, g);
  check_operand(op, "dy", args.dy);
  check_operand(op, "w", args.w);
  check_output(op, "dx", args.dx);
  check_compute(op, args.compute);
  const std::int64_t oh = g.out_height(), ow = g.out_width();
  check_tensor(op, "dy", args.dy.view, {g.batch, oh, ow, g.out_channels}, "[N, OH, OW, O]");
  check_tensor(op, "w", args.w.view,
               {g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w},
               "[O, C/groups, KH, KW]");
  check_tensor(op, "dx", args.dx, {g.batch, g.height, g.width, g.in_channels}, "[N, H, W, C]");
  require_disjoint(op, "dx", args.dx, "dy", args.dy.view);
  require_disjoint(op, "dx", args.dx, "w", args.w.view);

  const float scale = fp8_scale(args.dy) * fp8_scale(args.w);
  Route r = route_of(args.dy.view.dtype, args.w.view.dtype, args.compute, bf16_conv_native());
  const dnnl::algorithm alg =
      algorithm_for(winograd_on(), conv_algorithm_ == ConvAlgorithm::winograd_everywhere,
                    Direction::backward_data, g, r, args.dy.view.dtype, args.w.view.dtype);
  BackwardDataEntry* e =
      &backward_data_entry(*prims_, op, g, r.dt, out_type(r, args.dx, scale), alg);
  if (!e->usable) e = &backward_data_entry(*prims_, op, g, r.dt, out_type(r, args.dx, scale));
  if (r.native_bf16 && is_reference_kernel(e->implementation)) {
    r = fp32_route(r);
    e = &backward_data_entry(*prims_, op, g, r.dt, out_type(r, args.dx, scale));
  }
  const void* diff_dst = to_primitive(
      *prims_, e->diff_dst, prepare(*prims_, args.dy.view, r, Slot::src), Slot::blocked_a);
  const void* wei = prepare_weights(*prims_, args.w.view, r, e->weights);
  const bool direct = writes_directly(r, args.dx, scale);
  void* diff_src =
      direct ? args.dx.data
             : prims_->scratch<float>(Slot::dst, static_cast<std::size_t>(args.dx.numel()));
  void* written = primitive_output(*prims_, e->diff_src, diff_src, Slot::blocked_b);
  prims_->execute(e->primitive,
                  {{DNNL_ARG_DIFF_DST, prims_->wrap(e->diff_dst.primitive_md, diff_dst)},
                   {DNNL_ARG_WEIGHTS, prims_->wrap(e->weights.blocked_md, wei)},
                   {DNNL_ARG_DIFF_SRC, prims_->wrap(e->diff_src.primitive_md, written)}});
  from_primitive(*prims_, e->diff_src, written, diff_src);
  last_conv_impl_ = e->implementation;
  if (!direct)
    finish_output(static_cast<const float*>(diff_src), args.dx, g.in_channels, scale, nullptr);
  account_scratch();
}

void CpuBackend::conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& args) {
  constexpr std::string_view op = "conv2d_backward_weights";
  use_threads();
  const sdk::Conv2dGeometry& g = args.geometry;
  check_geometry(op, g);
  check_operand(op, "x", args.x);
  check_operand(op, "dy", args.dy);
  check_compute(op, args.compute);
  const std::int64_t oh = g.out_height(), ow = g.out_width();
  check_tensor(op, "x", args.x.view, {g.batch, g.height, g.width, g.in_channels}, "[N, H, W, C]");
  check_tensor(op, "dy", args.dy.view, {g.batch, oh, ow, g.out_channels}, "[N, OH, OW, O]");
  require_fp32(op, "dw", args.dw);
  check_tensor(op, "dw", args.dw,
               {g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w},
               "[O, C/groups, KH, KW]");
  const bool has_bias = !args.dbias.empty();
  if (has_bias) {
    require_fp32(op, "dbias", args.dbias);
    require_numel(op, "dbias", args.dbias, g.out_channels);
  }

  const float w_scale = fp8_scale(args.x) * fp8_scale(args.dy);
  const float b_scale = fp8_scale(args.dy);
  Route r = route_of(args.x.view.dtype, args.dy.view.dtype, args.compute, bf16_conv_native());
  const dnnl::algorithm alg =
      algorithm_for(winograd_on(), conv_algorithm_ == ConvAlgorithm::winograd_everywhere,
                    Direction::backward_weights, g, r, args.x.view.dtype, args.dy.view.dtype);
  BackwardWeightsEntry* e = &backward_weights_entry(*prims_, op, g, r.dt, has_bias, alg);
  if (!e->usable) e = &backward_weights_entry(*prims_, op, g, r.dt, has_bias);
  if (r.native_bf16 && is_reference_kernel(e->implementation)) {
    r = fp32_route(r);
    e = &backward_weights_entry(*prims_, op, g, r.dt, has_bias);
  }
  const void* src =
      to_primitive(*prims_, e->src, prepare(*prims_, args.x.view, r, Slot::src), Slot::blocked_a);
  const void* diff_dst = to_primitive(
      *prims_, e->diff_dst, prepare(*prims_, args.dy.view, r, Slot::extra_b), Slot::blocked_b);
  const bool acc = args.accumulate;
  const bool w_direct = e->plain && !acc && w_scale == 1.0f;
  void* diff_w = w_direct
                     ? args.dw.data
                     : prims_->scratch<char>(Slot::diff_blocked, e->diff_weights_md.get_size());
  const bool b_direct = !acc && b_scale == 1.0f;
  float* diff_b =
      !has_bias  ? nullptr
      : b_direct ? args.dbias.as<float>()
                 : prims_->scratch<float>(Slot::extra_a, static_cast<std::size_t>(g.out_channels));
  std::unordered_map<int, memory> exec{
      {DNNL_ARG_SRC, prims_->wrap(e->src.primitive_md, src)},
      {DNNL_ARG_DIFF_DST, prims_->wrap(e->diff_dst.primitive_md, diff_dst)},
      {DNNL_ARG_DIFF_WEIGHTS, prims_->wrap(e->diff_weights_md, diff_w)}};
  if (has_bias) exec.emplace(DNNL_ARG_DIFF_BIAS, prims_->wrap(e->diff_bias_md, diff_b));
  prims_->execute(e->primitive, exec);
  last_conv_impl_ = e->implementation;

  if (!w_direct) {
    const memory from = prims_->wrap(e->diff_weights_md, diff_w);
    if (w_scale == 1.0f) {
      prims_->execute(
          acc ? e->add_to_plain : e->to_plain,
          {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, prims_->wrap(e->plain_md, args.dw.data)}});
    } else {
      const std::int64_t n = args.dw.numel();
      const float* plain = static_cast<const float*>(diff_w);
      if (!e->plain) {
        float* tmp = prims_->scratch<float>(Slot::weights, static_cast<std::size_t>(n));
        prims_->execute(e->to_plain,
                        {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, prims_->wrap(e->plain_md, tmp)}});
        plain = tmp;
      }
      scale_into(plain, args.dw.as<float>(), n, w_scale, acc);
    }
  }
  if (has_bias && !b_direct)
    scale_into(diff_b, args.dbias.as<float>(), g.out_channels, b_scale, acc);
  account_scratch();
}

}  // namespace mixtrain::backend_cpu
