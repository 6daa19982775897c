// The convolution facet's conv2d ops (forward, backward-data, backward-weights) on oneDNN.
//
// Layout: activations are channels-last, oneDNN's nhwc ({N, C, H, W} dims, acdb memory), passed
// to the direct primitives as they are, or reordered into oneDNN's blocked layout and back where
// that pays (below). Weights arrive in PyTorch's [O, C/g, KH, KW] (oihw; goihw with
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
// - "direct" (default, the reference): oneDNN's direct convolution, always; in oneDNN's blocked
//   layout where cpu_conv_algorithm.h's rule takes the direction and shape on this CPU (3x3 with
//   32 or more channels each side, where oneDNN's direct kernel is its AVX2 one), else in nhwc.
// - "winograd": oneDNN's Winograd F(4,3) where cpu_conv_algorithm.h's rule takes a convolution
//   on the pure fp32 route (both operands fp32 as stored, fp32 compute); activations are
//   reordered to its blocked layout around the call (cpu_conv_primitives.h). Everything else, and
//   every convolution oneDNN has no Winograd kernel for, runs direct.
//
// As one GEMM (cpu_conv_gemm.h) where cpu_conv_gemm_rule.h's rule takes it (the option conv_gemm;
// by default bf16 operands with AMX), oneDNN's convolution otherwise: weight gradients, dyᵀ·cols
// over x or its gathered columns (1x1 and wide 3x3 convolutions); the data gradient of a 1x1
// convolution, dy·w, with beta = 1 into dx when accumulating (supports() then offers the op);
// the forward of a 1x1 convolution on a small map, x·wᵀ with w read where it is (no reorder).
//
// The primitives, their cached descriptors and reorders live in cpu_conv_primitives.{h,cpp};
// this file checks the arguments, picks the route and the algorithm, and runs them.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cpu_access.h"
#include "cpu_context.h"
#include "cpu_conv_algorithm.h"
#include "cpu_conv_gemm.h"
#include "cpu_conv_gemm_rule.h"
#include "cpu_conv_primitives.h"
#include "cpu_features.h"
#include "cpu_gemm.h"
#include "cpu_permute.h"
#include "cpu_pooling.h"
#include "cpu_primitive_cache.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;
using sdk::DType;
using sdk::TensorView;
using Slot = PrimitiveCache::Slot;

