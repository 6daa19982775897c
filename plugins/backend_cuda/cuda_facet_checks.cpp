#include "cuda_facet_checks.h"

#include <climits>
#include <string>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

namespace {

// One warp per row: the grid has (batch * rows) / 8 blocks in its x dimension.
void softmax_launch(std::string_view op, const sdk::SoftmaxShape& s) {
  if (s.batch * s.rows / 8 >= INT_MAX)
    fail(op,
         "batch * rows = " + std::to_string(s.batch * s.rows) + " rows are too many for one launch",
         "split the batch");
}

// The kernels index ids and table rows with int32.
void embedding_launch(std::string_view op, std::string_view table_name, const TensorView& table,
                      const TensorView& ids, const EmbeddingShape& s) {
  if (s.rows >= INT_MAX)
    fail(op, "ids " + describe(ids) + " has more rows than one call takes (2^31 - 1)",
         "split the batch");
  if (s.vocab > INT_MAX)
    fail(op,
         std::string(table_name) + " " + describe(table) + " has more rows than int32 ids can name",
         "split the table");
}

}  // namespace

std::int64_t check_softmax_forward(const TensorView& scores, const sdk::SoftmaxShape& shape,
                                   const TensorView& probs) {
  const std::int64_t total = checks().softmax_forward(scores, shape, probs);
  softmax_launch("softmax_forward", shape);
  return total;
}

std::int64_t check_softmax_backward(const TensorView& probs, const TensorView& dprobs,
                                    const sdk::SoftmaxShape& shape, const TensorView& dscores) {
  const std::int64_t total = checks().softmax_backward(probs, dprobs, shape, dscores);
  softmax_launch("softmax_backward", shape);
  return total;
}

EmbeddingShape check_gather(const TensorView& ids, const TensorView& table, const TensorView& out) {
  const EmbeddingShape s = checks().embedding_gather(ids, table, out);
  embedding_launch("gather", "table", table, ids, s);
  return s;
}

EmbeddingShape check_scatter_add(const TensorView& ids, const TensorView& dy,
                                 const TensorView& dtable, float beta) {
  constexpr std::string_view op = "scatter_add";
  const EmbeddingShape s = checks().embedding_scatter_add(ids, dy, dtable, beta);
  embedding_launch(op, "dtable", dtable, ids, s);
  // The sum's grid has one block per 256 columns in its y dimension (at most 65535).
  if (s.width > std::int64_t{65535} * 256)
    fail(op, "dtable " + describe(dtable) + " is wider than one launch covers (16776960 columns)",
         "split the table's columns");
  return s;
}

}  // namespace mixtrain::backend_cuda
