// Argument checks of the convolution, pooling, permute and batch-norm ops (contract in the header).
#include "cuda_layer_checks.h"

#include <array>
#include <limits>
#include <string>

#include "cuda_access.h"
#include "mixtrain/sdk/backend_argument_checks.h"

namespace mixtrain::backend_cuda::layer_checks {

using sdk::DType;
using sdk::TensorView;

namespace {

std::string dims_text(const std::array<std::int64_t, 4>& d) {
  return "[" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) +
         ", " + std::to_string(d[3]) + "]";
}

void at_least(std::string_view op, const char* name, std::int64_t v, std::int64_t lo,
              const char* hint) {
  if (v < lo)
    fail(op,
         std::string(name) + " = " + std::to_string(v) + " must be at least " + std::to_string(lo),
         hint);
}

// The product of `dims`, or a BackendError when it overflows int64.
std::int64_t product(std::string_view op, std::string_view name,
                     const std::array<std::int64_t, 4>& dims) {
  std::int64_t n = 1;
  for (std::int64_t d : dims) {
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      fail(op, std::string(name) + " " + dims_text(dims) + " has more than 2^63 elements",
           "check the geometry");
    n *= d;
  }
  return n;
}

constexpr const char* kImageHint =
    "image activations are channels-last [N, H, W, C] (permute channels-first data with "
    "to_channels_last); check the geometry";
constexpr const char* kWeightHint =
    "weights are PyTorch's layout [O, C/groups, KH, KW]; check the geometry";

// A tensor of the geometry: exactly `dims` when the view is 4-D, else the same element count.
void tensor_of(std::string_view op, std::string_view name, const TensorView& v,
               const std::array<std::int64_t, 4>& dims, std::string_view layout, const char* hint) {
  require_present(op, name, v);
  const std::int64_t n = product(op, name, dims);
  bool ok = v.numel() == n;
  if (ok && v.shape.rank == 4)
    for (int i = 0; i < 4; ++i) ok = ok && v.shape[i] == dims[static_cast<std::size_t>(i)];
  if (!ok)
    fail(op,
         std::string(name) + " is " + describe(v) + " but the geometry expects " +
             std::string(layout) + " = " + dims_text(dims) + " (" + std::to_string(n) +
             " elements)",
         hint);
}

void conv_operand(std::string_view op, std::string_view name, const sdk::GemmOperand& o) {
  if (!is_conv_operand(o.view.dtype))
    fail(op,
         std::string(name) + " is " + describe(o.view) +
             "; the cuda backend's convolution operands are fp32, tf32, bf16 or fp16 (fp8 is "
             "not offered: supports() answers false)",
         "cast the tensor to bf16 or fp16 first (backend.cast), or run fp8 convolutions on the "
         "cpu backend");
  if (o.transpose)
    fail(op, std::string(name) + " has transpose = true; convolution operands are never transposed",
         "pass the tensor in its own layout with transpose = false");
}

void conv_output(std::string_view op, std::string_view name, const TensorView& v) {
  if (!sdk::is_storage_float(v.dtype))
    fail(op, std::string(name) + " is " + describe(v) + "; outputs are fp32, bf16 or fp16",
         "allocate the output in fp32, bf16 or fp16");
}

void disjoint(std::string_view op, std::string_view out_name, const TensorView& out,
              std::string_view in_name, const TensorView& in) {
  if (sdk::overlaps(out, in))
    fail(op, std::string(out_name) + " overlaps " + std::string(in_name),
         "write the output into a separate buffer");
}

std::array<std::int64_t, 4> x_dims(const sdk::Conv2dGeometry& g) {
  return {g.batch, g.height, g.width, g.in_channels};
}
std::array<std::int64_t, 4> y_dims(const sdk::Conv2dGeometry& g) {
  return {g.batch, g.out_height(), g.out_width(), g.out_channels};
}
std::array<std::int64_t, 4> w_dims(const sdk::Conv2dGeometry& g) {
  return {g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
}

void same_storage(std::string_view op, std::string_view a_name, const TensorView& a,
                  std::string_view b_name, const TensorView& b, const char* what) {
  const bool same =
      a.dtype == b.dtype || (sdk::is_fp32_storage(a.dtype) && sdk::is_fp32_storage(b.dtype));
  if (!same)
    fail(op,
         std::string(a_name) + " is " + describe(a) + " but " + std::string(b_name) + " is " +
             describe(b) + "; " + what + " keeps one dtype",
         "cast one of them so both are fp32, bf16 or fp16");
}

void workspace_bytes(std::string_view op, const TensorView& ws, std::size_t bytes,
                     const char* hint) {
  if (ws.bytes() < bytes || (bytes > 0 && ws.data == nullptr))
    fail(op,
         "workspace is " + describe(ws) + " (" + std::to_string(ws.bytes()) + " bytes) but " +
             std::to_string(bytes) + " bytes are needed",
         hint);
}

// Element-wise outputs may be their input exactly (same data and dtype size), or disjoint.
void same_or_disjoint(std::string_view op, std::string_view out_name, const TensorView& out,
                      std::string_view in_name, const TensorView& in) {
  if (!sdk::overlaps(out, in)) return;
  if (out.data == in.data && out.bytes() == in.bytes()) return;
  fail(op, std::string(out_name) + " partly overlaps " + std::string(in_name),
       "write " + std::string(out_name) + " in place of " + std::string(in_name) +
           " exactly, or into a separate buffer");
}

}  // namespace

bool is_conv_operand(DType t) {
  return sdk::is_storage_float(t);
}

void conv_geometry(std::string_view op, const sdk::Conv2dGeometry& g) {
  const char* hint = "check the layer's Conv2dGeometry";
  at_least(op, "geometry.batch", g.batch, 1, hint);
  at_least(op, "geometry.in_channels", g.in_channels, 1, hint);
  at_least(op, "geometry.height", g.height, 1, hint);
  at_least(op, "geometry.width", g.width, 1, hint);
  at_least(op, "geometry.out_channels", g.out_channels, 1, hint);
  at_least(op, "geometry.kernel_h", g.kernel_h, 1, hint);
  at_least(op, "geometry.kernel_w", g.kernel_w, 1, hint);
  at_least(op, "geometry.stride_h", g.stride_h, 1, hint);
  at_least(op, "geometry.stride_w", g.stride_w, 1, hint);
  at_least(op, "geometry.dilation_h", g.dilation_h, 1, hint);
  at_least(op, "geometry.dilation_w", g.dilation_w, 1, hint);
  at_least(op, "geometry.groups", g.groups, 1, hint);
  at_least(op, "geometry.pad_h", g.pad_h, 0, hint);
  at_least(op, "geometry.pad_w", g.pad_w, 0, hint);
  if (g.in_channels % g.groups != 0 || g.out_channels % g.groups != 0)
    fail(op,
         "groups = " + std::to_string(g.groups) +
             " must divide in_channels = " + std::to_string(g.in_channels) +
             " and out_channels = " + std::to_string(g.out_channels),
         hint);
  if (g.out_height() < 1 || g.out_width() < 1)
    fail(op,
         "the kernel " + std::to_string(g.kernel_h) + "x" + std::to_string(g.kernel_w) +
             " (dilation " + std::to_string(g.dilation_h) + "x" + std::to_string(g.dilation_w) +
             ") does not fit in the " + std::to_string(g.height) + "x" + std::to_string(g.width) +
             " image padded by " + std::to_string(g.pad_h) + "x" + std::to_string(g.pad_w),
         "use a smaller kernel or dilation, or more padding");
  // cuDNN's tensor descriptors take int64 dims, but its engines index with 32 bits per tensor.
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  if (product(op, "x", x_dims(g)) > kMax || product(op, "y", y_dims(g)) > kMax)
    fail(op, "an activation of this geometry has more than 2^31 - 1 elements",
         "split the batch into smaller convolutions");
}

void conv_compute(std::string_view op, DType compute) {
  if (compute != DType::fp32 && compute != DType::tf32)
    fail(op,
         "compute = " + std::string(sdk::dtype_name(compute)) + " is not supported (fp32 or tf32)",
         "set compute to fp32, or tf32 to allow TF32 Tensor Cores on fp32 operands");
}

void conv_forward(const sdk::Conv2dForwardArgs& a) {
  constexpr std::string_view op = "conv2d_forward";
  const auto& g = a.geometry;
  conv_geometry(op, g);
  conv_operand(op, "x", a.x);
  conv_operand(op, "w", a.w);
  conv_output(op, "y", a.y);
  conv_compute(op, a.compute);
  tensor_of(op, "x", a.x.view, x_dims(g), "[N, H, W, C]", kImageHint);
  tensor_of(op, "w", a.w.view, w_dims(g), "[O, C/groups, KH, KW]", kWeightHint);
  tensor_of(op, "y", a.y, y_dims(g), "[N, OH, OW, O]", kImageHint);
  if (!a.bias.empty()) {
    require_fp32(op, "bias", a.bias);
    require_numel(op, "bias", a.bias, g.out_channels);
  }
  disjoint(op, "y", a.y, "x", a.x.view);
  disjoint(op, "y", a.y, "w", a.w.view);
}

void conv_backward_data(const sdk::Conv2dBackwardDataArgs& a) {
  constexpr std::string_view op = "conv2d_backward_data";
  const auto& g = a.geometry;
  conv_geometry(op, g);
  conv_operand(op, "dy", a.dy);
  conv_operand(op, "w", a.w);
  conv_output(op, "dx", a.dx);
  conv_compute(op, a.compute);
  tensor_of(op, "dy", a.dy.view, y_dims(g), "[N, OH, OW, O]", kImageHint);
  tensor_of(op, "w", a.w.view, w_dims(g), "[O, C/groups, KH, KW]", kWeightHint);
  tensor_of(op, "dx", a.dx, x_dims(g), "[N, H, W, C]", kImageHint);
  disjoint(op, "dx", a.dx, "dy", a.dy.view);
  disjoint(op, "dx", a.dx, "w", a.w.view);
}

void conv_backward_weights(const sdk::Conv2dBackwardWeightsArgs& a) {
  constexpr std::string_view op = "conv2d_backward_weights";
  const auto& g = a.geometry;
  conv_geometry(op, g);
  conv_operand(op, "x", a.x);
  conv_operand(op, "dy", a.dy);
  conv_compute(op, a.compute);
  tensor_of(op, "x", a.x.view, x_dims(g), "[N, H, W, C]", kImageHint);
  tensor_of(op, "dy", a.dy.view, y_dims(g), "[N, OH, OW, O]", kImageHint);
  require_fp32(op, "dw", a.dw);
  tensor_of(op, "dw", a.dw, w_dims(g), "[O, C/groups, KH, KW]", kWeightHint);
  if (!a.dbias.empty()) {
    require_fp32(op, "dbias", a.dbias);
    require_numel(op, "dbias", a.dbias, g.out_channels);
  }
  disjoint(op, "dw", a.dw, "x", a.x.view);
  disjoint(op, "dw", a.dw, "dy", a.dy.view);
}

void pool_geometry(std::string_view op, const sdk::Pool2dGeometry& g) {
  const char* hint = "check the layer's Pool2dGeometry";
  at_least(op, "geometry.batch", g.batch, 1, hint);
  at_least(op, "geometry.channels", g.channels, 1, hint);
  at_least(op, "geometry.height", g.height, 1, hint);
  at_least(op, "geometry.width", g.width, 1, hint);
  at_least(op, "geometry.kernel_h", g.kernel_h, 1, hint);
  at_least(op, "geometry.kernel_w", g.kernel_w, 1, hint);
  at_least(op, "geometry.stride_h", g.stride_h, 1, hint);
  at_least(op, "geometry.stride_w", g.stride_w, 1, hint);
  at_least(op, "geometry.pad_h", g.pad_h, 0, hint);
  at_least(op, "geometry.pad_w", g.pad_w, 0, hint);
  if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w)
    fail(op,
         "padding " + std::to_string(g.pad_h) + "x" + std::to_string(g.pad_w) +
             " is more than half the kernel " + std::to_string(g.kernel_h) + "x" +
             std::to_string(g.kernel_w),
         "use at most kernel/2 padding (PyTorch's rule: every window overlaps the image)");
  if (g.out_height() < 1 || g.out_width() < 1)
    fail(op,
         "the kernel " + std::to_string(g.kernel_h) + "x" + std::to_string(g.kernel_w) +
             " does not fit in the " + std::to_string(g.height) + "x" + std::to_string(g.width) +
             " image padded by " + std::to_string(g.pad_h) + "x" + std::to_string(g.pad_w),
         "use a smaller kernel or more padding");
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  if (g.kernel_h * g.kernel_w > kMax || g.stride_h > kMax || g.stride_w > kMax || g.pad_h > kMax ||
      g.pad_w > kMax)
    fail(op, "the pooling window, strides and padding must each fit in 32 bits", hint);
}

