// BackendArgumentChecks of the residual, image input, attention, embedding, dropout and quantized
// weight facets (contract in backend_argument_checks.h).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/backend_image_input.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::sdk {

namespace {

// "{batch 2, tokens 5, parts 3, heads 4, head_dim 8, head_tokens 0, head_offset 0}"
std::string layout_text(const HeadLayout& l) {
  return "{batch " + std::to_string(l.batch) + ", tokens " + std::to_string(l.tokens) + ", parts " +
         std::to_string(l.parts) + ", heads " + std::to_string(l.heads) + ", head_dim " +
         std::to_string(l.head_dim) + ", head_tokens " + std::to_string(l.head_tokens) +
         ", head_offset " + std::to_string(l.head_offset) + "}";
}

}  // namespace

std::int64_t BackendArgumentChecks::residual_add(std::span<const TensorView> xs,
                                                 const TensorView& y) const {
  constexpr std::string_view op = "add";
  if (xs.size() < 2)
    fail(op, "got " + std::to_string(xs.size()) + " inputs", "add joins two or more tensors");
  require_storage(op, "y", y);
  const std::int64_t total = y.numel();
  for (std::size_t k = 0; k < xs.size(); ++k) {
    const std::string name = "x" + std::to_string(k + 1);
    require_storage(op, name, xs[k]);
    require_numel(op, name, xs[k], total);
    require_same_or_disjoint(op, name, xs[k], "y", y);
  }
  return total;
}

std::int64_t BackendArgumentChecks::residual_add_backward(const TensorView& dy, const TensorView& y,
                                                          bool relu,
                                                          std::span<const TensorView> dxs) const {
  constexpr std::string_view op = "add_backward";
  require_storage(op, "dy", dy);
  const std::int64_t total = dy.numel();
  if (relu) {
    require_storage(op, "y", y);
    require_numel(op, "y", y, total);
  }
  if (dxs.empty())
    fail(op, "got no gradients to write", "pass each input's gradient (empty: none)");
  for (std::size_t k = 0; k < dxs.size(); ++k) {
    const TensorView& dx = dxs[k];
    if (dx.empty()) continue;
    const std::string name = "dx" + std::to_string(k + 1);
    require_storage(op, name, dx);
    require_numel(op, name, dx, total);
    require_same_or_disjoint(op, name, dx, "dy", dy);
    if (relu) require_disjoint(op, name, dx, "y", y);
    for (std::size_t j = 0; j < k; ++j)
      if (!dxs[j].empty()) require_disjoint(op, name, dx, "dx" + std::to_string(j + 1), dxs[j]);
  }
  return total;
}

std::int64_t BackendArgumentChecks::decode_images(const ByteImages& images, const TensorView& table,
                                                  const TensorView& y) const {
  constexpr std::string_view op = "decode_images";
  for (const auto& [name, value] : {std::pair<const char*, std::int64_t>{"rows", images.rows},
                                    {"channels", images.channels},
                                    {"plane", images.plane}})
    if (value < 0)
      fail(op, std::string("images.") + name + " = " + std::to_string(value) + " is negative",
           "describe the batch as rows images of channels planes of plane pixels, each >= 0");
  const std::int64_t pixels = checked_product(op, "the batch (rows·channels·plane pixels)",
                                              {images.rows, images.channels, images.plane});
  if (!is_fp32_storage(table.dtype) || table.shape.rank != 2 || table.shape[0] != images.channels ||
      table.shape[1] != 256)
    fail(op,
         "table is " + describe(table) + " but must be fp32 [" + std::to_string(images.channels) +
             ", 256]: one row of 256 values per channel",
         "pass the decode table as fp32 [channels, 256] (entry [c, b] is what byte b of channel c "
         "stands for)");
  require_present(op, "table", table);
  require_storage(op, "y", y);
  if (y.numel() != pixels)
    fail(op,
         "y is " + describe(y) + " (" + std::to_string(y.numel()) +
             " elements) but the batch has rows·channels·plane = " + std::to_string(images.rows) +
             "·" + std::to_string(images.channels) + "·" + std::to_string(images.plane) + " = " +
             std::to_string(pixels) + " pixels",
         "allocate y as [rows, channels·plane], one element per pixel");
  require_disjoint(op, "y", y, "table", table);
  if (images.pixels == nullptr && images.rows > 0)
    fail(op, "images.pixels is null but images.rows = " + std::to_string(images.rows),
         "point pixels at the batch's rows·channels·plane bytes in host memory");
  return pixels;
}

