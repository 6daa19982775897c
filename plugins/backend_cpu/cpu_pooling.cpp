// The convolution facet's pooling ops over channels-last [N, H, W, C] activations: max pooling by
// cpu_max_pool.h's loops, average pooling on oneDNN.
//
// - Average pooling: fp32 and bf16 natively in oneDNN (bf16 results rounded by oneDNN, RNE; a
//   bf16 key whose kernel is a reference kernel, and every bf16 key on a CPU without AVX-512,
//   where oneDNN 2.6 has no bf16 pooling, take the fp32 route instead); fp16 through fp32 scratch
//   (exact decode, one RNE encode of the result), the batch whole.
//   pooling_avg_include_padding divides by KH·KW (PyTorch's count_include_pad),
//   pooling_avg_exclude_padding by the window's in-image elements. No workspace.
// - Max pooling: its window rule (PyTorch's: ties to the first maximum, NaN and -inf kept), its
//   index workspace and the backward from x alone are cpu_max_pool.h's.
// - PyTorch's floor arithmetic: the right padding equals the left and oneDNN floors the window
//   count the same way, so the windows a floor drops are never computed. As in PyTorch, the
//   padding may be at most half the kernel, so every window overlaps the image.
#include <algorithm>
#include <string>
#include <string_view>

#include "cpu_access.h"
#include "cpu_max_pool.h"
#include "cpu_pooling.h"
#include "cpu_primitive_cache.h"
#include "cpu_problem_text.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;
using sdk::DType;
using sdk::Shape;
using sdk::TensorView;
using Slot = PrimitiveCache::Slot;

