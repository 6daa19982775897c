// oneDNN's convolution primitives for the CPU backend's conv2d ops: their descriptors (nhwc
// activations for the direct method, oneDNN's blocked layout for the others), the cached
// primitives with their weight and activation reorders, and the moves of activations into and
// out of a primitive's layout (contract in cpu_conv_primitives.h).
#include "cpu_conv_primitives.h"

#include <string>
#include <string_view>
#include <utility>

#include "cpu_access.h"
#include "cpu_problem_text.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;
using Slot = PrimitiveCache::Slot;

namespace {

enum Tag : std::int64_t { kConvForward = 1, kConvBackwardData = 2, kConvBackwardWeights = 3 };

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

dnnl::algorithm algorithm_of(ConvMethod method) {
  return method == ConvMethod::winograd ? dnnl::algorithm::convolution_winograd
                                        : dnnl::algorithm::convolution_direct;
}

PrimitiveCache::Key key_of(Tag tag, const sdk::Conv2dGeometry& g, memory::data_type dt,
                           memory::data_type out_dt, bool bias, ConvMethod method) {
  return {tag,
          static_cast<std::int64_t>(method),
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

// The activations a primitive of `method` is described with: nhwc for the direct convolution
// (passed as they are), format `any` for the others (oneDNN picks its blocked layout, nChw8c or
// nChw16c, the only one its Winograd kernels take; the entry reorders around the call).
memory::desc input_md(const sdk::Conv2dGeometry& g, memory::data_type dt, ConvMethod method) {
  if (method == ConvMethod::direct)
    return activation_md(g.batch, g.in_channels, g.height, g.width, dt);
  return memory::desc({g.batch, g.in_channels, g.height, g.width}, dt, memory::format_tag::any);
}
memory::desc output_md(const sdk::Conv2dGeometry& g, memory::data_type dt, ConvMethod method) {
  if (method == ConvMethod::direct)
    return activation_md(g.batch, g.out_channels, g.out_height(), g.out_width(), dt);
  return memory::desc({g.batch, g.out_channels, g.out_height(), g.out_width()}, dt,
                      memory::format_tag::any);
}

// The caller's plain weights -> the layout a primitive asked for (no reorder when they agree).
WeightsReorder weights_reorder(const dnnl::engine& engine, const memory::desc& plain,
                               const memory::desc& wanted) {
  WeightsReorder w{plain, wanted, std::nullopt};
  if (plain != wanted)
    w.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, plain, engine, wanted));
  return w;
}

// nChw16c with exactly 16 channels, or nChw8c with 8, is nhwc byte for byte (one block, no
// padding): the primitive then reads or writes the caller's buffer itself.
bool same_bytes(const memory::desc& nhwc, const memory::desc& wanted) {
  const memory::dims dims = nhwc.dims();
  const auto blocked = [&](memory::format_tag tag) {
    return wanted == memory::desc(dims, nhwc.data_type(), tag);
  };
  return nhwc == wanted || (dims[1] == 16 && blocked(memory::format_tag::nChw16c)) ||
         (dims[1] == 8 && blocked(memory::format_tag::nChw8c));
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

// For a blocked-direct or Winograd key: the entry that says "not here" (the op then runs direct)
// when oneDNN cannot create the primitive or offers only a reference kernel. Direct keys keep
// their old behaviour (creation errors are reported; the bf16 route's reference-kernel check is
// the op's).
template <class Entry>
Entry unusable(std::string why) {
  Entry e;
  e.usable = false;
  e.implementation = std::move(why);
  return e;
}

std::string geometry_text(const sdk::Conv2dGeometry& g) {
  return "N=" + std::to_string(g.batch) + " C=" + std::to_string(g.in_channels) +
         " HxW=" + extent_text(g.height, g.width) + " O=" + std::to_string(g.out_channels) +
         " kernel " + extent_text(g.kernel_h, g.kernel_w) + " stride " +
         extent_text(g.stride_h, g.stride_w) + " pad " + extent_text(g.pad_h, g.pad_w) +
         (g.groups > 1 ? " groups " + std::to_string(g.groups) : "");
}

// What a cached primitive was made for, as PrimitiveCache::report() lists it.
std::string problem_text(std::string_view op, const sdk::Conv2dGeometry& g, memory::data_type dt,
                         memory::data_type out_dt, bool bias, ConvMethod method) {
  return std::string(op) + " " + geometry_text(g) + ", " + dnnl_type_text(dt) + " -> " +
         dnnl_type_text(out_dt) + (bias ? ", bias" : "") +
         (method == ConvMethod::winograd         ? ", winograd"
          : method == ConvMethod::direct_blocked ? ", blocked"
                                                 : "");
}

// oneDNN 2.6's 1x1 weight-gradient kernels (jit_1x1:avx2, jit_1x1:avx512_core) copy a strided
// input into a unit-stride buffer first, and that copy runs past the buffer when the input has
// fewer channels than the kernel's channel block (8 with AVX2, 16 with AVX-512): wrong weight
// gradients, a spinning thread team, or a corrupted heap (oneDNN issue 6035; probed on AVX2 with
// 4 input channels, README.md). Such a convolution takes oneDNN's next implementation.
bool overruns_its_workspace(const sdk::Conv2dGeometry& g, std::string_view implementation) {
  const bool strided_1x1 = g.kernel_h == 1 && g.kernel_w == 1 && (g.stride_h > 1 || g.stride_w > 1);
  return strided_1x1 && g.in_channels / g.groups < 16 && implementation.starts_with("jit_1x1");
}

[[noreturn]] void creation_failed(std::string_view op, const sdk::Conv2dGeometry& g,
                                  memory::data_type dt, const dnnl::error& e) {
  fail(op,
       std::string("oneDNN cannot create a ") + dnnl_type_text(dt) + " convolution for " +
           geometry_text(g) + ": " + e.what(),
       "report this geometry");
}

}  // namespace

dnnl::convolution_forward::primitive_desc forward_pd(const dnnl::engine& engine,
                                                     const sdk::Conv2dGeometry& g,
                                                     memory::data_type dt, memory::data_type dst_dt,
                                                     bool bias, ConvMethod method) {
  const ConvDims d = conv_dims(g);
  const dnnl::algorithm alg = algorithm_of(method);
  const memory::desc bias_md =
      bias ? memory::desc({g.out_channels}, memory::data_type::f32, memory::format_tag::a)
           : memory::desc();
  return {{dnnl::prop_kind::forward_training, alg, input_md(g, dt, method), any_weights_md(g, dt),
           bias_md, output_md(g, dst_dt, method), d.strides, d.dilates, d.pad_l, d.pad_r},
          engine};
}

ForwardEntry& forward_entry(PrimitiveCache& cache, std::string_view op,
                            const sdk::Conv2dGeometry& g, memory::data_type dt,
                            memory::data_type dst_dt, bool bias, ConvMethod method) {
  return cache.get<ForwardEntry>(
      key_of(kConvForward, g, dt, dst_dt, bias, method),
      [&] {
        try {
          const auto& engine = cache.engine();
          const auto pd = forward_pd(engine, g, dt, dst_dt, bias, method);
          ForwardEntry e;
          e.implementation = pd.impl_info_str();
          if (method != ConvMethod::direct && is_reference_kernel(e.implementation))
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
          if (method != ConvMethod::direct) return unusable<ForwardEntry>(err.what());
          creation_failed(op, g, dt, err);
        }
      },
      [&] { return problem_text("conv2d_forward", g, dt, dst_dt, bias, method); });
}

BackwardDataEntry& backward_data_entry(PrimitiveCache& cache, std::string_view op,
                                       const sdk::Conv2dGeometry& g, memory::data_type dt,
                                       memory::data_type diff_src_dt, ConvMethod method) {
  return cache.get<BackwardDataEntry>(
      key_of(kConvBackwardData, g, dt, diff_src_dt, false, method),
      [&] {
        try {
          const auto& engine = cache.engine();
          const auto hint = forward_pd(engine, g, dt, dt, false, method);
          const ConvDims d = conv_dims(g);
          const dnnl::convolution_backward_data::primitive_desc pd(
              {algorithm_of(method), input_md(g, diff_src_dt, method), any_weights_md(g, dt),
               output_md(g, dt, method), d.strides, d.dilates, d.pad_l, d.pad_r},
              engine, hint);
          BackwardDataEntry e;
          e.implementation = pd.impl_info_str();
          if (method != ConvMethod::direct && is_reference_kernel(e.implementation))
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
          if (method != ConvMethod::direct) return unusable<BackwardDataEntry>(err.what());
          creation_failed(op, g, dt, err);
        }
      },
      [&] { return problem_text("conv2d_backward_data", g, dt, diff_src_dt, false, method); });
}

BackwardWeightsEntry& backward_weights_entry(PrimitiveCache& cache, std::string_view op,
                                             const sdk::Conv2dGeometry& g, memory::data_type dt,
                                             bool bias, ConvMethod method) {
  return cache.get<BackwardWeightsEntry>(
      key_of(kConvBackwardWeights, g, dt, memory::data_type::f32, bias, method),
      [&] {
        try {
          const auto& engine = cache.engine();
          const auto hint = forward_pd(engine, g, dt, dt, bias, method);
          const ConvDims d = conv_dims(g);
          const memory::desc bias_md =
              bias ? memory::desc({g.out_channels}, memory::data_type::f32, memory::format_tag::a)
                   : memory::desc();
          // Named: oneDNN's implementation iterator keeps a pointer to it, which next_impl()
          // reads, so it must outlive the loop below.
          const dnnl::convolution_backward_weights::desc problem(
              algorithm_of(method), input_md(g, dt, method),
              any_weights_md(g, memory::data_type::f32), bias_md, output_md(g, dt, method),
              d.strides, d.dilates, d.pad_l, d.pad_r);
          dnnl::convolution_backward_weights::primitive_desc pd(problem, engine, hint);
          while (overruns_its_workspace(g, pd.impl_info_str()))
            if (!pd.next_impl())
              fail(op,
                   "oneDNN offers only " + std::string(pd.impl_info_str()) + " for " +
                       geometry_text(g) + ", which writes past its buffers there",
                   "give the convolution 16 or more input channels");
          BackwardWeightsEntry e;
          e.implementation = pd.impl_info_str();
          if (method != ConvMethod::direct && is_reference_kernel(e.implementation))
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
          if (method != ConvMethod::direct) return unusable<BackwardWeightsEntry>(err.what());
          creation_failed(op, g, dt, err);
        }
      },
      [&] {
        return problem_text("conv2d_backward_weights", g, dt, memory::data_type::f32, bias, method);
      });
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

}  // namespace mixtrain::backend_cpu
