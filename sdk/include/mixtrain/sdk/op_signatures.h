// The SDK's table of op signatures: which dtypes each facet op accepts at each tensor position.
// One table for every backend, so the rules are written once; a backend's supports() defaults to
// it and narrows it only where its device cannot run a listed combination (e.g. FP8 GEMMs on a
// GPU without FP8 Tensor Cores).
//
// Contract
// - A signature lists the tensor positions documented at each op (e.g. gemm {A, B, C}) with the
//   class of dtypes each accepts. signature_accepts(op, dtypes) is true when every given dtype is
//   in its position's class; fewer dtypes than positions asks about a prefix (true when those
//   match), more than positions is a question about another op (false).
// - `one_dtype` signatures also require every given dtype to be the same storage (fp32 and tf32
//   share fp32 storage, so they count as one).
// - The table describes what an op means, not how fast a backend runs it: whether a dtype runs
//   natively or emulated is BackendCapabilities' business.
// - Pure functions, no allocation, no exceptions; safe from any thread.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>

#include "mixtrain/sdk/dtype.h"

namespace mixtrain::sdk {

enum class DTypeClass : std::uint8_t {
  fp32,           // fp32 storage: fp32 or tf32
  storage_float,  // fp32, tf32, bf16, fp16
  gemm_operand,   // a storage float or fp8_e4m3 / fp8_e5m2 (scaled by the operand's scale_inv)
};
MIXTRAIN_SDK_API bool in_class(DTypeClass c, DType t) noexcept;

struct OpSignature {
  std::span<const DTypeClass> positions;
  bool one_dtype = false;
};

MIXTRAIN_SDK_API bool signature_accepts(const OpSignature& sig,
                                        std::span<const DType> dtypes) noexcept;

// Each facet header declares `OpSignature op_signature(<its Op> op) noexcept` next to its op enum.
template <class Op>
bool signature_accepts(Op op, std::span<const DType> dtypes) noexcept {
  return signature_accepts(op_signature(op), dtypes);
}

}  // namespace mixtrain::sdk