namespace {

bool is_conv_operand(DType t) {
  return is_storage_float(t) || sdk::is_fp8(t);
}

void check_operand(std::string_view op, std::string_view name, const sdk::GemmOperand& o) {
  if (!is_conv_operand(o.view.dtype))
    fail(op,
         std::string(name) + " is " + describe(o.view) +
             "; convolution operands are fp32, tf32, bf16, fp16, fp8_e4m3 or fp8_e5m2",
         "cast the tensor first (backend.cast)");
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

// Which of conv_gemm's rules the route's operands fall under (cpu_conv_gemm_rule.h).
ConvGemmOperands gemm_operands(const Route& r, DType a, DType b) {
  if (r.native_bf16) return ConvGemmOperands::native_bf16;
  if (a == DType::fp32 && b == DType::fp32 && !r.tf32) return ConvGemmOperands::fp32;
  return ConvGemmOperands::other;
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

// A 16-bit sum's accumulate (backend_convolution.h): dx = round(dx + src·scale), the sum in fp32
// rounded once into dx's dtype, in chunks.
void scale_into_16(const float* src, const sdk::TensorView& dx, float scale) {
  const std::int64_t n = dx.numel();
  std::vector<float> buf(static_cast<std::size_t>(std::min(n, kDecodeChunk)));
  for (std::int64_t c0 = 0; c0 < n; c0 += kDecodeChunk) {
    const std::int64_t len = std::min(kDecodeChunk, n - c0);
    decode_into(dx, c0, len, buf.data());
    for (std::int64_t i = 0; i < len; ++i) buf[static_cast<std::size_t>(i)] += src[c0 + i] * scale;
    commit_chunk(dx, c0, len, buf.data());
  }
}

// How a convolution runs (cpu_conv_algorithm.h): Winograd where it is on, the operands are fp32
// as stored with fp32 compute (not tf32, not bf16, not a decoded 16/8-bit type: their contract
// is exact FP32 on the rounded operands), the shape is one Winograd computes and the rule says it
// pays (or ConvAlgorithm::winograd_everywhere, which skips the rule); else the direct
// convolution, in the blocked layout where the context says so for this shape (any route: the
// same FP32 sum in another order), else in nhwc.
ConvMethod method_for(const CpuContext& context, Direction dir, const sdk::Conv2dGeometry& g,
                      const Route& r, DType a, DType b) {
  const bool everywhere = context.conv_algorithm() == ConvAlgorithm::winograd_everywhere;
  const bool pure_fp32 = a == DType::fp32 && b == DType::fp32 && !r.tf32 && !r.native_bf16;
  if (context.winograd_on() && pure_fp32 && winograd_shape(g) &&
      (everywhere || winograd_pays(dir, g)))
    return ConvMethod::winograd;
  return context.blocked_layout_for(dir, g) ? ConvMethod::direct_blocked : ConvMethod::direct;
}

// The entry a call runs, from make(route, method): `method`'s; the direct one when oneDNN has no
// usable kernel for `method`; and, when the native bf16 route's kernel is a reference kernel, the
// fp32 route's direct entry, with `r` switched to that route.
template <class Make>
auto& pick_entry(Route& r, ConvMethod method, Make&& make) {
  auto* e = &make(r, method);
  if (!e->usable) e = &make(r, ConvMethod::direct);
  if (r.native_bf16 && is_reference_kernel(e->implementation)) {
    r = fp32_route(r);
    e = &make(r, ConvMethod::direct);
  }
  return *e;
}

// A call's scratch (convolution facet 1.2): from the caller's workspace when it holds every
// request (the primitive cache lends it), else from the cache's own slots; with `measure`, the
// call runs nothing and sets *measure to the workspace bytes its requests take.
struct CallScratch {
  TensorView given;
  std::size_t* measure = nullptr;
};

// The bytes prepare() asks of a slot for `v` on route `r`: its exact fp32 values, or none.
std::size_t decode_bytes(const TensorView& v, const Route& r) {
  const bool fp32 = is_fp32_storage(v.dtype);
  return r.native_bf16 || (fp32 && !r.tf32) ? 0 : static_cast<std::size_t>(v.numel()) * 4;
}
// The bytes to_primitive() / primitive_output() ask for an activation in the entry's layout.
std::size_t blocked_bytes(const ActivationLayout& a) {
  return a.reorder ? a.primitive_md.get_size() : 0;
}
std::size_t blocked_bytes(const WeightsReorder& w) {
  return w.reorder ? w.blocked_md.get_size() : 0;
}

// Measures (true: the caller returns) or, where the workspace holds `requests`, lends it to the
// cache for the call (`lease`).
bool measure_or_lend(PrimitiveCache& cache, const CallScratch& s,
                     std::initializer_list<std::size_t> requests,
                     std::optional<PrimitiveCache::Lease>& lease) {
  const std::size_t bytes =
      PrimitiveCache::lent_bytes(std::span<const std::size_t>(requests.begin(), requests.size()));
  if (s.measure != nullptr) {
    *s.measure = bytes;
    return true;
  }
  if (bytes > 0 && s.given.bytes() >= bytes) lease.emplace(cache, s.given.data, s.given.bytes());
  return false;
}

void run_forward(CpuContext& context, const sdk::Conv2dForwardArgs& args, const CallScratch& s);
void run_backward_data(CpuContext& context, const sdk::Conv2dBackwardDataArgs& args,
                       bool accumulate, const CallScratch& s);
void run_backward_weights(CpuContext& context, const sdk::Conv2dBackwardWeightsArgs& args,
                          const CallScratch& s);

}  // namespace

namespace {

class CpuConvolution final : public sdk::ConvolutionFacet {
 public:
  explicit CpuConvolution(CpuContext& context) : context_(context) {}

  void conv2d_forward(const sdk::Conv2dForwardArgs& args) override;
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& args) override;
  void conv2d_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& args) override;
  bool supports(sdk::ConvolutionOp op, std::span<const sdk::DType> dtypes) const override;
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
  // 1.2: the scratch a call takes from the primitive cache's slots (decoded operands, the fp32
  // output before its rounding, activations and weights in a primitive's blocked layout), from
  // the caller's workspace when it holds all of it. oneDNN's own scratchpad stays oneDNN's.
  std::size_t conv2d_workspace_bytes(const sdk::Conv2dWorkspaceQuery& query) const override;
  void conv2d_forward_with_workspace(const sdk::Conv2dForwardArgs& args,
                                     sdk::TensorView workspace) override;
  void conv2d_backward_data_with_workspace(const sdk::Conv2dBackwardDataArgs& args,
                                           sdk::TensorView workspace) override;
  void conv2d_backward_data_accumulate_with_workspace(const sdk::Conv2dBackwardDataArgs& args,
                                                      sdk::TensorView workspace) override;
  void conv2d_backward_weights_with_workspace(const sdk::Conv2dBackwardWeightsArgs& args,
                                              sdk::TensorView workspace) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::ConvolutionFacet, CpuConvolution> kRegistration;

}  // namespace

void CpuConvolution::conv2d_forward(const sdk::Conv2dForwardArgs& args) {
  run_forward(context_, args, {});
}

void CpuConvolution::conv2d_forward_with_workspace(const sdk::Conv2dForwardArgs& args,
                                                   TensorView workspace) {
  checks().conv2d_workspace("conv2d_forward", workspace, args);
  run_forward(context_, args, {workspace});
}

namespace {

void run_forward(CpuContext& context, const sdk::Conv2dForwardArgs& args, const CallScratch& s) {
  constexpr std::string_view op = "conv2d_forward";
  context.use_threads();
  const sdk::Conv2dGeometry& g = args.geometry;
  check_operand(op, "x", args.x);
  check_operand(op, "w", args.w);
  check_output(op, "y", args.y);
  check_compute(op, args.compute);
  if (s.measure == nullptr) checks().conv2d_forward(args);
  const bool has_bias = !args.bias.empty();

  // With an fp8 scale the bias is added after it (y = s·conv + b), outside the primitive.
  const float scale = fp8_scale(args.x) * fp8_scale(args.w);
  const bool bias_inside = has_bias && scale == 1.0f;
  Route r =
      route_of(args.x.view.dtype, args.w.view.dtype, args.compute, context.bf16_conv_native());
  if (context.fprop_as_gemm(g, gemm_operands(r, args.x.view.dtype, args.w.view.dtype))) {
    // A 1x1 forward as one GEMM (cpu_conv_gemm_rule.h): w read as stored, no reorder; past
    // stride 1 the strided pixels of x are the call's scratch.
    const std::size_t cols = fprop_gemm_cols_bytes(g, args.x.view.dtype);
    std::optional<PrimitiveCache::Lease> lease;
    if (measure_or_lend(context.prims(), s, {cols}, lease)) return;
    forward_as_gemm(context, args,
                    cols > 0 ? context.prims().scratch<char>(Slot::src, cols) : nullptr);
    context.record_conv_implementation("gemm " + context.gemm().last_implementation());
    context.account_scratch();
    return;
  }
  const ConvMethod method =
      method_for(context, Direction::forward, g, r, args.x.view.dtype, args.w.view.dtype);
  ForwardEntry* e = &pick_entry(
      r, method, [&](const Route& rr, ConvMethod m) -> auto& {
        return forward_entry(context.prims(), op, g, rr.dt, out_type(rr, args.y, scale),
                             bias_inside, m);
      });
  const bool direct = writes_directly(r, args.y, scale);
  std::optional<PrimitiveCache::Lease> lease;
  if (measure_or_lend(
          context.prims(), s,
          {decode_bytes(args.x.view, r), blocked_bytes(e->src), decode_bytes(args.w.view, r),
           blocked_bytes(e->weights), direct ? 0 : static_cast<std::size_t>(args.y.numel()) * 4,
           blocked_bytes(e->dst)},
          lease))
    return;

  const void* src =
      to_primitive(context.prims(), e->src, prepare(context.prims(), args.x.view, r, Slot::src),
                   Slot::blocked_a);
  const void* wei = prepare_weights(context.prims(), args.w.view, r, e->weights);
  void* dst =
      direct ? args.y.data
             : context.prims().scratch<float>(Slot::dst, static_cast<std::size_t>(args.y.numel()));
  void* written = primitive_output(context.prims(), e->dst, dst, Slot::blocked_b);
  std::unordered_map<int, memory> exec{
      {DNNL_ARG_SRC, context.prims().wrap(e->src.primitive_md, src)},
      {DNNL_ARG_WEIGHTS, context.prims().wrap(e->weights.blocked_md, wei)},
      {DNNL_ARG_DST, context.prims().wrap(e->dst.primitive_md, written)}};
  if (bias_inside) exec.emplace(DNNL_ARG_BIAS, context.prims().wrap(e->bias_md, args.bias.data));
  context.prims().execute(e->primitive, exec);
  from_primitive(context.prims(), e->dst, written, dst);
  context.record_conv_implementation(e->implementation);
  if (!direct)
    finish_output(static_cast<const float*>(dst), args.y, g.out_channels, scale,
                  has_bias && !bias_inside ? args.bias.as<const float>() : nullptr);
  context.account_scratch();
}

}  // namespace

bool CpuConvolution::supports(sdk::ConvolutionOp op, std::span<const DType> dtypes) const {
  // The accumulating data gradient is offered where cpu_conv_gemm_rule.h's rule runs a
  // 1x1 one as a GEMM (by default bf16 operands with AMX-BF16, into an fp32 sum): ResNet's
  // Bottleneck adds its input's gradient through its first convolution and its downsampling
  // shortcut, both 1x1. Its other shapes are implemented too (the reference the host's tests put
  // behind a facet that offers it): oneDNN's backward primitives take no sum post-op, so they
  // write an fp32 scratch and add it, which alone measured no faster than the bf16 contribution
  // and axpy it replaces
  // (bench/RESULTS.md; docs/model-graph.md, "Input gradients added by their op").
  if (op == sdk::ConvolutionOp::conv2d_backward_data_accumulate)
    return dtypes.size() == 3 && is_conv_operand(dtypes[0]) && is_conv_operand(dtypes[1]) &&
           context_.offers_dgrad_accumulate(dtypes[0], dtypes[1], dtypes[2]);
  return sdk::ConvolutionFacet::supports(op, dtypes);
}

void CpuConvolution::conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& args) {
  run_backward_data(context_, args, false, {});
}