void BackendArgumentChecks::head_permute(std::string_view op, const TensorView& x,
                                         const HeadLayout& l, const TensorView& y) const {
  require_storage(op, "x", x);
  require_storage(op, "y", y);
  if (l.batch < 0 || l.tokens < 0 || l.heads < 1 || l.head_dim < 1 || l.parts < 1 ||
      l.head_tokens < 0)
    fail(op, "layout " + layout_text(l) + " has a negative dimension or no heads, parts or width",
         "batch and tokens >= 0; heads, head_dim and parts >= 1; head_tokens 0 (= tokens) or more");
  const std::int64_t cap = l.capacity();
  if (cap < l.tokens)
    fail(op, "layout " + layout_text(l) + ": head_tokens is below tokens",
         "head_tokens is the head-major tensor's capacity: at least tokens (0 means tokens)");
  if (l.head_offset < 0 || l.head_offset > cap - l.tokens)
    fail(op,
         "layout " + layout_text(l) + ": head_offset is outside [0, " +
             std::to_string(cap - l.tokens) + "]",
         "the tokens written must fit in the capacity: head_offset + tokens <= head_tokens");
  require_numel(op, "x", x,
                checked_product(op, "x", {l.batch, l.tokens, l.parts, l.heads, l.head_dim}));
  require_numel(op, "y", y, checked_product(op, "y", {l.parts, l.batch, l.heads, cap, l.head_dim}));
  if (overlaps(x, y))
    fail(op, "x " + describe(x) + " and y " + describe(y) + " overlap",
         "a permute cannot run in place: give x and y separate buffers");
}

namespace {

// A flash op's layout is the fused QKV projection's output as it is; returns N·T·H·D.
std::int64_t flash_layout(const BackendArgumentChecks& c, std::string_view op,
                          const HeadLayout& l) {
  if (l.batch < 0 || l.tokens < 0 || l.heads < 1 || l.head_dim < 1)
    c.fail(op, "layout " + layout_text(l) + " has a negative dimension or no heads or width",
           "batch and tokens >= 0; heads and head_dim >= 1");
  if (l.parts != 3 || l.capacity() != l.tokens || l.head_offset != 0)
    c.fail(op,
           "layout " + layout_text(l) + " is not qkv token-major [N, T, 3, H, D] without a cache",
           "pass parts = 3, head_tokens = 0, head_offset = 0 (a KV cache decodes unfused)");
  return c.checked_product(op, "out", {l.batch, l.tokens, l.heads, l.head_dim});
}

// qkv [N, T, 3, H, D], out [N, T, H, D] of qkv's dtype, lse fp32 [N, H, T]; out and lse disjoint
// from each other and from qkv.
void flash_tensors(const BackendArgumentChecks& c, std::string_view op, const TensorView& qkv,
                   const HeadLayout& l, std::int64_t per_part, const TensorView& out,
                   const TensorView& lse) {
  c.require_storage(op, "qkv", qkv);
  c.require_numel(op, "qkv", qkv, c.checked_product(op, "qkv", {3, per_part}));
  c.require_storage(op, "out", out);
  c.require_same_storage(op, "out", out, "qkv", qkv, "out is in qkv's dtype");
  c.require_numel(op, "out", out, per_part);
  c.require_fp32(op, "lse", lse);
  c.require_numel(op, "lse", lse, c.checked_product(op, "lse", {l.batch, l.heads, l.tokens}));
}

}  // namespace