void pool_forward(const sdk::Pool2dGeometry& g, const TensorView& x, const TensorView& y,
                  const TensorView& workspace, std::size_t ws_bytes) {
  constexpr std::string_view op = "pool2d_forward";
  pool_geometry(op, g);
  require_storage(op, "x", x);
  require_storage(op, "y", y);
  tensor_of(op, "x", x, {g.batch, g.height, g.width, g.channels}, "[N, H, W, C]", kImageHint);
  tensor_of(op, "y", y, {g.batch, g.out_height(), g.out_width(), g.channels}, "[N, OH, OW, C]",
            kImageHint);
  same_storage(op, "x", x, "y", y, "pooling");
  disjoint(op, "y", y, "x", x);
  if (g.kind == sdk::PoolKind::max && !workspace.empty())
    workspace_bytes(op, workspace, ws_bytes,
                    "allocate pool2d_workspace_bytes(geometry, dtype) bytes and pass the same "
                    "workspace to the forward and the backward");
}

void pool_backward(const sdk::Pool2dGeometry& g, const TensorView& dy, const TensorView& x,
                   const TensorView& workspace, std::size_t ws_bytes, const TensorView& dx) {
  constexpr std::string_view op = "pool2d_backward";
  pool_geometry(op, g);
  require_storage(op, "dy", dy);
  require_storage(op, "dx", dx);
  tensor_of(op, "dy", dy, {g.batch, g.out_height(), g.out_width(), g.channels}, "[N, OH, OW, C]",
            kImageHint);
  tensor_of(op, "dx", dx, {g.batch, g.height, g.width, g.channels}, "[N, H, W, C]", kImageHint);
  same_storage(op, "dy", dy, "dx", dx, "pooling");
  disjoint(op, "dx", dx, "dy", dy);
  if (g.kind != sdk::PoolKind::max) return;
  if (!workspace.empty()) {
    workspace_bytes(op, workspace, ws_bytes,
                    "allocate pool2d_workspace_bytes(geometry, dtype) bytes and pass the same "
                    "workspace to the forward and the backward");
    return;
  }
  if (x.empty())
    fail(op, "max pooling's backward needs the forward's workspace or x",
         "pass the workspace filled by pool2d_forward, or x");
  require_storage(op, "x", x);
  tensor_of(op, "x", x, {g.batch, g.height, g.width, g.channels}, "[N, H, W, C]", kImageHint);
  same_storage(op, "x", x, "dy", dy, "pooling");
}