void CpuConvolution::conv2d_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& args) {
  run_backward_data(context_, args, true, {});
}

void CpuConvolution::conv2d_backward_data_with_workspace(const sdk::Conv2dBackwardDataArgs& args,
                                                         TensorView workspace) {
  checks().conv2d_workspace("conv2d_backward_data", workspace, args);
  run_backward_data(context_, args, false, {workspace});
}

void CpuConvolution::conv2d_backward_data_accumulate_with_workspace(
    const sdk::Conv2dBackwardDataArgs& args, TensorView workspace) {
  checks().conv2d_workspace("conv2d_backward_data_accumulate", workspace, args);
  run_backward_data(context_, args, true, {workspace});
}

namespace {

// dx = (or += when accumulating, dx fp32 or a 16-bit sum) the data gradient.
void run_backward_data(CpuContext& context, const sdk::Conv2dBackwardDataArgs& args,
                       bool accumulate, const CallScratch& s) {
  const std::string_view op =
      accumulate ? "conv2d_backward_data_accumulate" : "conv2d_backward_data";
  context.use_threads();
  const sdk::Conv2dGeometry& g = args.geometry;
  check_operand(op, "dy", args.dy);
  check_operand(op, "w", args.w);
  check_output(op, "dx", args.dx);
  check_compute(op, args.compute);
  // A measured call's views have no data: the query was checked instead.
  if (s.measure == nullptr && accumulate) checks().conv2d_backward_data_accumulate(args);
  if (s.measure == nullptr && !accumulate) checks().conv2d_backward_data(args);

  const float scale = fp8_scale(args.dy) * fp8_scale(args.w);
  Route r =
      route_of(args.dy.view.dtype, args.w.view.dtype, args.compute, context.bf16_conv_native());
  if (context.dgrad_as_gemm(g, gemm_operands(r, args.dy.view.dtype, args.w.view.dtype),
                            args.dx.dtype, accumulate)) {
    // A 1x1 data gradient as one GEMM (cpu_conv_gemm_rule.h), written into an fp32 dx at stride 1
    // (added with beta = 1 when accumulating); otherwise the fp32 product is the call's scratch.
    const std::size_t product = dgrad_gemm_product_bytes(context, args);
    std::optional<PrimitiveCache::Lease> lease;
    if (measure_or_lend(context.prims(), s, {product}, lease)) return;
    data_gradient_as_gemm(
        context, args, accumulate,
        product > 0 ? context.prims().scratch<float>(Slot::dst, product / 4) : nullptr);
    context.record_conv_implementation("gemm " + context.gemm().last_implementation());
    context.account_scratch();
    return;
  }
  const ConvMethod method =
      method_for(context, Direction::backward_data, g, r, args.dy.view.dtype, args.w.view.dtype);
  BackwardDataEntry* e = &pick_entry(
      r, method, [&](const Route& rr, ConvMethod m) -> auto& {
        // Accumulating, the primitive writes fp32 (dx's old value is added afterwards).
        return backward_data_entry(
            context.prims(), op, g, rr.dt,
            accumulate ? memory::data_type::f32 : out_type(rr, args.dx, scale), m);
      });
  const bool direct = !accumulate && writes_directly(r, args.dx, scale);
  std::optional<PrimitiveCache::Lease> lease;
  if (measure_or_lend(
          context.prims(), s,
          {decode_bytes(args.dy.view, r), blocked_bytes(e->diff_dst), decode_bytes(args.w.view, r),
           blocked_bytes(e->weights), direct ? 0 : static_cast<std::size_t>(args.dx.numel()) * 4,
           blocked_bytes(e->diff_src)},
          lease))
    return;
  const void* diff_dst =
      to_primitive(context.prims(), e->diff_dst,
                   prepare(context.prims(), args.dy.view, r, Slot::src), Slot::blocked_a);
  const void* wei = prepare_weights(context.prims(), args.w.view, r, e->weights);
  void* diff_src =
      direct ? args.dx.data
             : context.prims().scratch<float>(Slot::dst, static_cast<std::size_t>(args.dx.numel()));
  void* written = primitive_output(context.prims(), e->diff_src, diff_src, Slot::blocked_b);
  context.prims().execute(
      e->primitive, {{DNNL_ARG_DIFF_DST, context.prims().wrap(e->diff_dst.primitive_md, diff_dst)},
                     {DNNL_ARG_WEIGHTS, context.prims().wrap(e->weights.blocked_md, wei)},
                     {DNNL_ARG_DIFF_SRC, context.prims().wrap(e->diff_src.primitive_md, written)}});
  from_primitive(context.prims(), e->diff_src, written, diff_src);
  context.record_conv_implementation(e->implementation);
  if (accumulate && args.dx.dtype != DType::fp32)
    scale_into_16(static_cast<const float*>(diff_src), args.dx, scale);
  else if (accumulate)
    scale_into(static_cast<const float*>(diff_src), args.dx.as<float>(), args.dx.numel(), scale,
               true);
  else if (!direct)
    finish_output(static_cast<const float*>(diff_src), args.dx, g.in_channels, scale, nullptr);
  context.account_scratch();
}

}  // namespace

