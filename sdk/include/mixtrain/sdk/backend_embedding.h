// EmbeddingFacet: table lookups by integer id (token and position embeddings) and the
// deterministic scatter-add of their backward.
//
// Contract
// - A backend offers it as find_facet("embedding") (nullptr: the backend has none).
// - supports(op, dtypes) answers without running anything. dtypes: gather {table, out};
//   scatter_add {dy} (dtable is fp32). Tables and outputs: fp32, bf16 or fp16; ids are int32.
//   Math in FP32, one rounding into the output's dtype.
// - An id outside [0, V) raises BackendError naming the id and its row (ids come from data the
//   host checked, so this is a guard, not a path).
// - scatter_add is deterministic: each table row sums its contributions in ascending row order,
//   so the result has the same bits for any thread count (no atomics).
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class EmbeddingOp { gather, scatter_add };
MIXTRAIN_SDK_API std::string_view op_name(EmbeddingOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(EmbeddingOp op) noexcept;

class MIXTRAIN_SDK_API EmbeddingFacet : public Facet {
 public:
  using Op = EmbeddingOp;
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "embedding";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(EmbeddingOp op, std::span<const DType> dtypes) const;

  // out[r, :] = (accumulate ? out[r, :] : 0) + table[ids[r], :]; ids int32 [rows], table [V, C],
  // out [rows, C].
  virtual void gather(TensorView ids, TensorView table, TensorView out, bool accumulate) = 0;
  // dtable[v, :] = beta · dtable[v, :] + Σ_{r : ids[r] = v} dy[r, :]; ids int32 [rows], dy [rows,
  // C], dtable fp32 [V, C]; beta is 0 (overwrite: rows no id names become 0) or 1 (add).
  virtual void scatter_add(TensorView ids, TensorView dy, TensorView dtable, float beta) = 0;

 protected:
  ~EmbeddingFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
