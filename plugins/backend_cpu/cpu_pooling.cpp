// The convolution facet's pooling ops (max and average, forward and backward) on oneDNN over
// channels-last [N, H, W, C] activations.
//
// - fp32 and bf16 run natively in oneDNN's pooling (bf16 results rounded by oneDNN, RNE; a bf16
//   key whose kernel is a reference kernel, and every bf16 key on a CPU without AVX-512, where
//   oneDNN 2.6 has no bf16 pooling, take the fp32 route instead); fp16 goes through fp32 scratch
//   (exact decode, one RNE encode of the result), max pooling in chunks of images (below).
// - Max pooling's forward in training (a workspace given) keeps oneDNN's argmax indices in the
//   caller's workspace (pool2d_workspace_bytes: oneDNN's workspace_desc, u8 indices for windows of
//   fewer than 256 elements); its backward routes dy through them. Without a workspace the
//   backward recomputes them from x with a forward pass into scratch.
// - Ties: oneDNN's max pooling replaces the running maximum only when a later element is strictly
//   greater, visiting the window row by row (kh outer, kw inner), so the first maximum in row-major
//   window order wins, as in PyTorch; padding is never chosen.
// - NaN and -inf: oneDNN drops NaNs and clamps an all -inf window to the lowest finite float;
//   the forward then restores PyTorch's rule (cpu_max_pool_specials.h) when x holds either. The
//   backward of a window holding a NaN routes dy by oneDNN's choice (the loss is NaN then, and
//   the step skipped, so no update depends on it).
// - Average pooling: pooling_avg_include_padding divides by KH·KW (PyTorch's count_include_pad),
//   pooling_avg_exclude_padding by the window's in-image elements.
// - PyTorch's floor arithmetic: the right padding equals the left and oneDNN floors the window
//   count the same way, so the windows a floor drops are never computed. As in PyTorch, the
//   padding may be at most half the kernel, so every window overlaps the image.
#include <algorithm>
#include <string>
#include <string_view>

#include "cpu_access.h"
#include "cpu_max_pool_specials.h"
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

dnnl::algorithm algorithm_of(const sdk::Pool2dGeometry& g) {
  if (g.kind == sdk::PoolKind::max) return dnnl::algorithm::pooling_max;
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
  memory::desc src_md, dst_md, ws_md;
  std::string implementation;
};

// What a cached primitive was made for, as PrimitiveCache::report() lists it.
std::string problem_text(std::string_view op, const sdk::Pool2dGeometry& g, memory::data_type dt) {
  return std::string(op) + (g.kind == sdk::PoolKind::max ? " max" : " average") +
         " N=" + std::to_string(g.batch) + " C=" + std::to_string(g.channels) +
         " HxW=" + extent_text(g.height, g.width) + " kernel " +
         extent_text(g.kernel_h, g.kernel_w) + " stride " + extent_text(g.stride_h, g.stride_w) +
         " pad " + extent_text(g.pad_h, g.pad_w) + ", " + dnnl_type_text(dt);
}

[[noreturn]] void creation_failed(std::string_view op, const dnnl::error& e) {
  fail(op, std::string("oneDNN cannot create this pooling: ") + e.what(), "report this geometry");
}

PoolEntry& forward_entry(PrimitiveCache& cache, std::string_view op, const sdk::Pool2dGeometry& g,
                         memory::data_type dt, bool training) {
  return cache.get<PoolEntry>(
      key_of(kPoolForward, g, dt, training),
      [&] {
        try {
          const auto pd = forward_pd(cache.engine(), g, dt, training);
          return PoolEntry{dnnl::pooling_forward(pd), pd.src_desc(), pd.dst_desc(),
                           pd.workspace_desc(), pd.impl_info_str()};
        } catch (const dnnl::error& err) {
          creation_failed(op, err);
        }
      },
      [&] {
        return problem_text(training ? "pool2d_forward" : "pool2d_forward (inference)", g, dt);
      });
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
                           pd.workspace_desc(), pd.impl_info_str()};
        } catch (const dnnl::error& err) {
          creation_failed(op, err);
        }
      },
      [&] { return problem_text("pool2d_backward", g, dt); });
}

