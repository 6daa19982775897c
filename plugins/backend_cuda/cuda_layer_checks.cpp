// The CUDA backend's own checks of the convolution and pooling ops (contract in the header).
#include "cuda_layer_checks.h"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "cuda_access.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"

namespace mixtrain::backend_cuda::layer_checks {

using sdk::DType;
using sdk::TensorView;

namespace {

// `what` names the tensor and describes it (a call's view) or its dtype (a query's).
void conv_operand_dtype(std::string_view op, const std::string& what, DType t) {
  if (!is_conv_operand(t))
    fail(op,
         what +
             "; the cuda backend's convolution operands are fp32, tf32, bf16 or fp16 (fp8 is "
             "not offered: supports() answers false)",
         "cast the tensor to bf16 or fp16 first (backend.cast), or run fp8 convolutions on the "
         "cpu backend");
}

void conv_operand(std::string_view op, std::string_view name, const sdk::GemmOperand& o) {
  conv_operand_dtype(op, std::string(name) + " is " + describe(o.view), o.view.dtype);
}

void conv_output_dtype(std::string_view op, const std::string& what, DType t) {
  if (!sdk::is_storage_float(t))
    fail(op, what + "; outputs are fp32, bf16 or fp16",
         "allocate the output in fp32, bf16 or fp16");
}

void conv_output(std::string_view op, std::string_view name, const TensorView& v) {
  conv_output_dtype(op, std::string(name) + " is " + describe(v), v.dtype);
}

void conv_compute(std::string_view op, DType compute) {
  if (compute != DType::fp32 && compute != DType::tf32)
    fail(op,
         "compute = " + std::string(sdk::dtype_name(compute)) + " is not supported (fp32 or tf32)",
         "set compute to fp32, or tf32 to allow TF32 Tensor Cores on fp32 operands");
}

// cuDNN's tensor descriptors take int64 dims, but its engines index with 32 bits per tensor.
void conv_limits(std::string_view op, const sdk::Conv2dGeometry& g) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  // Checked products: a workspace query has no tensors whose shape checks would bound them.
  const auto over = [&](std::initializer_list<std::int64_t> dims) {
    std::int64_t n = 1;
    for (const std::int64_t d : dims)
      if (__builtin_mul_overflow(n, d, &n)) return true;
    return n > kMax;
  };
  if (over({g.batch, g.height, g.width, g.in_channels}) ||
      over({g.batch, g.out_height(), g.out_width(), g.out_channels}))
    fail(op, "an activation of this geometry has more than 2^31 - 1 elements",
         "split the batch into smaller convolutions");
}

void max_pool_workspace(std::string_view op, const sdk::Pool2dGeometry& g,
                        const TensorView& workspace, std::size_t bytes) {
  if (g.kind == sdk::PoolKind::max && !workspace.empty())
    checks().pool2d_workspace(op, workspace, bytes);
}

}  // namespace

bool is_conv_operand(DType t) {
  return sdk::is_storage_float(t);
}

void conv_forward(const sdk::Conv2dForwardArgs& a) {
  constexpr std::string_view op = "conv2d_forward";
  conv_operand(op, "x", a.x);
  conv_operand(op, "w", a.w);
  conv_output(op, "y", a.y);
  conv_compute(op, a.compute);
  checks().conv2d_forward(a);
  conv_limits(op, a.geometry);
}

void conv_backward_data(const sdk::Conv2dBackwardDataArgs& a) {
  constexpr std::string_view op = "conv2d_backward_data";
  conv_operand(op, "dy", a.dy);
  conv_operand(op, "w", a.w);
  conv_output(op, "dx", a.dx);
  conv_compute(op, a.compute);
  checks().conv2d_backward_data(a);
  conv_limits(op, a.geometry);
}

void conv_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& a) {
  constexpr std::string_view op = "conv2d_backward_data_accumulate";
  conv_operand(op, "dy", a.dy);
  conv_operand(op, "w", a.w);
  conv_compute(op, a.compute);
  checks().conv2d_backward_data_accumulate(a);
  conv_limits(op, a.geometry);
}

void conv_backward_weights(const sdk::Conv2dBackwardWeightsArgs& a) {
  constexpr std::string_view op = "conv2d_backward_weights";
  conv_operand(op, "x", a.x);
  conv_operand(op, "dy", a.dy);
  conv_compute(op, a.compute);
  checks().conv2d_backward_weights(a);
  conv_limits(op, a.geometry);
}

void conv_workspace_query(const sdk::Conv2dWorkspaceQuery& q) {
  constexpr std::string_view op = "conv2d_workspace_bytes";
  checks().conv2d_workspace_query(q);
  const auto named = [](const char* name, DType t) {
    return std::string("query.") + name + " is " + std::string(sdk::dtype_name(t));
  };
  conv_operand_dtype(op, named("a", q.a), q.a);
  conv_operand_dtype(op, named("b", q.b), q.b);
  // The accumulate's dx rule is the shared check's; a weight gradient is always fp32.
  if (q.op == sdk::ConvolutionOp::conv2d_forward ||
      q.op == sdk::ConvolutionOp::conv2d_backward_data)
    conv_output_dtype(op, named("out", q.out), q.out);
  conv_limits(op, q.geometry);
}

void pool_limits(std::string_view op, const sdk::Pool2dGeometry& g) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  if (g.kernel_h * g.kernel_w > kMax || g.stride_h > kMax || g.stride_w > kMax || g.pad_h > kMax ||
      g.pad_w > kMax)
    fail(op, "the pooling window, strides and padding must each fit in 32 bits",
         "check the layer's Pool2dGeometry");
}

void pool_forward(const sdk::Pool2dGeometry& g, const TensorView& x, const TensorView& y,
                  const TensorView& workspace, std::size_t workspace_bytes) {
  constexpr std::string_view op = "pool2d_forward";
  checks().pool2d_forward(g, x, y);
  pool_limits(op, g);
  max_pool_workspace(op, g, workspace, workspace_bytes);
}

void pool_backward(const sdk::Pool2dGeometry& g, const TensorView& dy, const TensorView& x,
                   const TensorView& workspace, std::size_t workspace_bytes, const TensorView& dx) {
  constexpr std::string_view op = "pool2d_backward";
  checks().pool2d_backward(g, dy, x, workspace, dx);
  pool_limits(op, g);
  max_pool_workspace(op, g, workspace, workspace_bytes);
}

}  // namespace mixtrain::backend_cuda::layer_checks
