// CudaEmbedding: row gather by id and the deterministic scatter-add
// (cuda_embedding.cu), with the ids checked on the device and a bad one raised at the next
// synchronising call, as softmax_cross_entropy does with labels.
#include <cstring>

#include "cuda_access.h"
#include "cuda_embedding.h"
#include "cuda_embedding_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"
#include "cuda_facet_checks.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

namespace {

// The id record's flag names the failing call: (check code << 1 | op), op 0 gather, 1
// scatter_add, never 0 (CudaContext::next_check_code tells two calls of the same op apart).
int id_check_code(CudaContext& context, bool scatter) {
  return context.next_check_code() << 1 | (scatter ? 1 : 0);
}

}  // namespace

void CudaEmbedding::gather(TensorView ids, TensorView table, TensorView out, bool accumulate) {
  context_.activate();
  constexpr const char* op = "gather";
  const EmbeddingShape s = check_gather(ids, table, out);
  if (s.rows == 0) return;
  kernels::ErrorRecord* rec = context_.id_record(op);
  check_cuda(kernels::check_ids(ids.as<const std::int32_t>(), s.rows, s.vocab,
                                id_check_code(context_, false), rec, context_.stream),
             op, "id check kernel launch");
  context_.ids_pending = true;
  check_cuda(kernels::embedding_gather(ids.as<const std::int32_t>(), table.data,
                                       elem_of(table.dtype), out.data, elem_of(out.dtype), s.rows,
                                       s.vocab, s.width, accumulate, rec, context_.stream),
             op, "kernel launch");
}

void CudaEmbedding::scatter_add(TensorView ids, TensorView dy, TensorView dtable, float beta) {
  context_.activate();
  constexpr const char* op = "scatter_add";
  const EmbeddingShape s = check_scatter_add(ids, dy, dtable, beta);
  kernels::ErrorRecord* rec = context_.id_record(op);
  if (s.rows > 0) {
    check_cuda(kernels::check_ids(ids.as<const std::int32_t>(), s.rows, s.vocab,
                                  id_check_code(context_, true), rec, context_.stream),
               op, "id check kernel launch");
    context_.ids_pending = true;
  }
  std::size_t bytes = 0;
  void* scratch = nullptr;
  if (s.rows > 0 && s.width > 0) {
    bytes = kernels::scatter_add_scratch(s.rows, s.vocab);
    scratch = context_.partial.get(bytes, context_.stream, op);
    context_.account_buffers();
  }
  check_cuda(kernels::embedding_scatter_add(
                 ids.as<const std::int32_t>(), dy.data, elem_of(dy.dtype), dtable.as<float>(),
                 s.rows, s.vocab, s.width, beta == 0.0f, scratch, bytes, rec, context_.stream),
             op, "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::EmbeddingFacet, CudaEmbedding> kCudaEmbeddingRegistration;

}  // namespace mixtrain::backend_cuda
