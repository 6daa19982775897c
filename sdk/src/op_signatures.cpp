// How a signature table row (op_signatures.h) accepts dtypes; each facet's rows are in
// sdk/src/facets/backend_<facet>.cpp.
#include "mixtrain/sdk/op_signatures.h"

namespace mixtrain::sdk {

namespace {

using C = DTypeClass;

bool fp32_storage(DType t) {
  return t == DType::fp32 || t == DType::tf32;
}

}  // namespace

bool in_class(DTypeClass c, DType t) noexcept {
  switch (c) {
    case C::fp32:
      return fp32_storage(t);
    case C::storage_float:
      return fp32_storage(t) || t == DType::bf16 || t == DType::fp16;
    case C::gemm_operand:
      return in_class(C::storage_float, t) || is_fp8(t);
  }
  return false;
}

bool signature_accepts(const OpSignature& sig, std::span<const DType> dtypes) noexcept {
  // No positions: the op is outside its enum, which no backend runs.
  if (sig.positions.empty() || dtypes.size() > sig.positions.size()) return false;
  for (std::size_t i = 0; i < dtypes.size(); ++i)
    if (!in_class(sig.positions[i], dtypes[i])) return false;
  if (sig.one_dtype)
    for (DType t : dtypes)
      if (t != dtypes[0] && !(fp32_storage(t) && fp32_storage(dtypes[0]))) return false;
  return true;
}

}  // namespace mixtrain::sdk