std::int64_t permute(std::string_view op, const TensorView& src, std::int64_t channels,
                     std::int64_t height, std::int64_t width, const TensorView& dst) {
  require_storage(op, "src", src);
  require_storage(op, "dst", dst);
  if (channels < 1 || height < 1 || width < 1)
    fail(op,
         "channels, height and width (" + std::to_string(channels) + ", " + std::to_string(height) +
             ", " + std::to_string(width) + ") must be at least 1",
         "pass one image's channels, height and width");
  const std::int64_t image = product(op, "one image", {channels, height, width, 1});
  if (src.numel() % image != 0)
    fail(op,
         "src is " + describe(src) + " (" + std::to_string(src.numel()) +
             " elements), not a whole number of " + std::to_string(channels) + "x" +
             std::to_string(height) + "x" + std::to_string(width) + " images",
         "check channels, height and width");
  require_numel(op, "dst", dst, src.numel());
  require_present(op, "src", src);
  require_present(op, "dst", dst);
  disjoint(op, "dst", dst, "src", src);
  return src.numel() / image;
}

void batchnorm_shape(std::string_view op, const sdk::BatchNormShape& s) {
  if (s.rows < 1 || s.channels < 1)
    fail(op,
         "shape rows = " + std::to_string(s.rows) + ", channels = " + std::to_string(s.channels) +
             " must both be at least 1",
         "rows = N·H·W of the channels-last activations, channels = C");
  if (!(s.eps >= 0.0f))
    fail(op, "eps = " + std::to_string(s.eps) + " must be non-negative", "use eps = 1e-5");
}

