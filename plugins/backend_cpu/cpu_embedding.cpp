// CpuBackend's EmbeddingFacet: row gather by id and its deterministic scatter-add.
//
// - gather: one table row per output row, parallel over output rows; a memcpy when table and
//   out store alike and nothing accumulates, else fp32 math and one RNE encode into out.
// - scatter_add: the rows of dy are bucketed by id with a counting sort (stable: each bucket
//   lists its rows in ascending order), then every (table row, block of columns) pair is one
//   work item that sums its bucket in that order in fp32. Each output element is owned by one
//   item and summed in one fixed order, so the bits are the same for any thread count and any
//   schedule; no atomics, no per-thread partial tables.
// - Every id is checked before anything is written.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_access.h"
#include "cpu_backend.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

// Columns per scatter-add work item: a hot id (a frequent token) still spreads over threads.
constexpr std::int64_t kColumnBlock = 256;

struct TableShape {
  std::int64_t vocab = 0, width = 0;
};

// table is a [V, C] matrix; returns {V, C}.
TableShape table_shape(std::string_view op, std::string_view name, const TensorView& table) {
  if (table.shape.rank != 2)
    fail(op, std::string(name) + " is " + describe(table) + " but must be [V, C]",
         "pass the embedding table as a 2-D [vocabulary, width] tensor");
  return {table.shape[0], table.shape[1]};
}

// ids is int32 [rows] (any shape) with every id in [0, vocab); returns rows.
std::int64_t checked_ids(std::string_view op, const TensorView& ids, std::int64_t vocab) {
  require_present(op, "ids", ids);
  if (ids.dtype != DType::int32)
    fail(op, "ids is " + describe(ids) + " but must be int32", "pass token ids as int32");
  const std::int64_t rows = ids.numel();
  const auto* id = ids.as<const std::int32_t>();
  for (std::int64_t r = 0; r < rows; ++r)
    if (id[r] < 0 || id[r] >= vocab)
      fail(op,
           "id " + std::to_string(id[r]) + " at row " + std::to_string(r) + " is outside [0, " +
               std::to_string(vocab) + ")",
           "the ids index the table's rows: check the data's token ids against the model's "
           "vocabulary size");
  return rows;
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

void CpuBackend::gather(TensorView ids, TensorView table, TensorView out, bool accumulate) {
  use_threads();
  constexpr std::string_view op = "gather";
  require_storage(op, "table", table);
  require_storage(op, "out", out);
  const auto [vocab, width] = table_shape(op, "table", table);
  const std::int64_t rows = checked_ids(op, ids, vocab);
  require_rows_of(op, "out", out, rows, width);
  if (overlaps(out, table) || overlaps(out, ids))
    fail(op, "out " + describe(out) + " overlaps the table or the ids", "give out its own buffer");
  const auto* id = ids.as<const std::int32_t>();
  const std::int64_t c = width;  // plain variable: clang 14 cannot capture bindings in OpenMP
#pragma omp parallel for schedule(static) if (parallel_worth(rows * c))
  for (std::int64_t r = 0; r < rows; ++r) {
    // out[r, :] (+)= table[id[r], :], both [C]
    const std::int64_t from = static_cast<std::int64_t>(id[r]) * c, to = r * c;
    if (!accumulate) {
      copy_elements(table, from, out, to, c);
      continue;
    }
    for (std::int64_t c0 = 0; c0 < c; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, c - c0);
      float t_buf[kChunk], o_buf[kChunk];
      const float* t = read_chunk(table, from + c0, len, t_buf);
      const float* o = read_chunk(out, to + c0, len, o_buf);
      float* w = write_target(out, to + c0, o_buf);  // o itself: element-wise in place
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) w[j] = o[j] + t[j];
      commit_chunk(out, to + c0, len, w);
    }
  }
}

void CpuBackend::scatter_add(TensorView ids, TensorView dy, TensorView dtable, float beta) {
  use_threads();
  constexpr std::string_view op = "scatter_add";
  require_storage(op, "dy", dy);
  require_fp32(op, "dtable", dtable);
  if (beta != 0.0f && beta != 1.0f)
    fail(op, "beta = " + std::to_string(beta) + " is neither 0 nor 1",
         "pass 0 to overwrite the table's gradient or 1 to add to it");
  const auto [vocab, width] = table_shape(op, "dtable", dtable);
  const std::int64_t rows = checked_ids(op, ids, vocab);
  require_rows_of(op, "dy", dy, rows, width);
  if (overlaps(dtable, dy) || overlaps(dtable, ids))
    fail(op, "dtable " + describe(dtable) + " overlaps dy or the ids",
         "give dtable its own buffer");
  const auto* id = ids.as<const std::int32_t>();
  const std::int64_t v_count = vocab, c = width;

  // Counting sort of the rows by id: rows of id v are order[start[v] .. start[v + 1]), ascending.
  std::vector<std::int64_t> start(static_cast<std::size_t>(v_count) + 1, 0);
  for (std::int64_t r = 0; r < rows; ++r) ++start[static_cast<std::size_t>(id[r]) + 1];
  std::vector<std::int32_t> hit;  // ids that occur, ascending
  for (std::int64_t v = 0; v < v_count; ++v) {
    if (start[static_cast<std::size_t>(v) + 1] > 0) hit.push_back(static_cast<std::int32_t>(v));
    start[static_cast<std::size_t>(v) + 1] += start[static_cast<std::size_t>(v)];
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(rows));
  {
    std::vector<std::int64_t> next(start.begin(), start.end() - 1);
    for (std::int64_t r = 0; r < rows; ++r)
      order[static_cast<std::size_t>(next[static_cast<std::size_t>(id[r])]++)] = r;
  }

  float* table = dtable.as<float>();
  const bool overwrite = beta == 0.0f;
  if (overwrite) {
    // Rows no id names become 0 (rows that are hit are overwritten below).
#pragma omp parallel for schedule(static) if (parallel_worth(v_count * c))
    for (std::int64_t v = 0; v < v_count; ++v)
      if (start[static_cast<std::size_t>(v) + 1] == start[static_cast<std::size_t>(v)])
        std::fill(table + v * c, table + (v + 1) * c, 0.0f);
  }
  const std::int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
  const auto items = static_cast<std::int64_t>(hit.size()) * blocks;
  // Buckets differ in size (frequent tokens): items are handed out dynamically; which thread
  // runs an item does not change what it computes.
#pragma omp parallel for schedule(dynamic, 8) if (parallel_worth(rows * c))
  for (std::int64_t item = 0; item < items; ++item) {
    const std::int64_t v = hit[static_cast<std::size_t>(item / blocks)];
    const std::int64_t c0 = item % blocks * kColumnBlock;
    const std::int64_t len = std::min(kColumnBlock, c - c0);
    // acc is dtable[v, c0 : c0 + len]
    float acc[kColumnBlock];
    float* dst = table + v * c + c0;
    for (std::int64_t j = 0; j < len; ++j) acc[j] = overwrite ? 0.0f : dst[j];
    const std::int64_t end = start[static_cast<std::size_t>(v) + 1];
    for (std::int64_t at = start[static_cast<std::size_t>(v)]; at < end; ++at) {
      float buf[kColumnBlock];
      const float* g = read_chunk(dy, order[static_cast<std::size_t>(at)] * c + c0, len, buf);
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) acc[j] += g[j];
    }
    std::memcpy(dst, acc, static_cast<std::size_t>(len) * sizeof(float));
  }
}

}  // namespace mixtrain::backend_cpu
