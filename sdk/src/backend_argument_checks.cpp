#include "mixtrain/sdk/backend_argument_checks.h"

#include "mixtrain/sdk/error.h"

namespace mixtrain::sdk {

std::string describe(const TensorView& v) {
  return std::string(dtype_name(v.dtype)) + " " + v.shape.to_string();
}

void BackendArgumentChecks::fail(std::string_view op, const std::string& what,
                                 std::string hint) const {
  throw BackendError(backend_ + "." + std::string(op) + ": " + what, std::move(hint));
}

void BackendArgumentChecks::require_present(std::string_view op, std::string_view name,
                                            const TensorView& v) const {
  if (v.empty() && v.numel() != 0)
    fail(op, std::string(name) + " is empty (null data) but has shape " + v.shape.to_string(),
         "pass a tensor allocated by this backend");
}

void BackendArgumentChecks::require_storage(std::string_view op, std::string_view name,
                                            const TensorView& v) const {
  require_present(op, name, v);
  const auto t = v.dtype;
  if (t != DType::fp32 && t != DType::tf32 && t != DType::bf16 && t != DType::fp16)
    fail(op, std::string(name) + " is " + describe(v) + "; this op takes fp32, bf16 or fp16 storage",
         "cast the tensor to fp32, bf16 or fp16 first");
}

void BackendArgumentChecks::require_fp32(std::string_view op, std::string_view name,
                                         const TensorView& v) const {
  require_present(op, name, v);
  if (v.dtype != DType::fp32 && v.dtype != DType::tf32)
    fail(op, std::string(name) + " is " + describe(v) + " but must be fp32",
         "keep this tensor in fp32 (statistics, gradients accumulators and optimizer state are "
         "fp32)");
}

void BackendArgumentChecks::require_numel(std::string_view op, std::string_view name,
                                          const TensorView& v, std::int64_t numel) const {
  if (v.numel() != numel)
    fail(op,
         std::string(name) + " is " + describe(v) + " (" + std::to_string(v.numel()) +
             " elements) but " + std::to_string(numel) + " are needed",
         "check the shapes passed to " + std::string(op));
}

BackendArgumentChecks::GemmShape BackendArgumentChecks::gemm_shape(const GemmArgs& args) const {
  const auto& av = args.a.view;
  const auto& bv = args.b.view;
  require_present("gemm", "A", av);
  require_present("gemm", "B", bv);
  require_present("gemm", "C", args.c);
  GemmShape s;
  s.m = args.a.transpose ? av.shape.cols() : av.shape.rows();
  s.k = args.a.transpose ? av.shape.rows() : av.shape.cols();
  const std::int64_t kb = args.b.transpose ? bv.shape.cols() : bv.shape.rows();
  s.n = args.b.transpose ? bv.shape.rows() : bv.shape.cols();
  if (s.k != kb)
    fail("gemm",
         "inner dimensions differ: op(A) is [" + std::to_string(s.m) + ", " + std::to_string(s.k) +
             "] (A " + describe(av) + (args.a.transpose ? ", transposed" : "") + ") but op(B) is [" +
             std::to_string(kb) + ", " + std::to_string(s.n) + "] (B " + describe(bv) +
             (args.b.transpose ? ", transposed" : "") + ")",
         "check the transpose flags and the operand order");
  if (args.c.shape.cols() != s.n || args.c.numel() != s.m * s.n)
    fail("gemm",
         "C is " + describe(args.c) + " but op(A)*op(B) is [" + std::to_string(s.m) + ", " +
             std::to_string(s.n) + "]",
         "allocate C with shape [m, n]");
  if (!args.bias.empty()) {
    require_fp32("gemm", "bias", args.bias);
    require_numel("gemm", "bias", args.bias, s.n);
  }
  return s;
}

}  // namespace mixtrain::sdk
