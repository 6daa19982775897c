// A tensor's fp32 or bf16 storage as a typed pointer, for kernels whose loops are written once
// for both storages through cpu_bf16_bits.h's load_as_float / store_rounded (layer norm's rows,
// the residual join's backward).
//
// Contract
// - typed_storage(v): whether v's storage is one those kernels read and write in place: fp32
//   (tf32 views are fp32 storage) or bf16.
// - with_typed(v, f): calls f(p) with v's data as float* (fp32 storage) or Bf16Bits*; v passes
//   typed_storage(). A kernel that only reads converts p to a pointer to const itself.
#pragma once

#include "cpu_bf16_bits.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

inline bool typed_storage(const sdk::TensorView& v) {
  return sdk::is_fp32_storage(v.dtype) || v.dtype == sdk::DType::bf16;
}

template <class F>
void with_typed(const sdk::TensorView& v, F&& f) {
  if (sdk::is_fp32_storage(v.dtype))
    f(static_cast<float*>(v.data));
  else
    f(static_cast<Bf16Bits*>(v.data));
}

}  // namespace mixtrain::backend_cpu