std::int64_t BackendArgumentChecks::flash_forward(const TensorView& qkv, const HeadLayout& layout,
                                                  const TensorView& out,
                                                  const TensorView& lse) const {
  constexpr std::string_view op = "flash_forward";
  const std::int64_t per_part = flash_layout(*this, op, layout);
  flash_tensors(*this, op, qkv, layout, per_part, out, lse);
  require_disjoint(op, "out", out, "qkv", qkv);
  require_disjoint(op, "lse", lse, "qkv", qkv);
  require_disjoint(op, "lse", lse, "out", out);
  return per_part;
}

std::int64_t BackendArgumentChecks::flash_backward(const TensorView& qkv, const TensorView& out,
                                                   const TensorView& dout, const TensorView& lse,
                                                   const HeadLayout& layout,
                                                   const TensorView& dqkv) const {
  constexpr std::string_view op = "flash_backward";
  const std::int64_t per_part = flash_layout(*this, op, layout);
  flash_tensors(*this, op, qkv, layout, per_part, out, lse);
  require_storage(op, "dout", dout);
  require_numel(op, "dout", dout, per_part);
  require_storage(op, "dqkv", dqkv);
  require_same_storage(op, "dqkv", dqkv, "dout", dout, "dqkv is in dout's dtype");
  require_numel(op, "dqkv", dqkv, 3 * per_part);
  require_disjoint(op, "dqkv", dqkv, "qkv", qkv);
  require_disjoint(op, "dqkv", dqkv, "out", out);
  require_disjoint(op, "dqkv", dqkv, "dout", dout);
  require_disjoint(op, "dqkv", dqkv, "lse", lse);
  return per_part;
}

std::int64_t BackendArgumentChecks::flash_decode(const TensorView& cache, const HeadLayout& l,
                                                 const TensorView& out) const {
  constexpr std::string_view op = "flash_decode";
  if (l.batch != 1 || l.parts != 3 || l.tokens < 0 || l.heads < 1 || l.head_dim < 1)
    fail(op, "layout " + layout_text(l) + " is not one sequence's KV cache [3, 1, H, T', D]",
         "pass batch = 1, parts = 3, tokens = the new queries, heads and head_dim >= 1");
  const std::int64_t cap = l.capacity();
  if (l.head_offset < 0 || l.tokens > cap || l.head_offset > cap - l.tokens)
    fail(op,
         "layout " + layout_text(l) +
             ": the queries [head_offset, head_offset + tokens) do not "
             "fit the cache's " +
             std::to_string(cap) + " positions",
         "head_offset is the first new position; head_offset + tokens <= head_tokens");
  require_storage(op, "cache", cache);
  require_numel(op, "cache", cache, checked_product(op, "cache", {3, l.heads, cap, l.head_dim}));
  require_storage(op, "out", out);
  const std::int64_t n = checked_product(op, "out", {l.tokens, l.heads, l.head_dim});
  require_numel(op, "out", out, n);
  require_disjoint(op, "out", out, "cache", cache);
  return n;
}

namespace {

// The softmax's shape is sane and its causal mask leaves every row a key.
void softmax_shape(const BackendArgumentChecks& c, std::string_view op, const SoftmaxShape& s) {
  if (s.batch < 0 || s.rows < 0 || s.cols < 0)
    c.fail(op,
           "shape {batch " + std::to_string(s.batch) + ", rows " + std::to_string(s.rows) +
               ", cols " + std::to_string(s.cols) + "} has a negative dimension",
           "pass batch = N*H, rows = queries, cols = keys");
  if (s.rows > 0 && s.cols == 0)
    c.fail(op, "rows = " + std::to_string(s.rows) + " with cols = 0: a softmax over no keys",
           "pass at least one key column");
  if (s.causal && s.rows > s.cols)
    c.fail(op,
           "causal softmax with rows = " + std::to_string(s.rows) +
               " > cols = " + std::to_string(s.cols) + ": the first queries would see no key",
           "the bottom-right aligned mask needs rows <= cols (queries never outnumber keys)");
}

}  // namespace