namespace {

enum Tag : std::int64_t { kPoolForward = 10, kPoolBackward = 11 };

// oneDNN runs average pooling only (max pooling is cpu_max_pool.h's).
dnnl::algorithm algorithm_of(const sdk::Pool2dGeometry& g) {
  return g.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                             : dnnl::algorithm::pooling_avg_exclude_padding;
}

memory::desc image_md(const sdk::Pool2dGeometry& g, bool out, memory::data_type dt) {
  return memory::desc(
      {g.batch, g.channels, out ? g.out_height() : g.height, out ? g.out_width() : g.width}, dt,
      memory::format_tag::nhwc);
}

PrimitiveCache::Key key_of(Tag tag, const sdk::Pool2dGeometry& g, memory::data_type dt,
                           bool training) {
  return {tag,        static_cast<std::int64_t>(dt),
          training,   static_cast<std::int64_t>(algorithm_of(g)),
          g.batch,    g.channels,
          g.height,   g.width,
          g.kernel_h, g.kernel_w,
          g.stride_h, g.stride_w,
          g.pad_h,    g.pad_w};
}

dnnl::pooling_forward::primitive_desc forward_pd(const dnnl::engine& engine,
                                                 const sdk::Pool2dGeometry& g, memory::data_type dt,
                                                 bool training) {
  return {{training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
           algorithm_of(g),
           image_md(g, false, dt),
           image_md(g, true, dt),
           {g.stride_h, g.stride_w},
           {g.kernel_h, g.kernel_w},
           {g.pad_h, g.pad_w},
           {g.pad_h, g.pad_w}},
          engine};
}

struct PoolEntry {
  dnnl::primitive primitive;
  memory::desc src_md, dst_md;
  std::string implementation;
};

// What a cached primitive was made for, as PrimitiveCache::report() lists it.
std::string problem_text(std::string_view op, const sdk::Pool2dGeometry& g, memory::data_type dt) {
  return std::string(op) + " average" + " N=" + std::to_string(g.batch) +
         " C=" + std::to_string(g.channels) + " HxW=" + extent_text(g.height, g.width) +
         " kernel " + extent_text(g.kernel_h, g.kernel_w) + " stride " +
         extent_text(g.stride_h, g.stride_w) + " pad " + extent_text(g.pad_h, g.pad_w) + ", " +
         dnnl_type_text(dt);
}

[[noreturn]] void creation_failed(std::string_view op, const dnnl::error& e) {
  fail(op, std::string("oneDNN cannot create this pooling: ") + e.what(), "report this geometry");
}

// The forward for inference: average pooling keeps no workspace, in training or not.
PoolEntry& forward_entry(PrimitiveCache& cache, std::string_view op, const sdk::Pool2dGeometry& g,
                         memory::data_type dt) {
  return cache.get<PoolEntry>(
      key_of(kPoolForward, g, dt, false),
      [&] {
        try {
          const auto pd = forward_pd(cache.engine(), g, dt, false);
          return PoolEntry{dnnl::pooling_forward(pd), pd.src_desc(), pd.dst_desc(),
                           pd.impl_info_str()};
        } catch (const dnnl::error& err) {
          creation_failed(op, err);
        }
      },
      [&] { return problem_text("pool2d_forward (inference)", g, dt); });
}

// src_md / dst_md hold diff_src / diff_dst.
PoolEntry& backward_entry(PrimitiveCache& cache, std::string_view op, const sdk::Pool2dGeometry& g,
                          memory::data_type dt) {
  return cache.get<PoolEntry>(
      key_of(kPoolBackward, g, dt, true),
      [&] {
        try {
          const auto hint = forward_pd(cache.engine(), g, dt, true);
          const dnnl::pooling_backward::primitive_desc pd({algorithm_of(g),
                                                           image_md(g, false, dt),
                                                           image_md(g, true, dt),
                                                           {g.stride_h, g.stride_w},
                                                           {g.kernel_h, g.kernel_w},
                                                           {g.pad_h, g.pad_w},
                                                           {g.pad_h, g.pad_w}},
                                                          cache.engine(), hint);
          return PoolEntry{dnnl::pooling_backward(pd), pd.diff_src_desc(), pd.diff_dst_desc(),
                           pd.impl_info_str()};
        } catch (const dnnl::error& err) {
          creation_failed(op, err);
        }
      },
      [&] { return problem_text("pool2d_backward", g, dt); });
}

// Whether oneDNN has bf16 pooling on this CPU at all. oneDNN 2.6 takes bf16 data only where the
// CPU has AVX-512 (avx512_core): on an AVX2-only CPU every bf16 pooling fails to create. Asked
// once per process, for a small average pooling.
bool onednn_has_bf16_pooling(const dnnl::engine& engine) {
  static const bool has = [&engine] {
    sdk::Pool2dGeometry g;
    g.kind = sdk::PoolKind::average;
    g.batch = 1;
    g.channels = 16;
    g.height = g.width = 4;
    g.kernel_h = g.kernel_w = 2;
    g.stride_h = g.stride_w = 2;
    try {
      (void)forward_pd(engine, g, memory::data_type::bf16, true);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

// Average pooling's type: bf16 natively unless oneDNN has no bf16 pooling here or only a
// reference kernel for it; fp32 storage natively; fp16 (and a bf16 fallback) through fp32 scratch.
memory::data_type pool_type(PrimitiveCache& cache, std::string_view op,
                            const sdk::Pool2dGeometry& g, DType dtype) {
  if (dtype != DType::bf16 || !onednn_has_bf16_pooling(cache.engine()))
    return memory::data_type::f32;
  const auto& e = forward_entry(cache, op, g, memory::data_type::bf16);
  return is_reference_kernel(e.implementation) ? memory::data_type::f32 : memory::data_type::bf16;
}

}  // namespace

std::size_t pooling_workspace_bytes(const sdk::Pool2dGeometry& geometry, DType x) {
  if (!checks().pool2d_workspace_args(geometry, x)) return 0;
  return max_pool_workspace_bytes(geometry);
}

namespace {

// Average pooling's forward over checked arguments, the batch whole.
void run_forward(CpuContext& context, std::string_view op, const sdk::Pool2dGeometry& g,
                 memory::data_type dt, TensorView x, TensorView y) {
  PoolEntry& e = forward_entry(context.prims(), op, g, dt);
  const void* src = as_input(context.prims(), x, dt, Slot::src);
  void* dst = as_output(context.prims(), y, dt, Slot::dst);
  context.prims().execute(e.primitive, {{DNNL_ARG_SRC, context.prims().wrap(e.src_md, src)},
                                        {DNNL_ARG_DST, context.prims().wrap(e.dst_md, dst)}});
  if (dst != y.data) encode_tensor(y, static_cast<const float*>(dst), y.numel());
}

// Average pooling's backward over checked arguments, the batch whole.
void run_backward(CpuContext& context, std::string_view op, const sdk::Pool2dGeometry& g,
                  memory::data_type dt, TensorView dy, TensorView dx) {
  PoolEntry& e = backward_entry(context.prims(), op, g, dt);
  const void* diff_dst = as_input(context.prims(), dy, dt, Slot::src);
  void* diff_src = as_output(context.prims(), dx, dt, Slot::dst);
  context.prims().execute(e.primitive,
                          {{DNNL_ARG_DIFF_DST, context.prims().wrap(e.dst_md, diff_dst)},
                           {DNNL_ARG_DIFF_SRC, context.prims().wrap(e.src_md, diff_src)}});
  if (diff_src != dx.data) encode_tensor(dx, static_cast<const float*>(diff_src), dx.numel());
}

}  // namespace

void pooling_forward(CpuContext& context, const sdk::Pool2dGeometry& g, TensorView x, TensorView y,
                     TensorView workspace) {
  constexpr std::string_view op = "pool2d_forward";
  context.use_threads();
  checks().pool2d_forward(g, x, y);
  if (g.kind == sdk::PoolKind::max) {
    if (!workspace.empty()) checks().pool2d_workspace(op, workspace, max_pool_workspace_bytes(g));
    max_pool_forward(g, x, y, workspace.empty() ? nullptr : workspace.data);
    return;
  }
  run_forward(context, op, g, pool_type(context.prims(), op, g, x.dtype), x, y);
  context.account_scratch();
}

void pooling_backward(CpuContext& context, const sdk::Pool2dGeometry& g, TensorView dy,
                      TensorView x, TensorView y, TensorView workspace, TensorView dx) {
  constexpr std::string_view op = "pool2d_backward";
  (void)y;  // the indices come from the workspace or from x
  context.use_threads();
  checks().pool2d_backward(g, dy, x, workspace, dx);
  // One dtype: the fp32-dy mix is not offered here (supports()).
  checks().require_same_storage(op, "dy", dy, "dx", dx, "pooling keeps one dtype");
  if (g.kind == sdk::PoolKind::max) {
    const std::size_t bytes = max_pool_workspace_bytes(g);
    const void* indices = workspace.data;
    if (workspace.empty()) {
      // Without a workspace the indices are recomputed from x, into scratch.
      void* recomputed = context.prims().scratch<char>(Slot::extra_b, bytes);
      max_pool_forward(g, x, {}, recomputed);
      indices = recomputed;
    } else {
      checks().pool2d_workspace(op, workspace, bytes);
    }
    max_pool_backward(g, dy, indices, dx);
    context.account_scratch();
    return;
  }
  run_backward(context, op, g, pool_type(context.prims(), op, g, dy.dtype), dy, dx);
  context.account_scratch();
}

}  // namespace mixtrain::backend_cpu
