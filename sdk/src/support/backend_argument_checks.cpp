#include "mixtrain/sdk/support/backend_argument_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::sdk {

std::string describe(const TensorView& v) {
  return std::string(dtype_name(v.dtype)) + " " + v.shape.to_string();
}

bool overlaps(const TensorView& a, const TensorView& b) {
  if (a.empty() || b.empty()) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
  const std::uintptr_t a_bytes = a.bytes(), b_bytes = b.bytes();
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
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
  if (!is_storage_float(v.dtype))
    fail(op,
         std::string(name) + " is " + describe(v) + "; this op takes fp32, bf16 or fp16 storage",
         "cast the tensor to fp32, bf16 or fp16 first");
}

void BackendArgumentChecks::require_fp32(std::string_view op, std::string_view name,
                                         const TensorView& v) const {
  require_present(op, name, v);
  if (!is_fp32_storage(v.dtype))
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

void BackendArgumentChecks::require_at_least(std::string_view op, std::string_view name,
                                             std::int64_t value, std::int64_t lo,
                                             const std::string& hint) const {
  if (value < lo)
    fail(op,
         std::string(name) + " = " + std::to_string(value) + " must be at least " +
             std::to_string(lo),
         hint);
}

void BackendArgumentChecks::require_bytes(std::string_view op, std::string_view name,
                                          const TensorView& v, std::size_t bytes,
                                          const std::string& hint) const {
  if (v.bytes() < bytes || (bytes > 0 && v.data == nullptr))
    fail(op,
         std::string(name) + " is " + describe(v) + " (" + std::to_string(v.bytes()) +
             " bytes) but " + std::to_string(bytes) + " bytes are needed",
         hint);
}

void BackendArgumentChecks::require_same_or_disjoint(std::string_view op, std::string_view a_name,
                                                     const TensorView& a, std::string_view b_name,
                                                     const TensorView& b) const {
  if (a.data == b.data && a.dtype == b.dtype && a.numel() == b.numel()) return;
  if (overlaps(a, b))
    fail(op,
         std::string(a_name) + " " + describe(a) + " and " + std::string(b_name) + " " +
             describe(b) + " partly overlap",
         "pass the same tensor for both (in place) or separate buffers");
}

void BackendArgumentChecks::require_disjoint(std::string_view op, std::string_view out_name,
                                             const TensorView& out, std::string_view in_name,
                                             const TensorView& in) const {
  if (overlaps(out, in))
    fail(op, std::string(out_name) + " overlaps " + std::string(in_name),
         "write the output into a separate buffer");
}

void BackendArgumentChecks::require_same_storage(std::string_view op, std::string_view a_name,
                                                 const TensorView& a, std::string_view b_name,
                                                 const TensorView& b, std::string_view rule) const {
  if (a.dtype == b.dtype || (is_fp32_storage(a.dtype) && is_fp32_storage(b.dtype))) return;
  fail(op,
       std::string(a_name) + " is " + describe(a) + " but " + std::string(b_name) + " is " +
           describe(b) + "; " + std::string(rule),
       "cast one of them so both are fp32, bf16 or fp16");
}

std::int64_t BackendArgumentChecks::checked_product(
    std::string_view op, std::string_view what, std::initializer_list<std::int64_t> dims) const {
  std::int64_t n = 1;
  for (std::int64_t d : dims)
    if (__builtin_mul_overflow(n, d, &n))
      fail(op, std::string(what) + " has more elements than fit in 64 bits",
           "check the layout's dimensions");
  return n;
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
             "] (A " + describe(av) + (args.a.transpose ? ", transposed" : "") +
             ") but op(B) is [" + std::to_string(kb) + ", " + std::to_string(s.n) + "] (B " +
             describe(bv) + (args.b.transpose ? ", transposed" : "") + ")",
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
  if (!args.pre_activation.empty()) {
    if (!args.has_activation)
      fail("gemm",
           "pre_activation " + describe(args.pre_activation) + " is given without an activation",
           "set has_activation and activation, or leave pre_activation empty");
    require_storage("gemm", "pre_activation", args.pre_activation);
    if (args.pre_activation.shape.cols() != s.n || args.pre_activation.numel() != s.m * s.n)
      fail("gemm",
           "pre_activation is " + describe(args.pre_activation) + " but C is [" +
               std::to_string(s.m) + ", " + std::to_string(s.n) + "]",
           "allocate pre_activation with C's shape");
    if (overlaps(args.c, args.pre_activation))
      fail("gemm", "pre_activation and C overlap",
           "give pre_activation its own buffer (it keeps z, C receives act(z))");
  }
  return s;
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::layernorm_forward_shape(
    const TensorView& x, const TensorView& gamma, const TensorView& beta, const TensorView& y,
    const TensorView& mean, const TensorView& rstd) const {
  constexpr const char* op = "layernorm_forward";
  require_storage(op, "x", x);
  require_storage(op, "y", y);
  const RowsCols s{x.shape.rows(), x.shape.cols()};
  require_numel(op, "y", y, x.numel());
  if (!gamma.empty()) {
    require_storage(op, "gamma", gamma);
    require_numel(op, "gamma", gamma, s.cols);
  }
  if (!beta.empty()) {
    require_storage(op, "beta", beta);
    require_numel(op, "beta", beta, s.cols);
  }
  require_fp32(op, "mean", mean);
  require_numel(op, "mean", mean, s.rows);
  require_fp32(op, "rstd", rstd);
  require_numel(op, "rstd", rstd, s.rows);
  if (s.cols == 0) fail(op, "x " + describe(x) + " has zero columns", "normalise a non-empty axis");
  // In place is fine (each row is read before it is written); a partial overlap races on a device.
  require_same_or_disjoint(op, "y", y, "x", x);
  return s;
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::layernorm_backward_shape(
    const TensorView& dy, const TensorView& x, const TensorView& gamma, const TensorView& mean,
    const TensorView& rstd, const TensorView& dx, const TensorView& dgamma,
    const TensorView& dbeta) const {
  constexpr const char* op = "layernorm_backward";
  require_storage(op, "dy", dy);
  require_storage(op, "x", x);
  require_storage(op, "dx", dx);
  const RowsCols s{x.shape.rows(), x.shape.cols()};
  require_numel(op, "dy", dy, x.numel());
  require_numel(op, "dx", dx, x.numel());
  if (!gamma.empty()) {
    require_storage(op, "gamma", gamma);
    require_numel(op, "gamma", gamma, s.cols);
  }
  require_fp32(op, "mean", mean);
  require_numel(op, "mean", mean, s.rows);
  require_fp32(op, "rstd", rstd);
  require_numel(op, "rstd", rstd, s.rows);
  for (auto [view, name] : {std::pair{&dgamma, "dgamma"}, std::pair{&dbeta, "dbeta"}}) {
    if (view->empty()) continue;
    require_fp32(op, name, *view);
    require_numel(op, name, *view, s.cols);
  }
  // dx may be dy or x itself (each row is read before it is written), never part of either.
  require_same_or_disjoint(op, "dx", dx, "dy", dy);
  require_same_or_disjoint(op, "dx", dx, "x", x);
  return s;
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::layernorm_backward_accumulate_shape(
    const TensorView& dy, const TensorView& x, const TensorView& gamma, const TensorView& mean,
    const TensorView& rstd, const TensorView& dx, const TensorView& dgamma,
    const TensorView& dbeta) const {
  constexpr const char* op = "layernorm_backward_accumulate";
  const RowsCols s = layernorm_backward_shape(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  require_fp32(op, "dx", dx);
  if (overlaps(dx, dy) || overlaps(dx, x))
    fail(op, "dx " + describe(dx) + " overlaps dy or x",
         "accumulate into a buffer of its own (dx is read and written while dy and x are read)");
  return s;
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::layernorm_add_forward_shape(
    const LayerNormAddArgs& args) const {
  constexpr const char* op = "layernorm_add_forward";
  require_storage(op, "sum", args.sum);
  const RowsCols s =
      layernorm_forward_shape(args.sum, args.gamma, args.beta, args.y, args.mean, args.rstd);
  for (const auto& [name, v] : {std::pair{"a", &args.a}, std::pair{"b", &args.b}}) {
    require_storage(op, name, *v);
    require_numel(op, name, *v, args.sum.numel());
    require_same_or_disjoint(op, name, *v, "sum", args.sum);
  }
  for (const auto& [name, v] :
       {std::pair{"a", &args.a}, std::pair{"b", &args.b}, std::pair{"sum", &args.sum}})
    require_disjoint(op, "y", args.y, name, *v);
  return s;
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::softmax_cross_entropy_shape(
    const TensorView& logits, const TensorView& labels, float label_smoothing,
    const TensorView& loss, const TensorView& correct, const TensorView& dlogits) const {
  constexpr const char* op = "softmax_cross_entropy";
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
    fail(op, "label_smoothing is " + std::to_string(label_smoothing) + ", outside [0, 1]",
         "0 is plain cross-entropy; 0.1 is the usual smoothing");
  require_storage(op, "logits", logits);
  const RowsCols s{logits.shape.rows(), logits.shape.cols()};
  require_present(op, "labels", labels);
  if (labels.dtype != DType::int32)
    fail(op, "labels is " + describe(labels) + " but must be int32",
         "store class indices as int32");
  require_numel(op, "labels", labels, s.rows);
  require_fp32(op, "loss", loss);
  require_numel(op, "loss", loss, 1);
  if (!correct.empty()) {
    if (correct.dtype != DType::int32)
      fail(op, "correct is " + describe(correct) + " but must be int32",
           "pass an int32 [1] tensor");
    require_numel(op, "correct", correct, 1);
  }
  if (!dlogits.empty()) {
    require_storage(op, "dlogits", dlogits);
    require_numel(op, "dlogits", dlogits, logits.numel());
    // In place over logits is fine (a row is read before its gradient is written); a partial or
    // other-dtype alias races on a device, and the labels and the loss must survive the gradient.
    require_same_or_disjoint(op, "dlogits", dlogits, "logits", logits);
    require_disjoint(op, "dlogits", dlogits, "labels", labels);
    require_disjoint(op, "dlogits", dlogits, "loss", loss);
  }
  if (s.rows == 0 || s.cols == 0)
    fail(op, "logits " + describe(logits) + " is empty", "pass at least one row and one class");
  return s;
}

void BackendArgumentChecks::optimizer_param(std::string_view op, std::size_t index,
                                            const ParamTensors& p, bool needs_state1,
                                            bool needs_state2) const {
  const std::string prefix = "params[" + std::to_string(index) + "].";
  require_fp32(op, prefix + "master", p.master);
  const std::int64_t n = p.master.numel();
  require_fp32(op, prefix + "grad", p.grad);
  require_numel(op, prefix + "grad", p.grad, n);
  if (!p.working.empty()) {
    require_storage(op, prefix + "working", p.working);
    require_numel(op, prefix + "working", p.working, n);
  }
  for (auto [needed, view, name] : {std::tuple{needs_state1, &p.state1, "state1"},
                                    std::tuple{needs_state2, &p.state2, "state2"}}) {
    if (!needed) continue;
    if (view->empty())
      fail(op, prefix + name + " is missing", "allocate an fp32 state tensor shaped like master");
    require_fp32(op, prefix + name, *view);
    require_numel(op, prefix + name, *view, n);
  }
}

void BackendArgumentChecks::gradient_status(std::string_view op, const TensorView& status) const {
  require_present(op, "status", status);
  if (status.dtype != DType::int32 || status.numel() != GradientStatus::kWords)
    fail(op,
         "status " + describe(status) + " is not int32 [" + std::to_string(GradientStatus::kWords) +
             "]",
         "allocate the status as int32 [4] (sdk::GradientStatus) on this backend");
  // The record starts with a double (the sum of squares): a device reads it 8 bytes at a time.
  if (reinterpret_cast<std::uintptr_t>(status.data) % alignof(double) != 0)
    fail(op, "status " + describe(status) + " is not 8-byte aligned",
         "allocate the status as a tensor of its own (sdk::GradientStatus), not a slice of one");
}

void BackendArgumentChecks::count_underflow(const TensorView& values, float threshold) const {
  constexpr const char* op = "count_underflow";
  require_fp32(op, "values", values);
  if (!std::isfinite(threshold) || threshold < 0.0f)
    fail(op, "threshold " + std::to_string(threshold) + " is negative or not finite",
         "pass the largest magnitude the narrower dtype stores as zero (0 or more)");
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::bias_grad_shape(
    const TensorView& dy, const TensorView& dbias) const {
  constexpr const char* op = "bias_grad";
  require_storage(op, "dy", dy);
  require_fp32(op, "dbias", dbias);
  const RowsCols s{dy.shape.rows(), dy.shape.cols()};
  require_numel(op, "dbias", dbias, s.cols);
  return s;
}

void BackendArgumentChecks::copy_args(const TensorView& dst, const TensorView& src) const {
  require_present("copy", "dst", dst);
  require_present("copy", "src", src);
  if (dst.numel() != src.numel() || dtype_size(dst.dtype) != dtype_size(src.dtype) ||
      (dst.dtype != src.dtype && !(is_fp32_storage(dst.dtype) && is_fp32_storage(src.dtype))))
    fail("copy", "dst is " + describe(dst) + " but src is " + describe(src),
         "copy needs the same dtype and element count; use cast() to change dtype");
  // A device copy engine (cudaMemcpyAsync) leaves a partial overlap undefined: every backend
  // refuses it, so none gives an answer another would not.
  if (dst.data != src.data && overlaps(src, dst))
    fail("copy", "dst " + describe(dst) + " and src " + describe(src) + " partly overlap",
         "copy between disjoint tensors (or a tensor onto itself); go through a scratch tensor");
}

void BackendArgumentChecks::cast_args(const TensorView& src, const TensorView& dst,
                                      const CastArgs& args) const {
  require_present("cast", "src", src);
  require_present("cast", "dst", dst);
  auto is_cast_target = [](DType t) { return is_storage_float(t) || is_fp8(t); };
  if (!is_cast_target(src.dtype) || !is_cast_target(dst.dtype))
    fail("cast", "cannot cast " + describe(src) + " to " + describe(dst),
         "cast supports fp32, tf32, bf16, fp16, fp8_e4m3 and fp8_e5m2");
  require_numel("cast", "dst", dst, src.numel());
  const bool in_place = src.data == dst.data && dtype_size(src.dtype) == dtype_size(dst.dtype);
  if (!in_place && overlaps(src, dst))
    fail("cast", "dst " + describe(dst) + " and src " + describe(src) + " partly overlap",
         "cast in place only between dtypes of one size; otherwise into a separate buffer");
  if (!args.amax.empty()) {
    require_fp32("cast", "amax", args.amax);
    require_numel("cast", "amax", args.amax, 1);
    require_disjoint("cast", "amax", args.amax, "src", src);
    require_disjoint("cast", "amax", args.amax, "dst", dst);
  }
}

void BackendArgumentChecks::activation_args(const TensorView& x, const TensorView& y) const {
  constexpr const char* op = "activation_forward";
  require_storage(op, "x", x);
  require_storage(op, "y", y);
  require_numel(op, "y", y, x.numel());
  require_same_or_disjoint(op, "y", y, "x", x);
}

void BackendArgumentChecks::activation_grad_args(const TensorView& x, const TensorView& dy,
                                                 const TensorView& dx) const {
  constexpr const char* op = "activation_backward";
  require_storage(op, "x", x);
  require_storage(op, "dy", dy);
  require_storage(op, "dx", dx);
  require_numel(op, "dy", dy, x.numel());
  require_numel(op, "dx", dx, x.numel());
  require_same_or_disjoint(op, "dx", dx, "dy", dy);
  require_same_or_disjoint(op, "dx", dx, "x", x);
}

void BackendArgumentChecks::axpy_args(const TensorView& x, const TensorView& y) const {
  constexpr const char* op = "axpy";
  require_storage(op, "x", x);
  require_fp32(op, "y", y);
  require_numel(op, "y", y, x.numel());
  require_same_or_disjoint(op, "y", y, "x", x);
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::cast_transpose_shape(
    const CastTransposeArgs& args) const {
  return cast_layouts_shape("cast_transpose", args);
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::cast_transpose_gradient_shape(
    const CastTransposeGradientArgs& args) const {
  constexpr std::string_view op = "cast_transpose_gradient";
  const RowsCols rc = cast_layouts_shape(op, args.cast);
  const TensorView* outs[2] = {&args.cast.out, &args.cast.out_transposed};
  const char* out_names[2] = {"out", "out_transposed"};
  if (args.has_activation_grad) {
    if (args.activation != Activation::gelu)
      fail(op, "the activation gradient is defined for gelu only",
           "run activation_backward before the cast for relu");
    require_present(op, "pre_activation", args.pre_activation);
    if (args.pre_activation.dtype != args.cast.src.dtype ||
        args.pre_activation.numel() != rc.rows * rc.cols ||
        args.pre_activation.shape.cols() != rc.cols)
      fail(op,
           "pre_activation is " + describe(args.pre_activation) + " but src is " +
               describe(args.cast.src),
           "give the activation's input of the forward, of src's dtype and shape");
    for (int i = 0; i < 2; ++i)
      require_disjoint(op, out_names[i], *outs[i], "pre_activation", args.pre_activation);
    require_disjoint(op, "amax", args.cast.cast.amax, "pre_activation", args.pre_activation);
  } else if (!args.pre_activation.empty()) {
    fail(op, "pre_activation " + describe(args.pre_activation) + " is given without an activation",
         "set has_activation_grad, or leave pre_activation empty");
  }
  if (!args.column_sums.empty()) {
    require_fp32(op, "column_sums", args.column_sums);
    require_numel(op, "column_sums", args.column_sums, rc.cols);
    require_disjoint(op, "column_sums", args.column_sums, "src", args.cast.src);
    require_disjoint(op, "column_sums", args.column_sums, "pre_activation", args.pre_activation);
    require_disjoint(op, "column_sums", args.column_sums, "amax", args.cast.cast.amax);
    for (int i = 0; i < 2; ++i)
      require_disjoint(op, "column_sums", args.column_sums, out_names[i], *outs[i]);
  }
  return rc;
}

BackendArgumentChecks::RowsCols BackendArgumentChecks::cast_layouts_shape(
    std::string_view op, const CastTransposeArgs& args) const {
  require_present(op, "src", args.src);
  const DType st = args.src.dtype;
  if (st != DType::fp32 && st != DType::bf16 && st != DType::fp16)
    fail(op, "src is " + describe(args.src),
         "cast an fp32, bf16 or fp16 source (decode anything else with cast first)");
  if (args.out.empty() && args.out_transposed.empty())
    fail(op, "neither out nor out_transposed was given", "pass at least one output");
  const RowsCols rc{args.src.shape.rows(), args.src.shape.cols()};
  const std::int64_t want[2][2] = {{rc.rows, rc.cols}, {rc.cols, rc.rows}};
  const char* names[2] = {"out", "out_transposed"};
  const TensorView* outs[2] = {&args.out, &args.out_transposed};
  for (int i = 0; i < 2; ++i) {
    const TensorView& o = *outs[i];
    if (o.empty()) continue;
    if (!is_fp8(o.dtype))
      fail(op, std::string(names[i]) + " is " + describe(o),
           "this cast writes fp8_e4m3 or fp8_e5m2; cast other dtypes with cast");
    if (o.shape.rows() != want[i][0] || o.shape.cols() != want[i][1])
      fail(op,
           std::string(names[i]) + " is " + describe(o) + " but src " + describe(args.src) +
               " needs [" + std::to_string(want[i][0]) + ", " + std::to_string(want[i][1]) + "]",
           i == 0 ? "give out src's shape"
                  : "give out_transposed src's shape with its two dims swapped");
    require_disjoint(op, names[i], o, "src", args.src);
    require_disjoint(op, names[i], o, "amax", args.cast.amax);
  }
  if (!args.out.empty() && !args.out_transposed.empty()) {
    if (args.out.dtype != args.out_transposed.dtype)
      fail(op,
           "out is " + describe(args.out) + " but out_transposed is " +
               describe(args.out_transposed),
           "write both layouts in one FP8 dtype");
    require_disjoint(op, "out", args.out, "out_transposed", args.out_transposed);
  }
  if (!args.cast.amax.empty()) {
    require_fp32(op, "amax", args.cast.amax);
    require_numel(op, "amax", args.cast.amax, 1);
    // The amax is folded in while other threads still read src: inside src, the codes would
    // depend on timing.
    require_disjoint(op, "amax", args.cast.amax, "src", args.src);
  }
  return rc;
}

BackendArgumentChecks::GemmShape BackendArgumentChecks::gemm_batched_shape(
    const GemmBatchedArgs& args) const {
  constexpr std::string_view op = "gemm_strided_batched";
  if (args.batch < 0)
    fail(op, "batch = " + std::to_string(args.batch) + " is negative", "pass batch >= 0");
  if (!args.gemm.bias.empty() || args.gemm.has_activation || !args.gemm.pre_activation.empty())
    fail(op, "a bias, activation or pre_activation was given",
         "run the epilogue separately, or use gemm() per batch");
  const GemmShape s = gemm_shape(args.gemm);
  if (args.batch > 1 && (args.stride_c < 0 ? -args.stride_c : args.stride_c) < s.m * s.n)
    fail(op,
         "stride_c = " + std::to_string(args.stride_c) + " makes the output batches of [" +
             std::to_string(s.m) + ", " + std::to_string(s.n) + "] overlap",
         "give each batch's C its own memory: |stride_c| >= m*n");
  return s;
}

BackendArgumentChecks::GemmShape BackendArgumentChecks::gemm_gradient_shape(
    const GemmGradientArgs& args) const {
  constexpr std::string_view op = "gemm_gradient";
  const GemmArgs& g = args.gemm;
  if (!g.bias.empty() || g.has_activation || !g.pre_activation.empty())
    fail(op, "a bias, forward activation or its pre_activation was given",
         "a backward GEMM takes has_activation_grad and its pre_activation, and the bias "
         "gradients as c_column_sums / a_row_sums");
  const GemmShape s = gemm_shape(g);
  if (args.has_activation_grad) {
    if (args.activation != Activation::gelu)
      fail(op, "the activation gradient is defined for gelu only",
           "run activation_backward after the GEMM for relu");
    require_present(op, "pre_activation", args.pre_activation);
    require_storage(op, "pre_activation", args.pre_activation);
    if (args.pre_activation.shape.cols() != s.n || args.pre_activation.numel() != s.m * s.n)
      fail(op,
           "pre_activation is " + describe(args.pre_activation) + " but C is [" +
               std::to_string(s.m) + ", " + std::to_string(s.n) + "]",
           "pass the forward's z, which has C's shape");
    if (overlaps(g.c, args.pre_activation))
      fail(op, "pre_activation and C overlap",
           "give C its own buffer (pre_activation is read while C is written)");
  } else if (!args.pre_activation.empty()) {
    fail(op, "pre_activation " + describe(args.pre_activation) + " is given without an activation",
         "set has_activation_grad, or leave pre_activation empty");
  }
  if (!args.c_column_sums.empty()) {
    require_fp32(op, "c_column_sums", args.c_column_sums);
    require_numel(op, "c_column_sums", args.c_column_sums, s.n);
    if (overlaps(g.c, args.c_column_sums))
      fail(op, "c_column_sums and C overlap", "give the sums their own buffer");
  }
  if (!args.a_row_sums.empty()) {
    require_fp32(op, "a_row_sums", args.a_row_sums);
    require_numel(op, "a_row_sums", args.a_row_sums, s.m);
    if (!g.a.transpose)
      fail(op, "a_row_sums asks for A's sums but A is not transposed",
           "a_row_sums serves wgrad (A = dy stored [k, m], transposed); sum other layouts with "
           "bias_grad");
    const DType at = g.a.view.dtype;
    if (at != DType::fp32 && at != DType::bf16 && at != DType::fp16)
      fail(op, "a_row_sums asks for the sums of A " + describe(g.a.view),
           "sum a 16/32-bit A only (an fp8 A's values need its scale): use bias_grad");
    if (overlaps(g.c, args.a_row_sums))
      fail(op, "a_row_sums and C overlap", "give the sums their own buffer");
  }
  return s;
}

void BackendArgumentChecks::foreach_lists(
    std::string_view op, std::span<const TensorView> self,
    std::initializer_list<std::span<const TensorView>> others) const {
  std::size_t list = 1;
  for (const auto& other : others) {
    if (other.size() != self.size())
      fail(op,
           "list " + std::to_string(list) + " has " + std::to_string(other.size()) +
               " tensors but self has " + std::to_string(self.size()),
           "pass lists of equal length, one tensor per parameter");
    ++list;
  }
  for (std::size_t i = 0; i < self.size(); ++i) {
    const std::string at = "[" + std::to_string(i) + "]";
    require_fp32(op, "self" + at, self[i]);
    list = 1;
    for (const auto& other : others) {
      const std::string name = "list " + std::to_string(list++) + at;
      require_fp32(op, name, other[i]);
      if (other[i].numel() != self[i].numel())
        fail(op, name + " is " + describe(other[i]) + " but self" + at + " is " + describe(self[i]),
             "the i-th tensors of every list need the same number of elements");
      require_same_or_disjoint(op, name, other[i], "self" + at, self[i]);
    }
  }
  // The self tensors in address order: each must end before the next begins.
  std::vector<std::size_t> order(self.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return reinterpret_cast<std::uintptr_t>(self[a].data) <
           reinterpret_cast<std::uintptr_t>(self[b].data);
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const std::size_t a = order[k - 1], b = order[k];
    if (overlaps(self[a], self[b]))
      fail(op,
           "self[" + std::to_string(a) + "] " + describe(self[a]) + " and self[" +
               std::to_string(b) + "] " + describe(self[b]) + " overlap",
           "list each tensor once: every one is updated at the same time");
  }
  // No other[i] overlaps a self[j] with j != i: one launch writes self[j] while it reads other[i]
  // (other[i] over its own self[i] is the in-place case, checked above). The self tensors are
  // disjoint and sorted, so the ones other[i] can meet end the ordered run before its end.
  const auto start = [](const TensorView& v) { return reinterpret_cast<std::uintptr_t>(v.data); };
  list = 1;
  for (const auto& other : others) {
    for (std::size_t i = 0; i < other.size(); ++i) {
      const std::uintptr_t end = start(other[i]) + other[i].bytes();
      auto p =
          std::lower_bound(order.begin(), order.end(), end,
                           [&](std::size_t j, std::uintptr_t e) { return start(self[j]) < e; });
      while (p != order.begin()) {
        const std::size_t j = *--p;
        if (self[j].numel() == 0) continue;  // empty: overlaps nothing, bounds nothing
        if (!overlaps(self[j], other[i])) break;
        if (j != i)
          fail(op,
               "list " + std::to_string(list) + "[" + std::to_string(i) + "] " +
                   describe(other[i]) + " overlaps self[" + std::to_string(j) + "] " +
                   describe(self[j]) + ": the update writes self[" + std::to_string(j) +
                   "] while it reads list " + std::to_string(list) + "[" + std::to_string(i) + "]",
               "give each list's tensors memory of their own (a tensor may be another list's "
               "only at the same index, in place)");
      }
    }
    ++list;
  }
}

}  // namespace mixtrain::sdk
