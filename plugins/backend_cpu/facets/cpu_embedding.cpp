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
#include "cpu_context.h"
#include "mixtrain/sdk/backend_embedding.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

// Columns per scatter-add work item: a hot id (a frequent token) still spreads over threads.
constexpr std::int64_t kColumnBlock = 256;

// Every id is in [0, vocab) (the shared checks took its dtype and count).
void check_id_values(std::string_view op, const TensorView& ids, std::int64_t vocab) {
  const auto* id = ids.as<const std::int32_t>();
  for (std::int64_t r = 0; r < ids.numel(); ++r)
    if (id[r] < 0 || id[r] >= vocab)
      fail(op,
           "id " + std::to_string(id[r]) + " at row " + std::to_string(r) + " is outside [0, " +
               std::to_string(vocab) + ")",
           "the ids index the table's rows: check the data's token ids against the model's "
           "vocabulary size");
}

}  // namespace

namespace {

class CpuEmbedding final : public sdk::EmbeddingFacet {
 public:
  explicit CpuEmbedding(CpuContext& context) : context_(context) {}

  void gather(sdk::TensorView ids, sdk::TensorView table, sdk::TensorView out,
              bool accumulate) override;
  void scatter_add(sdk::TensorView ids, sdk::TensorView dy, sdk::TensorView dtable,
                   float beta) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::EmbeddingFacet, CpuEmbedding> kRegistration;

}  // namespace

void CpuEmbedding::gather(TensorView ids, TensorView table, TensorView out, bool accumulate) {
  context_.use_threads();
  const auto shape = checks().embedding_gather(ids, table, out);
  check_id_values("gather", ids, shape.vocab);
  const std::int64_t rows = shape.rows;
  const auto* id = ids.as<const std::int32_t>();
  const std::int64_t c = shape.width;
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

void CpuEmbedding::scatter_add(TensorView ids, TensorView dy, TensorView dtable, float beta) {
  context_.use_threads();
  const auto shape = checks().embedding_scatter_add(ids, dy, dtable, beta);
  check_id_values("scatter_add", ids, shape.vocab);
  const std::int64_t rows = shape.rows;
  const auto* id = ids.as<const std::int32_t>();
  const std::int64_t v_count = shape.vocab, c = shape.width;

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