namespace {

void bn_data(std::string_view op, std::string_view name, const TensorView& v,
             const sdk::BatchNormShape& s) {
  require_storage(op, name, v);
  require_present(op, name, v);
  const std::int64_t n = product(op, name, {s.rows, s.channels, 1, 1});
  if (v.numel() != n || v.shape.cols() != s.channels)
    fail(op,
         std::string(name) + " is " + describe(v) + " but the shape expects [rows, C] = [" +
             std::to_string(s.rows) + ", " + std::to_string(s.channels) +
             "] (or [N, H, W, C] with N·H·W = rows)",
         "batch norm takes channels-last activations");
}

}  // namespace

void channel_vector(std::string_view op, std::string_view name, const TensorView& v,
                    std::int64_t channels) {
  require_fp32(op, name, v);
  require_numel(op, name, v, channels);
  require_present(op, name, v);
}

void batchnorm_forward(std::string_view op, const sdk::BatchNormShape& s, const TensorView& x,
                       const TensorView& y, const TensorView& gamma, const TensorView& beta) {
  batchnorm_shape(op, s);
  bn_data(op, "x", x, s);
  bn_data(op, "y", y, s);
  same_storage(op, "x", x, "y", y, "batch norm");
  same_or_disjoint(op, "y", y, "x", x);
  if (gamma.empty() != beta.empty())
    fail(op, "gamma and beta must be both given (affine) or both empty (not affine)",
         "pass both parameters or neither");
  if (gamma.empty()) return;
  channel_vector(op, "gamma", gamma, s.channels);
  channel_vector(op, "beta", beta, s.channels);
}

