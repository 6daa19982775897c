#include "cuda_facet_checks.h"

#include <climits>
#include <initializer_list>
#include <string>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

using sdk::DType;
using sdk::TensorView;

namespace {

// The product of `dims`, or a BackendError naming `what` when it does not fit in int64.
std::int64_t checked_product(std::string_view op, std::string_view what,
                             std::initializer_list<std::int64_t> dims) {
  std::int64_t n = 1;
  for (std::int64_t d : dims)
    if (__builtin_mul_overflow(n, d, &n))
      fail(op, std::string(what) + " has more elements than fit in 64 bits",
           "check the layout's dimensions");
  return n;
}

std::string layout_text(const sdk::HeadLayout& l) {
  return "{batch " + std::to_string(l.batch) + ", tokens " + std::to_string(l.tokens) + ", parts " +
         std::to_string(l.parts) + ", heads " + std::to_string(l.heads) + ", head_dim " +
         std::to_string(l.head_dim) + ", head_tokens " + std::to_string(l.head_tokens) +
         ", head_offset " + std::to_string(l.head_offset) + "}";
}

// The shape is sane and its causal mask leaves every row a key; returns batch*rows*cols.
std::int64_t check_softmax_shape(std::string_view op, std::string_view name,
                                 const sdk::SoftmaxShape& s) {
  if (s.batch < 0 || s.rows < 0 || s.cols < 0)
    fail(op,
         "shape {batch " + std::to_string(s.batch) + ", rows " + std::to_string(s.rows) +
             ", cols " + std::to_string(s.cols) + "} has a negative dimension",
         "pass batch = N*H, rows = queries, cols = keys");
  if (s.rows > 0 && s.cols == 0)
    fail(op, "rows = " + std::to_string(s.rows) + " with cols = 0: a softmax over no keys",
         "pass at least one key column");
  if (s.causal && s.rows > s.cols)
    fail(op,
         "causal softmax with rows = " + std::to_string(s.rows) +
             " > cols = " + std::to_string(s.cols) + ": the first queries would see no key",
         "the bottom-right aligned mask needs rows <= cols (queries never outnumber keys)");
  const std::int64_t total = checked_product(op, name, {s.batch, s.rows, s.cols});
  // One warp per row: the grid has (batch * rows) / 8 blocks in its x dimension.
  if (s.batch * s.rows / 8 >= INT_MAX)
    fail(op,
         "batch * rows = " + std::to_string(s.batch * s.rows) + " rows are too many for one launch",
         "split the batch");
  return total;
}

// table is a [V, C] matrix; returns {V, C}.
EmbeddingShape table_shape(std::string_view op, std::string_view name, const TensorView& table) {
  if (table.shape.rank != 2)
    fail(op, std::string(name) + " is " + describe(table) + " but must be [V, C]",
         "pass the embedding table as a 2-D [vocabulary, width] tensor");
  EmbeddingShape s;
  s.vocab = table.shape[0];
  s.width = table.shape[1];
  return s;
}

// ids is int32 (any shape); returns its count (the device checks the values).
std::int64_t id_rows(std::string_view op, const TensorView& ids) {
  require_present(op, "ids", ids);
  if (ids.dtype != DType::int32)
    fail(op, "ids is " + describe(ids) + " but must be int32", "pass token ids as int32");
  if (ids.numel() >= INT_MAX)
    fail(op, "ids " + describe(ids) + " has more rows than one call takes (2^31 - 1)",
         "split the batch");
  return ids.numel();
}

// x holds [rows, width] (leading dimensions folded).
void require_rows_of(std::string_view op, std::string_view name, const TensorView& x,
                     std::int64_t rows, std::int64_t width) {
  if (x.shape.cols() != width || x.numel() != rows * width)
    fail(op,
         std::string(name) + " is " + describe(x) + " but must be [" + std::to_string(rows) + ", " +
             std::to_string(width) + "] (one row of the table's width per id)",
         "allocate it with one row per id and the table's width");
}

}  // namespace

void require_same_or_disjoint(std::string_view op, std::string_view a_name, const TensorView& a,
                              std::string_view b_name, const TensorView& b) {
  if (a.data == b.data && a.dtype == b.dtype && a.numel() == b.numel()) return;
  if (sdk::overlaps(a, b))
    fail(op,
         std::string(a_name) + " " + describe(a) + " and " + std::string(b_name) + " " +
             describe(b) + " partly overlap",
         "pass the same tensor for both (in place) or separate buffers");
}