void CpuConvolution::conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& args) {
  run_backward_weights(context_, args, {});
}

void CpuConvolution::conv2d_backward_weights_with_workspace(
    const sdk::Conv2dBackwardWeightsArgs& args, TensorView workspace) {
  checks().conv2d_workspace("conv2d_backward_weights", workspace, args);
  run_backward_weights(context_, args, {workspace});
}

namespace {

void run_backward_weights(CpuContext& context, const sdk::Conv2dBackwardWeightsArgs& args,
                          const CallScratch& s) {
  constexpr std::string_view op = "conv2d_backward_weights";
  context.use_threads();
  const sdk::Conv2dGeometry& g = args.geometry;
  check_operand(op, "x", args.x);
  check_operand(op, "dy", args.dy);
  check_compute(op, args.compute);
  if (s.measure == nullptr) checks().conv2d_backward_weights(args);
  const bool has_bias = !args.dbias.empty();

  const float w_scale = fp8_scale(args.x) * fp8_scale(args.dy);
  const float b_scale = fp8_scale(args.dy);
  Route r =
      route_of(args.x.view.dtype, args.dy.view.dtype, args.compute, context.bf16_conv_native());
  if (context.wgrad_as_gemm(g, gemm_operands(r, args.x.view.dtype, args.dy.view.dtype),
                            has_bias && sdk::is_fp8(args.dy.view.dtype))) {
    // The weight gradient as one GEMM (cpu_conv_gemm_rule.h): its scratch is x's gathered
    // columns and, in OHWI's column order, the product before its reorder into OIHW.
    const WgradColumns columns = wgrad_columns(g);
    const std::size_t cols = wgrad_gemm_cols_bytes(g, args.x.view.dtype);
    const std::size_t product = wgrad_gemm_product_bytes(g, columns);
    std::optional<PrimitiveCache::Lease> lease;
    if (measure_or_lend(context.prims(), s, {cols, product}, lease)) return;
    weight_gradient_as_gemm(
        context, args, columns, cols > 0 ? context.prims().scratch<char>(Slot::src, cols) : nullptr,
        product > 0 ? context.prims().scratch<float>(Slot::dst, product / 4) : nullptr);
    context.record_conv_implementation("gemm " + context.gemm().last_implementation());
    context.account_scratch();
    return;
  }
  const ConvMethod method =
      method_for(context, Direction::backward_weights, g, r, args.x.view.dtype, args.dy.view.dtype);
  BackwardWeightsEntry* e = &pick_entry(
      r, method, [&](const Route& rr, ConvMethod m) -> auto& {
        return backward_weights_entry(context.prims(), op, g, rr.dt, has_bias, m);
      });
  const bool acc = args.accumulate;
  const bool w_direct = e->plain && !acc && w_scale == 1.0f;
  const bool b_direct = !acc && b_scale == 1.0f;
  std::optional<PrimitiveCache::Lease> lease;
  if (measure_or_lend(
          context.prims(), s,
          {decode_bytes(args.x.view, r), blocked_bytes(e->src), decode_bytes(args.dy.view, r),
           blocked_bytes(e->diff_dst), w_direct ? 0 : e->diff_weights_md.get_size(),
           has_bias && !b_direct ? static_cast<std::size_t>(g.out_channels) * 4 : 0,
           !w_direct && w_scale != 1.0f && !e->plain ? static_cast<std::size_t>(args.dw.numel()) * 4
                                                     : 0},
          lease))
    return;
  const void* src =
      to_primitive(context.prims(), e->src, prepare(context.prims(), args.x.view, r, Slot::src),
                   Slot::blocked_a);
  const void* diff_dst =
      to_primitive(context.prims(), e->diff_dst,
                   prepare(context.prims(), args.dy.view, r, Slot::extra_b), Slot::blocked_b);
  void* diff_w =
      w_direct ? args.dw.data
               : context.prims().scratch<char>(Slot::diff_blocked, e->diff_weights_md.get_size());
  float* diff_b = !has_bias  ? nullptr
                  : b_direct ? args.dbias.as<float>()
                             : context.prims().scratch<float>(
                                   Slot::extra_a, static_cast<std::size_t>(g.out_channels));
  std::unordered_map<int, memory> exec{
      {DNNL_ARG_SRC, context.prims().wrap(e->src.primitive_md, src)},
      {DNNL_ARG_DIFF_DST, context.prims().wrap(e->diff_dst.primitive_md, diff_dst)},
      {DNNL_ARG_DIFF_WEIGHTS, context.prims().wrap(e->diff_weights_md, diff_w)}};
  if (has_bias) exec.emplace(DNNL_ARG_DIFF_BIAS, context.prims().wrap(e->diff_bias_md, diff_b));
  context.prims().execute(e->primitive, exec);
  context.record_conv_implementation(e->implementation);

  if (!w_direct) {
    const memory from = context.prims().wrap(e->diff_weights_md, diff_w);
    if (w_scale == 1.0f) {
      context.prims().execute(
          acc ? e->add_to_plain : e->to_plain,
          {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, context.prims().wrap(e->plain_md, args.dw.data)}});
    } else {
      const std::int64_t n = args.dw.numel();
      const float* plain = static_cast<const float*>(diff_w);
      if (!e->plain) {
        float* tmp = context.prims().scratch<float>(Slot::weights, static_cast<std::size_t>(n));
        context.prims().execute(
            e->to_plain,
            {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, context.prims().wrap(e->plain_md, tmp)}});
        plain = tmp;
      }
      scale_into(plain, args.dw.as<float>(), n, w_scale, acc);
    }
  }
  if (has_bias && !b_direct)
    scale_into(diff_b, args.dbias.as<float>(), g.out_channels, b_scale, acc);
  context.account_scratch();
}

}  // namespace