std::int64_t BackendArgumentChecks::softmax_forward(const TensorView& scores,
                                                    const SoftmaxShape& shape,
                                                    const TensorView& probs) const {
  constexpr std::string_view op = "softmax_forward";
  softmax_shape(*this, op, shape);
  const std::int64_t total = checked_product(op, "scores", {shape.batch, shape.rows, shape.cols});
  require_fp32(op, "scores", scores);
  require_fp32(op, "probs", probs);
  require_numel(op, "scores", scores, total);
  require_numel(op, "probs", probs, total);
  require_same_or_disjoint(op, "scores", scores, "probs", probs);
  return total;
}

std::int64_t BackendArgumentChecks::softmax_backward(const TensorView& probs,
                                                     const TensorView& dprobs,
                                                     const SoftmaxShape& shape,
                                                     const TensorView& dscores) const {
  constexpr std::string_view op = "softmax_backward";
  softmax_shape(*this, op, shape);
  const std::int64_t total = checked_product(op, "probs", {shape.batch, shape.rows, shape.cols});
  require_fp32(op, "probs", probs);
  require_fp32(op, "dprobs", dprobs);
  require_fp32(op, "dscores", dscores);
  require_numel(op, "probs", probs, total);
  require_numel(op, "dprobs", dprobs, total);
  require_numel(op, "dscores", dscores, total);
  require_same_or_disjoint(op, "dprobs", dprobs, "dscores", dscores);
  if (overlaps(probs, dscores))
    fail(op, "dscores overlaps probs", "dscores may alias dprobs only; give it its own buffer");
  return total;
}

namespace {

using EmbeddingShape = BackendArgumentChecks::EmbeddingShape;

// table is a [V, C] matrix and ids int32; returns {ids' numel, V, C}.
EmbeddingShape embedding_shape(const BackendArgumentChecks& c, std::string_view op,
                               const TensorView& ids, std::string_view table_name,
                               const TensorView& table) {
  if (table.shape.rank != 2)
    c.fail(op, std::string(table_name) + " is " + describe(table) + " but must be [V, C]",
           "pass the embedding table as a 2-D [vocabulary, width] tensor");
  c.require_present(op, "ids", ids);
  if (ids.dtype != DType::int32)
    c.fail(op, "ids is " + describe(ids) + " but must be int32", "pass token ids as int32");
  return {ids.numel(), table.shape[0], table.shape[1]};
}

// x holds [rows, width] (leading dimensions folded).
void require_rows_of(const BackendArgumentChecks& c, std::string_view op, std::string_view name,
                     const TensorView& x, const EmbeddingShape& s) {
  if (x.shape.cols() != s.width || x.numel() != s.rows * s.width)
    c.fail(op,
           std::string(name) + " is " + describe(x) + " but must be [" + std::to_string(s.rows) +
               ", " + std::to_string(s.width) + "] (one row of the table's width per id)",
           "allocate it with one row per id and the table's width");
}

}  // namespace

BackendArgumentChecks::EmbeddingShape BackendArgumentChecks::embedding_gather(
    const TensorView& ids, const TensorView& table, const TensorView& out) const {
  constexpr std::string_view op = "gather";
  require_storage(op, "table", table);
  require_storage(op, "out", out);
  const EmbeddingShape s = embedding_shape(*this, op, ids, "table", table);
  require_rows_of(*this, op, "out", out, s);
  if (overlaps(out, table) || overlaps(out, ids))
    fail(op, "out " + describe(out) + " overlaps the table or the ids", "give out its own buffer");
  return s;
}