std::int64_t check_residual_add(std::span<const TensorView> xs, const TensorView& y) {
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

void check_head_permute(std::string_view op, const TensorView& x, const sdk::HeadLayout& l,
                        const TensorView& y) {
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
  if (sdk::overlaps(x, y))
    fail(op, "x " + describe(x) + " and y " + describe(y) + " overlap",
         "a permute cannot run in place: give x and y separate buffers");
}

std::int64_t check_softmax_forward(const TensorView& scores, const sdk::SoftmaxShape& shape,
                                   const TensorView& probs) {
  constexpr std::string_view op = "softmax_forward";
  const std::int64_t total = check_softmax_shape(op, "scores", shape);
  require_fp32(op, "scores", scores);
  require_fp32(op, "probs", probs);
  require_numel(op, "scores", scores, total);
  require_numel(op, "probs", probs, total);
  require_same_or_disjoint(op, "scores", scores, "probs", probs);
  return total;
}

std::int64_t check_softmax_backward(const TensorView& probs, const TensorView& dprobs,
                                    const sdk::SoftmaxShape& shape, const TensorView& dscores) {
  constexpr std::string_view op = "softmax_backward";
  const std::int64_t total = check_softmax_shape(op, "probs", shape);
  require_fp32(op, "probs", probs);
  require_fp32(op, "dprobs", dprobs);
  require_fp32(op, "dscores", dscores);
  require_numel(op, "probs", probs, total);
  require_numel(op, "dprobs", dprobs, total);
  require_numel(op, "dscores", dscores, total);
  require_same_or_disjoint(op, "dprobs", dprobs, "dscores", dscores);
  if (sdk::overlaps(probs, dscores))
    fail(op, "dscores overlaps probs", "dscores may alias dprobs only; give it its own buffer");
  return total;
}

EmbeddingShape check_gather(const TensorView& ids, const TensorView& table, const TensorView& out) {
  constexpr std::string_view op = "gather";
  require_storage(op, "table", table);
  require_storage(op, "out", out);
  EmbeddingShape s = table_shape(op, "table", table);
  s.rows = id_rows(op, ids);
  require_rows_of(op, "out", out, s.rows, s.width);
  if (sdk::overlaps(out, table) || sdk::overlaps(out, ids))
    fail(op, "out " + describe(out) + " overlaps the table or the ids", "give out its own buffer");
  if (s.vocab > INT_MAX)
    fail(op, "table " + describe(table) + " has more rows than int32 ids can name",
         "split the table");
  return s;
}

EmbeddingShape check_scatter_add(const TensorView& ids, const TensorView& dy,
                                 const TensorView& dtable, float beta) {
  constexpr std::string_view op = "scatter_add";
  require_storage(op, "dy", dy);
  require_fp32(op, "dtable", dtable);
  if (beta != 0.0f && beta != 1.0f)
    fail(op, "beta = " + std::to_string(beta) + " is neither 0 nor 1",
         "pass 0 to overwrite the table's gradient or 1 to add to it");
  EmbeddingShape s = table_shape(op, "dtable", dtable);
  s.rows = id_rows(op, ids);
  require_rows_of(op, "dy", dy, s.rows, s.width);
  if (sdk::overlaps(dtable, dy) || sdk::overlaps(dtable, ids))
    fail(op, "dtable " + describe(dtable) + " overlaps dy or the ids",
         "give dtable its own buffer");
  if (s.vocab > INT_MAX)
    fail(op, "dtable " + describe(dtable) + " has more rows than int32 ids can name",
         "split the table");
  // The sum's grid has one block per 256 columns in its y dimension (at most 65535).
  if (s.width > std::int64_t{65535} * 256)
    fail(op, "dtable " + describe(dtable) + " is wider than one launch covers (16776960 columns)",
         "split the table's columns");
  return s;
}

void check_dropout(std::string_view op, std::string_view in_name, const TensorView& in,
                   std::string_view out_name, const TensorView& out, float p) {
  require_storage(op, in_name, in);
  require_storage(op, out_name, out);
  require_numel(op, out_name, out, in.numel());
  require_same_or_disjoint(op, in_name, in, out_name, out);
  if (!(p >= 0.0f && p < 1.0f))
    fail(op, "p = " + std::to_string(p) + " is outside [0, 1)",
         "pass the probability of dropping an element; p = 1 would drop everything");
}

}  // namespace mixtrain::backend_cuda
