// Checks of DeviceBackend arguments against the contract in device_backend.h, shared by every
// backend so that the same mistake gets the same message everywhere.
//
// Contract: every check throws sdk::BackendError whose message starts with "<backend>.<op>: "
// (e.g. "backend_cpu.gemm: ") and names the argument, its dtype and shape, with a hint. Checks
// are about shapes and presence; which dtypes an op supports stays each backend's own decision.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/export.h"

namespace mixtrain::sdk {

// "bf16 [512, 1024]"
MIXTRAIN_SDK_API std::string describe(const TensorView& v);

// tf32 views are fp32 storage: the same 4-byte elements, rounded by the op that reads them.
constexpr bool is_fp32_storage(DType t) {
  return t == DType::fp32 || t == DType::tf32;
}
// The storage floats every op takes: fp32 (or tf32), bf16, fp16. fp8 is not one of them (only
// gemm() and cast() take it).
constexpr bool is_storage_float(DType t) {
  return is_fp32_storage(t) || t == DType::bf16 || t == DType::fp16;
}

// Whether the bytes of two views intersect; a view without data overlaps nothing.
MIXTRAIN_SDK_API bool overlaps(const TensorView& a, const TensorView& b);

class MIXTRAIN_SDK_API BackendArgumentChecks {
 public:
  explicit BackendArgumentChecks(std::string backend) : backend_(std::move(backend)) {}

  [[noreturn]] void fail(std::string_view op, const std::string& what, std::string hint = {}) const;
  // Data present unless the tensor has no elements.
  void require_present(std::string_view op, std::string_view name, const TensorView& v) const;
  // fp32 (or tf32), bf16 or fp16 storage.
  void require_storage(std::string_view op, std::string_view name, const TensorView& v) const;
  void require_fp32(std::string_view op, std::string_view name, const TensorView& v) const;
  void require_numel(std::string_view op, std::string_view name, const TensorView& v,
                     std::int64_t numel) const;

  // The GEMM's m, n, k from op(A)[m,k]·op(B)[k,n], after checking A, B, C are present, the inner
  // dimensions agree, C is [m, n], a bias (when given) is fp32 [n], and a pre_activation (when
  // given) comes with an activation, is a storage float [m, n] and does not overlap C.
  struct GemmShape {
    std::int64_t m = 0, n = 0, k = 0;
  };
  GemmShape gemm_shape(const GemmArgs& args) const;
  // gemm_strided_batched's arguments: batch >= 0; batch 0 as gemm_shape() checks it; no bias,
  // activation or pre_activation; output batches that do not overlap (|stride_c| >= m*n when
  // batch > 1). Returns batch 0's shape.
  GemmShape gemm_batched_shape(const GemmBatchedArgs& args) const;

  // layernorm_forward's arguments: x, y storage of equal size; gamma, beta (optional) [n];
  // mean, rstd fp32 [rows]; n > 0. Returns {rows, n}.
  struct RowsCols {
    std::int64_t rows = 0, cols = 0;
  };
  RowsCols layernorm_forward_shape(const TensorView& x, const TensorView& gamma,
                                   const TensorView& beta, const TensorView& y,
                                   const TensorView& mean, const TensorView& rstd) const;

  // layernorm_backward's arguments: dy, x, dx storage of equal size; gamma (optional) [n]; mean,
  // rstd fp32 [rows]; dgamma, dbeta (optional) fp32 [n]. Returns {rows, n}.
  RowsCols layernorm_backward_shape(const TensorView& dy, const TensorView& x,
                                    const TensorView& gamma, const TensorView& mean,
                                    const TensorView& rstd, const TensorView& dx,
                                    const TensorView& dgamma, const TensorView& dbeta) const;

  // softmax_cross_entropy's arguments: logits storage [rows, classes] (both > 0), labels int32
  // [rows], loss fp32 [1], correct (optional) int32 [1], dlogits (optional) storage like logits.
  // Returns {rows, classes}.
  RowsCols softmax_cross_entropy_shape(const TensorView& logits, const TensorView& labels,
                                       const TensorView& loss, const TensorView& correct,
                                       const TensorView& dlogits) const;

  // bias_grad's arguments: dy storage [rows, n], dbias fp32 [n]. Returns {rows, n}.
  RowsCols bias_grad_shape(const TensorView& dy, const TensorView& dbias) const;

  // copy's arguments: both present, the same element count and dtype (fp32 and tf32 share
  // storage, so they may be copied into each other).
  void copy_args(const TensorView& dst, const TensorView& src) const;

  // cast's arguments: both present, each a storage float or fp8, the same element count; an amax
  // (when given) fp32 [1].
  void cast_args(const TensorView& src, const TensorView& dst, const CastArgs& args) const;

  // A foreach op's lists: each of `others` as long as `self`; every tensor fp32 and present; the
  // i-th tensors of all lists of equal numel.
  void foreach_lists(std::string_view op, std::span<const TensorView> self,
                     std::initializer_list<std::span<const TensorView>> others = {}) const;

  // One entry of a fused optimizer update: master and grad fp32 of equal size, working (optional)
  // in a storage dtype, and the fp32 state slots the optimizer needs.
  void optimizer_param(std::string_view op, std::size_t index, const ParamTensors& p,
                       bool needs_state1, bool needs_state2) const;

 private:
  std::string backend_;
};

}  // namespace mixtrain::sdk
