// CudaBackend's EmbeddingFacet: row gather by id and the deterministic scatter-add
// (cuda_embedding.cu), with the ids checked on the device and a bad one raised at the next
// synchronising call, as softmax_cross_entropy does with labels.
#include <atomic>
#include <cstring>

#include "cuda_access.h"
#include "cuda_backend.h"
#include "cuda_embedding.h"
#include "cuda_facet_checks.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

namespace {

// The id record's flag names the failing call: (sequence << 1 | op), op 0 gather, 1 scatter_add,
// never 0. The sequence tells two calls of the same op apart (check_ids' claim of the record).
int next_code(bool scatter) {
  static std::atomic<unsigned> sequence{0};
  const unsigned s = sequence.fetch_add(1, std::memory_order_relaxed) % (1u << 29) + 1;
  return static_cast<int>(s << 1 | (scatter ? 1u : 0u));
}

}  // namespace

kernels::ErrorRecord* CudaBackend::id_record(const char* op) {
  const bool fresh = id_check_.capacity() == 0;
  auto* rec = id_check_.as<kernels::ErrorRecord>(1, stream_, op);
  if (fresh) {
    // {first = ~0, flag = 0, classes = 0}, on the stream so the first check is ordered after it.
    check_cuda(cudaMemsetAsync(&rec->first, 0xFF, sizeof rec->first, stream_), op,
               "cudaMemsetAsync of the id check");
    check_cuda(cudaMemsetAsync(&rec->flag, 0, 2 * sizeof(int), stream_), op,
               "cudaMemsetAsync of the id check");
  }
  return rec;
}

void CudaBackend::check_id_errors() {
  if (!ids_pending_) return;
  ids_pending_ = false;
  auto* dev = static_cast<kernels::ErrorRecord*>(
      id_check_.get(sizeof(kernels::ErrorRecord), stream_, "synchronize"));
  kernels::ErrorRecord rec{};
  // The stream is idle (sync() waited for it), so a blocking read sees the kernels' writes.
  check_cuda(cudaMemcpy(&rec, dev, sizeof rec, cudaMemcpyDeviceToHost), "gather",
             "reading the id check");
  if (rec.flag == 0) return;
  const char* op = (rec.flag & 1) != 0 ? "scatter_add" : "gather";
  check_cuda(cudaMemsetAsync(&dev->first, 0xFF, sizeof dev->first, stream_), op,
             "cudaMemsetAsync of the id check");
  check_cuda(cudaMemsetAsync(&dev->flag, 0, 2 * sizeof(int), stream_), op,
             "cudaMemsetAsync of the id check");
  const auto row = static_cast<long long>(rec.first >> 32);
  const auto id = static_cast<std::int32_t>(static_cast<std::uint32_t>(rec.first & 0xFFFFFFFFu));
  fail(op,
       "id " + std::to_string(id) + " at row " + std::to_string(row) + " is outside [0, " +
           std::to_string(rec.classes) + ") (found on the device; " +
           ((rec.flag & 1) != 0 ? "dtable was" : "out was") +
           " left untouched, as was every embedding output until this call)",
       "the ids index the table's rows: check the data's token ids against the model's "
       "vocabulary size");
}

void CudaBackend::gather(TensorView ids, TensorView table, TensorView out, bool accumulate) {
  activate();
  constexpr const char* op = "gather";
  const EmbeddingShape s = check_gather(ids, table, out);
  if (s.rows == 0) return;
  kernels::ErrorRecord* rec = id_record(op);
  check_cuda(kernels::check_ids(ids.as<const std::int32_t>(), s.rows, s.vocab, next_code(false),
                                rec, stream_),
             op, "id check kernel launch");
  ids_pending_ = true;
  check_cuda(kernels::embedding_gather(ids.as<const std::int32_t>(), table.data,
                                       elem_of(table.dtype), out.data, elem_of(out.dtype), s.rows,
                                       s.vocab, s.width, accumulate, rec, stream_),
             op, "kernel launch");
}

void CudaBackend::scatter_add(TensorView ids, TensorView dy, TensorView dtable, float beta) {
  activate();
  constexpr const char* op = "scatter_add";
  const EmbeddingShape s = check_scatter_add(ids, dy, dtable, beta);
  kernels::ErrorRecord* rec = id_record(op);
  if (s.rows > 0) {
    check_cuda(kernels::check_ids(ids.as<const std::int32_t>(), s.rows, s.vocab, next_code(true),
                                  rec, stream_),
               op, "id check kernel launch");
    ids_pending_ = true;
  }
  std::size_t bytes = 0;
  void* scratch = nullptr;
  if (s.rows > 0 && s.width > 0) {
    bytes = kernels::scatter_add_scratch(s.rows, s.vocab);
    scratch = partial_.get(bytes, stream_, op);
    account_buffers();
  }
  check_cuda(kernels::embedding_scatter_add(ids.as<const std::int32_t>(), dy.data,
                                            elem_of(dy.dtype), dtable.as<float>(), s.rows, s.vocab,
                                            s.width, beta == 0.0f, scratch, bytes, rec, stream_),
             op, "kernel launch");
}

}  // namespace mixtrain::backend_cuda