void batchnorm_workspace(std::string_view op, const TensorView& ws, std::size_t bytes) {
  workspace_bytes(op, ws, bytes,
                  "allocate batchnorm_workspace_bytes(shape, dtype) bytes and pass the same "
                  "workspace to the training forward and the backward");
}

bool batchnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& y,
                        const TensorView& gamma, const TensorView& save_mean,
                        const TensorView& save_var, const sdk::BatchNormShape& s,
                        const TensorView& workspace, std::size_t ws_bytes, const TensorView& dx,
                        const TensorView& dgamma, const TensorView& dbeta) {
  constexpr std::string_view op = "batchnorm_backward";
  batchnorm_shape(op, s);
  bn_data(op, "dy", dy, s);
  bn_data(op, "x", x, s);
  bn_data(op, "dx", dx, s);
  same_storage(op, "x", x, "dy", dy, "batch norm");
  same_storage(op, "x", x, "dx", dx, "batch norm");
  same_or_disjoint(op, "dx", dx, "dy", dy);
  same_or_disjoint(op, "dx", dx, "x", x);
  channel_vector(op, "save_mean", save_mean, s.channels);
  channel_vector(op, "save_var", save_var, s.channels);
  const bool affine = !gamma.empty();
  if (affine) channel_vector(op, "gamma", gamma, s.channels);
  if (!dgamma.empty()) channel_vector(op, "dgamma", dgamma, s.channels);
  if (!dbeta.empty()) channel_vector(op, "dbeta", dbeta, s.channels);
  if (!affine && (!dgamma.empty() || !dbeta.empty()))
    fail(op, "dgamma / dbeta were given but gamma is empty (the norm is not affine)",
         "pass gamma for an affine norm, or no dgamma and dbeta");
  if (!s.relu) return false;
  if (!workspace.empty()) {
    batchnorm_workspace(op, workspace, ws_bytes);
    return true;
  }
  if (y.empty())
    fail(op, "the fused ReLU's backward needs the forward's workspace or y",
         "pass the workspace filled by batchnorm_forward_training, or y");
  bn_data(op, "y", y, s);
  same_storage(op, "x", x, "y", y, "batch norm");
  same_or_disjoint(op, "dx", dx, "y", y);
  return false;
}

}  // namespace mixtrain::backend_cuda::layer_checks