BackendArgumentChecks::EmbeddingShape BackendArgumentChecks::embedding_scatter_add(
    const TensorView& ids, const TensorView& dy, const TensorView& dtable, float beta) const {
  constexpr std::string_view op = "scatter_add";
  require_storage(op, "dy", dy);
  require_fp32(op, "dtable", dtable);
  if (beta != 0.0f && beta != 1.0f)
    fail(op, "beta = " + std::to_string(beta) + " is neither 0 nor 1",
         "pass 0 to overwrite the table's gradient or 1 to add to it");
  const EmbeddingShape s = embedding_shape(*this, op, ids, "dtable", dtable);
  require_rows_of(*this, op, "dy", dy, s);
  if (overlaps(dtable, dy) || overlaps(dtable, ids))
    fail(op, "dtable " + describe(dtable) + " overlaps dy or the ids",
         "give dtable its own buffer");
  return s;
}

void BackendArgumentChecks::dropout(std::string_view op, std::string_view in_name,
                                    const TensorView& in, std::string_view out_name,
                                    const TensorView& out, float p) const {
  require_storage(op, in_name, in);
  require_storage(op, out_name, out);
  require_numel(op, out_name, out, in.numel());
  require_same_or_disjoint(op, in_name, in, out_name, out);
  if (!(p >= 0.0f && p < 1.0f))
    fail(op, "p = " + std::to_string(p) + " is outside [0, 1)",
         "pass the probability of dropping an element; p = 1 would drop everything");
}

std::int64_t BackendArgumentChecks::dequantize_nf4(const void* codes, const TensorView& absmax,
                                                   std::int64_t block,
                                                   const TensorView& out) const {
  constexpr std::string_view op = "dequantize_nf4";
  if (codes == nullptr) fail(op, "codes is a null pointer", "pass the packed NF4 codes");
  if (block < 1)
    fail(op, "block size " + std::to_string(block) + " < 1", "QLoRA's block size is 64");
  require_present(op, "out", out);
  require_storage(op, "out", out);
  require_present(op, "absmax", absmax);
  require_fp32(op, "absmax", absmax);
  const std::int64_t n = out.numel();
  require_numel(op, "absmax", absmax, nf4_block_count(n, block));
  return n;
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::dequantize_block_scaled(
    const BlockScaledWeight& w, const TensorView& out) const {
  constexpr std::string_view op = "dequantize_block_scaled";
  require_present(op, "out", out);
  require_storage(op, "out", out);
  if (out.shape.rank != 2)
    fail(op, "out is " + describe(out) + "; a block-scaled weight is [rows, cols]");
  const std::int64_t rows = out.shape[0], cols = out.shape[1];
  BlockExtent grid{};
  try {
    grid = block_grid(w.layout, rows, cols);
  } catch (const std::invalid_argument& e) {
    fail(op, e.what());
  }
  const auto byte_view = [](const TensorView& v, std::int64_t numel) {
    return v.data != nullptr && dtype_size(v.dtype) == 1 && v.numel() == numel;
  };
  const bool packed = w.layout.element == BlockElement::e2m1;
  const std::int64_t code_bytes = packed ? (rows * cols + 1) / 2 : rows * cols;
  if (!byte_view(w.codes, code_bytes))
    fail(op, "codes must be " + std::to_string(code_bytes) + " bytes (1-byte storage) for " +
                 describe(out) + " in " + describe(w.layout));
  const bool fp32_scales =
      w.layout.scale == BlockScale::fp32 || w.layout.scale == BlockScale::fp32_pow2;
  const std::int64_t blocks = grid.rows * grid.cols;
  if (fp32_scales ? (w.scales.data == nullptr || w.scales.dtype != DType::fp32 ||
                     w.scales.numel() != blocks)
                  : !byte_view(w.scales, blocks))
    fail(op, "scales must be " + std::to_string(blocks) +
                 (fp32_scales ? " fp32 values" : " 1-byte scale codes") + " for " + describe(out) +
                 " in " + describe(w.layout));
  if (w.layout.tensor_scale) {
    require_present(op, "tensor_scale", w.tensor_scale);
    require_fp32(op, "tensor_scale", w.tensor_scale);
    require_numel(op, "tensor_scale", w.tensor_scale, 1);
  }
  return {grid.rows, grid.cols};
}

}  // namespace mixtrain::sdk