std::size_t CpuConvolution::conv2d_workspace_bytes(const sdk::Conv2dWorkspaceQuery& q) const {
  checks().conv2d_workspace_query(q);
  if (!context_.conv_workspace()) return 0;  // the option conv_workspace = false
  const sdk::Conv2dGeometry& g = q.geometry;
  const sdk::Shape xs{g.batch, g.height, g.width, g.in_channels};
  const sdk::Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
  const sdk::Shape ws{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
  // The call's args with the query's dtypes and shapes: no data, but for a bias, whose presence
  // decides the primitive (never read: a measured call runs nothing). An fp8 operand's scale is
  // taken as not 1, the case that asks for more (an fp32 output to scale).
  static float present = 0.0f;
  const auto operand = [](DType d, sdk::Shape shape) {
    sdk::GemmOperand o;
    o.view = {nullptr, d, shape};
    if (sdk::is_fp8(d)) o.scale_inv = 0.5f;
    return o;
  };
  const TensorView bias =
      q.bias ? TensorView{&present, DType::fp32, sdk::Shape{g.out_channels}} : TensorView{};
  std::size_t bytes = 0;
  const CallScratch measure{{}, &bytes};
  switch (q.op) {
    case sdk::ConvolutionOp::conv2d_forward: {
      sdk::Conv2dForwardArgs a;
      a.geometry = g;
      a.x = operand(q.a, xs);
      a.w = operand(q.b, ws);
      a.y = {nullptr, q.out, ys};
      a.bias = bias;
      a.compute = q.compute;
      run_forward(context_, a, measure);
      break;
    }
    case sdk::ConvolutionOp::conv2d_backward_data:
    case sdk::ConvolutionOp::conv2d_backward_data_accumulate: {
      sdk::Conv2dBackwardDataArgs a;
      a.geometry = g;
      a.dy = operand(q.a, ys);
      a.w = operand(q.b, ws);
      a.dx = {nullptr, q.out, xs};
      a.compute = q.compute;
      run_backward_data(context_, a, q.op == sdk::ConvolutionOp::conv2d_backward_data_accumulate,
                        measure);
      break;
    }
    default: {  // conv2d_backward_weights (the query's op is checked)
      sdk::Conv2dBackwardWeightsArgs a;
      a.geometry = g;
      a.x = operand(q.a, xs);
      a.dy = operand(q.b, ys);
      a.dw = {nullptr, DType::fp32, ws};
      a.dbias = bias;
      a.accumulate = q.accumulate;
      a.compute = q.compute;
      run_backward_weights(context_, a, measure);
      break;
    }
  }
  return bytes;
}

std::size_t CpuConvolution::pool2d_workspace_bytes(const sdk::Pool2dGeometry& geometry,
                                                   DType x) const {
  return pooling_workspace_bytes(geometry, x);
}

void CpuConvolution::pool2d_forward(const sdk::Pool2dGeometry& geometry, TensorView x, TensorView y,
                                    TensorView workspace) {
  pooling_forward(context_, geometry, x, y, workspace);
}

void CpuConvolution::pool2d_backward(const sdk::Pool2dGeometry& geometry, TensorView dy,
                                     TensorView x, TensorView y, TensorView workspace,
                                     TensorView dx) {
  pooling_backward(context_, geometry, dy, x, y, workspace, dx);
}

void CpuConvolution::to_channels_last(TensorView src, std::int64_t channels, std::int64_t height,
                                      std::int64_t width, TensorView dst) {
  permute_channels(context_, "to_channels_last", src, channels, height, width, dst, true);
}

void CpuConvolution::to_channels_first(TensorView src, std::int64_t channels, std::int64_t height,
                                       std::int64_t width, TensorView dst) {
  permute_channels(context_, "to_channels_first", src, channels, height, width, dst, false);
}

}  // namespace mixtrain::backend_cpu