// Whether oneDNN has bf16 pooling on this CPU at all. oneDNN 2.6 takes bf16 data only where the
// CPU has AVX-512 (avx512_core): on an AVX2-only CPU every bf16 pooling fails to create. Asked
// once per process, for a small max pooling.
bool onednn_has_bf16_pooling(const dnnl::engine& engine) {
  static const bool has = [&engine] {
    sdk::Pool2dGeometry g;
    g.kind = sdk::PoolKind::max;
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

// bf16 natively unless oneDNN has no bf16 pooling here or only a reference kernel for it; fp32
// storage natively; fp16 (and a bf16 fallback) through fp32 scratch.
memory::data_type pool_type(PrimitiveCache& cache, std::string_view op,
                            const sdk::Pool2dGeometry& g, DType dtype) {
  if (dtype != DType::bf16 || !onednn_has_bf16_pooling(cache.engine()))
    return memory::data_type::f32;
  const bool training = g.kind == sdk::PoolKind::max;
  const auto& e = forward_entry(cache, op, g, memory::data_type::bf16, training);
  return is_reference_kernel(e.implementation) ? memory::data_type::f32 : memory::data_type::bf16;
}

}  // namespace

std::size_t pooling_workspace_bytes(CpuContext& context, const sdk::Pool2dGeometry& geometry,
                                    DType x) {
  constexpr std::string_view op = "pool2d_workspace_bytes";
  if (!checks().pool2d_workspace_args(geometry, x)) return 0;
  context.use_threads();
  const auto dt = pool_type(context.prims(), op, geometry, x);
  return forward_entry(context.prims(), op, geometry, dt, true).ws_md.get_size();
}

namespace {

// fp16 max pooling (and bf16 where oneDNN has no bf16 pooling) decodes to fp32 scratch. Max
// pooling is per image: every window lies in one image, and the argmax workspace holds one index
// per output in the output's own dense nhwc layout, so a chunk of images' indices are a slice of
// the whole batch's. Those run a chunk of about kPoolChunkBytes of decoded source at a time
// (whole images, at least one): the scratch is a chunk's, not fp32 copies of whole tensors
// (ResNet-50 at batch 16 in fp16: the backend's scratch 157 -> 29 MiB). Average pooling runs whole:
// oneDNN's backward on a one-image chunk summed differently from the whole batch (bench/RESULTS.md,
// session 61).
constexpr std::int64_t kPoolChunkBytes = std::int64_t{1} << 20;

// Images per chunk for this call; the batch (one chunk) where nothing is decoded, for average
// pooling, or where oneDNN's workspace is not the output's dense nhwc layout.
std::int64_t images_per_chunk(const PoolEntry& e, const sdk::Pool2dGeometry& g, DType dtype,
                              memory::data_type dt) {
  if (g.kind != sdk::PoolKind::max || dt != memory::data_type::f32 || is_fp32_storage(dtype))
    return g.batch;
  if (!e.ws_md.is_zero() &&
      e.ws_md != memory::desc({g.batch, g.channels, g.out_height(), g.out_width()},
                              e.ws_md.data_type(), memory::format_tag::nhwc))
    return g.batch;
  const std::int64_t image_bytes = g.height * g.width * g.channels * std::int64_t{4};
  return std::clamp<std::int64_t>(kPoolChunkBytes / std::max<std::int64_t>(image_bytes, 1), 1,
                                  g.batch);
}

// A call's batch as chunks of `per_chunk` images (the last may be smaller; one chunk when
// per_chunk is the batch): each chunk's geometry, and its images' slices of the call's checked
// tensors and workspace.
class ImageChunks {
 public:
  ImageChunks(const sdk::Pool2dGeometry& g, std::int64_t per_chunk, std::size_t workspace_bytes)
      : g_(g),
        per_chunk_(per_chunk),
        in_image_(g.height * g.width * g.channels),
        out_image_(g.out_height() * g.out_width() * g.channels),
        workspace_image_(workspace_bytes / static_cast<std::size_t>(g.batch)) {}

  // body(chunk geometry, first image) for each chunk in order.
  template <class Body>
  void for_each(Body&& body) const {
    for (std::int64_t n0 = 0; n0 < g_.batch; n0 += per_chunk_) {
      sdk::Pool2dGeometry c = g_;
      c.batch = std::min(per_chunk_, g_.batch - n0);
      body(c, n0);
    }
  }
  // Images [n0, n0 + count) of an input-sized (x, dx) or output-sized (y, dy) tensor; the
  // workspace from image n0 on (the chunk's primitive reads only its data). Empty stays empty.
  TensorView input(const TensorView& v, std::int64_t n0, std::int64_t count) const {
    return slice(v, in_image_, n0, count);
  }
  TensorView output(const TensorView& v, std::int64_t n0, std::int64_t count) const {
    return slice(v, out_image_, n0, count);
  }
  TensorView workspace(const TensorView& ws, std::int64_t n0) const {
    if (ws.empty()) return ws;
    TensorView out = ws;
    out.data = static_cast<char*>(ws.data) + static_cast<std::size_t>(n0) * workspace_image_;
    return out;
  }

 private:
  static TensorView slice(const TensorView& v, std::int64_t per_image, std::int64_t n0,
                          std::int64_t count) {
    return element_range(v, n0 * per_image, count * per_image);
  }

  sdk::Pool2dGeometry g_;
  std::int64_t per_chunk_, in_image_, out_image_;
  std::size_t workspace_image_;
};

// One forward over checked arguments (a chunk or the whole batch).
void run_forward(CpuContext& context, std::string_view op, const sdk::Pool2dGeometry& g,
                 memory::data_type dt, bool training, TensorView x, TensorView y,
                 TensorView workspace) {
  PoolEntry& e = forward_entry(context.prims(), op, g, dt, training);
  const void* src = as_input(context.prims(), x, dt, Slot::src);
  void* dst = as_output(context.prims(), y, dt, Slot::dst);
  std::unordered_map<int, memory> exec{{DNNL_ARG_SRC, context.prims().wrap(e.src_md, src)},
                                       {DNNL_ARG_DST, context.prims().wrap(e.dst_md, dst)}};
  if (training) exec.emplace(DNNL_ARG_WORKSPACE, context.prims().wrap(e.ws_md, workspace.data));
  context.prims().execute(e.primitive, exec);
  if (dst != y.data) encode_tensor(y, static_cast<const float*>(dst), y.numel());
}

// One backward over checked arguments (a chunk or the whole batch); an empty workspace of a max
// pooling recomputes the argmax indices from x (a training forward into scratch).
void run_backward(CpuContext& context, std::string_view op, const sdk::Pool2dGeometry& g,
                  memory::data_type dt, TensorView dy, TensorView x, TensorView workspace,
                  TensorView dx) {
  const bool max = g.kind == sdk::PoolKind::max;
  PoolEntry& e = backward_entry(context.prims(), op, g, dt);
  const void* ws = workspace.data;
  if (max && workspace.empty()) {
    PoolEntry& f = forward_entry(context.prims(), op, g, dt, true);
    const void* src = as_input(context.prims(), x, dt, Slot::extra_a);
    void* y_tmp = context.prims().scratch<char>(Slot::weights, f.dst_md.get_size());
    void* ws_tmp = context.prims().scratch<char>(Slot::extra_b, f.ws_md.get_size());
    context.prims().execute(f.primitive,
                            {{DNNL_ARG_SRC, context.prims().wrap(f.src_md, src)},
                             {DNNL_ARG_DST, context.prims().wrap(f.dst_md, y_tmp)},
                             {DNNL_ARG_WORKSPACE, context.prims().wrap(f.ws_md, ws_tmp)}});
    ws = ws_tmp;
  }
  const void* diff_dst = as_input(context.prims(), dy, dt, Slot::src);
  void* diff_src = as_output(context.prims(), dx, dt, Slot::dst);
  std::unordered_map<int, memory> exec{
      {DNNL_ARG_DIFF_DST, context.prims().wrap(e.dst_md, diff_dst)},
      {DNNL_ARG_DIFF_SRC, context.prims().wrap(e.src_md, diff_src)}};
  if (max) exec.emplace(DNNL_ARG_WORKSPACE, context.prims().wrap(e.ws_md, ws));
  context.prims().execute(e.primitive, exec);
  if (diff_src != dx.data) encode_tensor(dx, static_cast<const float*>(diff_src), dx.numel());
}

}  // namespace

void pooling_forward(CpuContext& context, const sdk::Pool2dGeometry& g, TensorView x, TensorView y,
                     TensorView workspace) {
  constexpr std::string_view op = "pool2d_forward";
  context.use_threads();
  checks().pool2d_forward(g, x, y);
  const bool training = g.kind == sdk::PoolKind::max && !workspace.empty();
  const auto dt = pool_type(context.prims(), op, g, x.dtype);
  const PoolEntry& whole = forward_entry(context.prims(), op, g, dt, training);
  if (training) checks().pool2d_workspace(op, workspace, whole.ws_md.get_size());
  const ImageChunks chunks(g, images_per_chunk(whole, g, x.dtype, dt), whole.ws_md.get_size());
  chunks.for_each([&](const sdk::Pool2dGeometry& c, std::int64_t n0) {
    run_forward(context, op, c, dt, training, chunks.input(x, n0, c.batch),
                chunks.output(y, n0, c.batch), chunks.workspace(workspace, n0));
  });
  if (g.kind == sdk::PoolKind::max && holds_nan_or_negative_infinity(x))
    restore_max_pool_specials(g, x, y);
  context.account_scratch();
}

void pooling_backward(CpuContext& context, const sdk::Pool2dGeometry& g, TensorView dy,
                      TensorView x, TensorView y, TensorView workspace, TensorView dx) {
  constexpr std::string_view op = "pool2d_backward";
  (void)y;  // the indices come from the workspace or from x
  context.use_threads();
  checks().pool2d_backward(g, dy, x, workspace, dx);
  // oneDNN's pooling backward takes one dtype: the fp32-dy mix is not offered here (supports()).
  checks().require_same_storage(op, "dy", dy, "dx", dx, "pooling keeps one dtype");
  const bool max = g.kind == sdk::PoolKind::max;
  const auto dt = pool_type(context.prims(), op, g, dy.dtype);
  const PoolEntry& whole = backward_entry(context.prims(), op, g, dt);
  if (max && !workspace.empty()) checks().pool2d_workspace(op, workspace, whole.ws_md.get_size());
  const ImageChunks chunks(g, images_per_chunk(whole, g, dy.dtype, dt), whole.ws_md.get_size());
  chunks.for_each([&](const sdk::Pool2dGeometry& c, std::int64_t n0) {
    run_backward(context, op, c, dt, chunks.output(dy, n0, c.batch), chunks.input(x, n0, c.batch),
                 chunks.workspace(workspace, n0), chunks.input(dx, n0, c.batch));
  });
  context.account_scratch();
}

}  // namespace mixtrain::backend_cpu
