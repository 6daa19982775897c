// BackendArgumentChecks of the convolution facet (convolutions, pooling, the image permutes) and
// of batch norm (contract in backend_argument_checks.h).
#include <array>
#include <cstdint>
#include <string>

#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"

namespace mixtrain::sdk {

namespace {

using Dims = std::array<std::int64_t, 4>;

// "[8, 16, 12, 64]"
std::string dims_text(const Dims& d) {
  return "[" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) +
         ", " + std::to_string(d[3]) + "]";
}

// "3x3"
std::string pair_text(std::int64_t a, std::int64_t b) {
  return std::to_string(a) + "x" + std::to_string(b);
}

constexpr const char* kImageHint =
    "image activations are channels-last [N, H, W, C] (permute channels-first data with "
    "to_channels_last); check the geometry";
constexpr const char* kWeightHint =
    "weights are PyTorch's layout [O, C/groups, KH, KW]; check the geometry";
constexpr std::string_view kImage = "[N, H, W, C]";
constexpr std::string_view kOutImage = "[N, OH, OW, O]";
constexpr std::string_view kPooledImage = "[N, OH, OW, C]";
constexpr std::string_view kWeights = "[O, C/groups, KH, KW]";

// A tensor of the geometry: exactly `dims` when the view is 4-D, else the same element count.
void tensor_of(const BackendArgumentChecks& c, std::string_view op, std::string_view name,
               const TensorView& v, const Dims& dims, std::string_view layout, const char* hint) {
  c.require_present(op, name, v);
  const std::int64_t n = c.checked_product(op, name, {dims[0], dims[1], dims[2], dims[3]});
  bool ok = v.numel() == n;
  if (ok && v.shape.rank == 4)
    for (int i = 0; i < 4; ++i) ok = ok && v.shape[i] == dims[static_cast<std::size_t>(i)];
  if (!ok)
    c.fail(op,
           std::string(name) + " is " + describe(v) + " but the geometry expects " +
               std::string(layout) + " = " + dims_text(dims) + " (" + std::to_string(n) +
               " elements)",
           hint);
}

Dims x_dims(const Conv2dGeometry& g) {
  return {g.batch, g.height, g.width, g.in_channels};
}
Dims y_dims(const Conv2dGeometry& g) {
  return {g.batch, g.out_height(), g.out_width(), g.out_channels};
}
Dims w_dims(const Conv2dGeometry& g) {
  return {g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
}
Dims in_dims(const Pool2dGeometry& g) {
  return {g.batch, g.height, g.width, g.channels};
}
Dims out_dims(const Pool2dGeometry& g) {
  return {g.batch, g.out_height(), g.out_width(), g.channels};
}

// Convolution operands come in their own layout, never transposed.
void untransposed(const BackendArgumentChecks& c, std::string_view op, std::string_view name,
                  const GemmOperand& o) {
  if (o.transpose)
    c.fail(op,
           std::string(name) + " has transpose = true; convolution operands are never transposed",
           "pass the tensor in its own layout with transpose = false");
}

// An optional per-output-channel fp32 bias (or its gradient).
void optional_bias(const BackendArgumentChecks& c, std::string_view op, std::string_view name,
                   const TensorView& v, std::int64_t channels) {
  if (v.empty()) return;
  c.require_fp32(op, name, v);
  c.require_numel(op, name, v, channels);
}

}  // namespace

void BackendArgumentChecks::conv2d_geometry(std::string_view op, const Conv2dGeometry& g) const {
  const std::string hint = "check the layer's Conv2dGeometry";
  auto at_least = [&](const char* name, std::int64_t v, std::int64_t lo) {
    require_at_least(op, std::string("geometry.") + name, v, lo, hint);
  };
  at_least("batch", g.batch, 1);
  at_least("in_channels", g.in_channels, 1);
  at_least("height", g.height, 1);
  at_least("width", g.width, 1);
  at_least("out_channels", g.out_channels, 1);
  at_least("kernel_h", g.kernel_h, 1);
  at_least("kernel_w", g.kernel_w, 1);
  at_least("stride_h", g.stride_h, 1);
  at_least("stride_w", g.stride_w, 1);
  at_least("dilation_h", g.dilation_h, 1);
  at_least("dilation_w", g.dilation_w, 1);
  at_least("groups", g.groups, 1);
  at_least("pad_h", g.pad_h, 0);
  at_least("pad_w", g.pad_w, 0);
  if (g.in_channels % g.groups != 0 || g.out_channels % g.groups != 0)
    fail(op,
         "groups = " + std::to_string(g.groups) +
             " must divide in_channels = " + std::to_string(g.in_channels) +
             " and out_channels = " + std::to_string(g.out_channels),
         hint);
  if (g.out_height() < 1 || g.out_width() < 1)
    fail(op,
         "the kernel " + pair_text(g.kernel_h, g.kernel_w) + " (dilation " +
             pair_text(g.dilation_h, g.dilation_w) + ") does not fit in the " +
             pair_text(g.height, g.width) + " image padded by " + pair_text(g.pad_h, g.pad_w),
         "use a smaller kernel or dilation, or more padding");
}

void BackendArgumentChecks::conv2d_forward(const Conv2dForwardArgs& a) const {
  constexpr std::string_view op = "conv2d_forward";
  const Conv2dGeometry& g = a.geometry;
  conv2d_geometry(op, g);
  untransposed(*this, op, "x", a.x);
  untransposed(*this, op, "w", a.w);
  tensor_of(*this, op, "x", a.x.view, x_dims(g), kImage, kImageHint);
  tensor_of(*this, op, "w", a.w.view, w_dims(g), kWeights, kWeightHint);
  tensor_of(*this, op, "y", a.y, y_dims(g), kOutImage, kImageHint);
  optional_bias(*this, op, "bias", a.bias, g.out_channels);
  require_disjoint(op, "y", a.y, "x", a.x.view);
  require_disjoint(op, "y", a.y, "w", a.w.view);
}

namespace {

void backward_data_args(const BackendArgumentChecks& c, std::string_view op,
                        const Conv2dBackwardDataArgs& a) {
  const Conv2dGeometry& g = a.geometry;
  c.conv2d_geometry(op, g);
  untransposed(c, op, "dy", a.dy);
  untransposed(c, op, "w", a.w);
  tensor_of(c, op, "dy", a.dy.view, y_dims(g), kOutImage, kImageHint);
  tensor_of(c, op, "w", a.w.view, w_dims(g), kWeights, kWeightHint);
  tensor_of(c, op, "dx", a.dx, x_dims(g), kImage, kImageHint);
  c.require_disjoint(op, "dx", a.dx, "dy", a.dy.view);
  c.require_disjoint(op, "dx", a.dx, "w", a.w.view);
}

}  // namespace

void BackendArgumentChecks::conv2d_backward_data(const Conv2dBackwardDataArgs& a) const {
  backward_data_args(*this, "conv2d_backward_data", a);
}

void BackendArgumentChecks::conv2d_backward_data_accumulate(const Conv2dBackwardDataArgs& a) const {
  constexpr std::string_view op = "conv2d_backward_data_accumulate";
  // An fp32 sum, or a 16-bit one of dy's dtype (backend_convolution.h).
  const bool sixteen =
      (a.dx.dtype == DType::bf16 || a.dx.dtype == DType::fp16) && a.dx.dtype == a.dy.view.dtype;
  if (!sixteen) require_fp32(op, "dx", a.dx);
  backward_data_args(*this, op, a);
}

void BackendArgumentChecks::conv2d_backward_weights(const Conv2dBackwardWeightsArgs& a) const {
  constexpr std::string_view op = "conv2d_backward_weights";
  const Conv2dGeometry& g = a.geometry;
  conv2d_geometry(op, g);
  untransposed(*this, op, "x", a.x);
  untransposed(*this, op, "dy", a.dy);
  tensor_of(*this, op, "x", a.x.view, x_dims(g), kImage, kImageHint);
  tensor_of(*this, op, "dy", a.dy.view, y_dims(g), kOutImage, kImageHint);
  require_fp32(op, "dw", a.dw);
  tensor_of(*this, op, "dw", a.dw, w_dims(g), kWeights, kWeightHint);
  optional_bias(*this, op, "dbias", a.dbias, g.out_channels);
  require_disjoint(op, "dw", a.dw, "x", a.x.view);
  require_disjoint(op, "dw", a.dw, "dy", a.dy.view);
}

void BackendArgumentChecks::conv2d_workspace(std::string_view op, const TensorView& workspace,
                                             const Conv2dForwardArgs& a) const {
  require_disjoint(op, "workspace", workspace, "x", a.x.view);
  require_disjoint(op, "workspace", workspace, "w", a.w.view);
  require_disjoint(op, "workspace", workspace, "bias", a.bias);
  require_disjoint(op, "workspace", workspace, "y", a.y);
}

void BackendArgumentChecks::conv2d_workspace(std::string_view op, const TensorView& workspace,
                                             const Conv2dBackwardDataArgs& a) const {
  require_disjoint(op, "workspace", workspace, "dy", a.dy.view);
  require_disjoint(op, "workspace", workspace, "w", a.w.view);
  require_disjoint(op, "workspace", workspace, "dx", a.dx);
}

void BackendArgumentChecks::conv2d_workspace(std::string_view op, const TensorView& workspace,
                                             const Conv2dBackwardWeightsArgs& a) const {
  require_disjoint(op, "workspace", workspace, "x", a.x.view);
  require_disjoint(op, "workspace", workspace, "dy", a.dy.view);
  require_disjoint(op, "workspace", workspace, "dw", a.dw);
  require_disjoint(op, "workspace", workspace, "dbias", a.dbias);
}

void BackendArgumentChecks::conv2d_workspace_query(const Conv2dWorkspaceQuery& q) const {
  constexpr std::string_view op = "conv2d_workspace_bytes";
  switch (q.op) {
    case ConvolutionOp::conv2d_forward:
    case ConvolutionOp::conv2d_backward_data:
    case ConvolutionOp::conv2d_backward_data_accumulate:
    case ConvolutionOp::conv2d_backward_weights:
      break;
    default:
      fail(op, "query.op is " + std::string(op_name(q.op)) + ", which takes no workspace",
           "ask for conv2d_forward, conv2d_backward_data, conv2d_backward_data_accumulate or "
           "conv2d_backward_weights");
  }
  conv2d_geometry(op, q.geometry);
  if (q.compute != DType::fp32 && q.compute != DType::tf32)
    fail(op, "query.compute is " + std::string(dtype_name(q.compute)) + ", not fp32 or tf32",
         "ask with the compute the call will pass");
  // The call's one dtype rule of the shared checks: an accumulating dx is an fp32 sum or a 16-bit
  // one of dy's dtype (conv2d_backward_data_accumulate).
  if (q.op == ConvolutionOp::conv2d_backward_data_accumulate) {
    const bool sixteen = (q.out == DType::bf16 || q.out == DType::fp16) && q.out == q.a;
    if (!sixteen && !is_fp32_storage(q.out))
      fail(op,
           "query.out is " + std::string(dtype_name(q.out)) + " with dy " +
               std::string(dtype_name(q.a)) +
               "; an accumulating data gradient adds into fp32 or into dy's 16-bit dtype",
           "ask with the dx the call will pass");
  }
}

void BackendArgumentChecks::pool2d_geometry(std::string_view op, const Pool2dGeometry& g) const {
  const std::string hint = "check the layer's Pool2dGeometry";
  auto at_least = [&](const char* name, std::int64_t v, std::int64_t lo) {
    require_at_least(op, std::string("geometry.") + name, v, lo, hint);
  };
  at_least("batch", g.batch, 1);
  at_least("channels", g.channels, 1);
  at_least("height", g.height, 1);
  at_least("width", g.width, 1);
  at_least("kernel_h", g.kernel_h, 1);
  at_least("kernel_w", g.kernel_w, 1);
  at_least("stride_h", g.stride_h, 1);
  at_least("stride_w", g.stride_w, 1);
  at_least("pad_h", g.pad_h, 0);
  at_least("pad_w", g.pad_w, 0);
  if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w)
    fail(op,
         "padding " + pair_text(g.pad_h, g.pad_w) + " is more than half the kernel " +
             pair_text(g.kernel_h, g.kernel_w),
         "use at most kernel/2 padding (PyTorch's rule: every window overlaps the image)");
  if (g.out_height() < 1 || g.out_width() < 1)
    fail(op,
         "the kernel " + pair_text(g.kernel_h, g.kernel_w) + " does not fit in the " +
             pair_text(g.height, g.width) + " image padded by " + pair_text(g.pad_h, g.pad_w),
         "use a smaller kernel or more padding");
}

bool BackendArgumentChecks::pool2d_workspace_args(const Pool2dGeometry& g, DType x) const {
  constexpr std::string_view op = "pool2d_workspace_bytes";
  pool2d_geometry(op, g);
  if (g.kind != PoolKind::max) return false;
  if (!is_storage_float(x))
    fail(op, "x dtype " + std::string(dtype_name(x)) + " is not supported",
         "pool fp32, bf16 or fp16 activations");
  return true;
}

void BackendArgumentChecks::pool2d_forward(const Pool2dGeometry& g, const TensorView& x,
                                           const TensorView& y) const {
  constexpr std::string_view op = "pool2d_forward";
  pool2d_geometry(op, g);
  require_storage(op, "x", x);
  require_storage(op, "y", y);
  tensor_of(*this, op, "x", x, in_dims(g), kImage, kImageHint);
  tensor_of(*this, op, "y", y, out_dims(g), kPooledImage, kImageHint);
  require_same_storage(op, "x", x, "y", y, "pooling keeps one dtype");
  require_disjoint(op, "y", y, "x", x);
}

void BackendArgumentChecks::pool2d_backward(const Pool2dGeometry& g, const TensorView& dy,
                                            const TensorView& x, const TensorView& workspace,
                                            const TensorView& dx) const {
  constexpr std::string_view op = "pool2d_backward";
  pool2d_geometry(op, g);
  require_storage(op, "dy", dy);
  require_storage(op, "dx", dx);
  tensor_of(*this, op, "dy", dy, out_dims(g), kPooledImage, kImageHint);
  tensor_of(*this, op, "dx", dx, in_dims(g), kImage, kImageHint);
  // An fp32 dy into a 16-bit dx is the one mix (backend_convolution.h): where the backend's
  // supports() offers it.
  if (!(dy.dtype == DType::fp32 && (dx.dtype == DType::bf16 || dx.dtype == DType::fp16)))
    require_same_storage(op, "dy", dy, "dx", dx, "pooling keeps one dtype");
  require_disjoint(op, "dx", dx, "dy", dy);
  if (g.kind != PoolKind::max || !workspace.empty()) return;
  if (x.empty())
    fail(op, "max pooling's backward needs the forward's workspace or x",
         "pass the workspace filled by pool2d_forward, or x");
  require_storage(op, "x", x);
  tensor_of(*this, op, "x", x, in_dims(g), kImage, kImageHint);
  require_same_storage(op, "x", x, "dx", dx, "pooling keeps one dtype");
}

void BackendArgumentChecks::pool2d_workspace(std::string_view op, const TensorView& workspace,
                                             std::size_t bytes) const {
  require_bytes(op, "workspace", workspace, bytes,
                "allocate pool2d_workspace_bytes(geometry, dtype) bytes and pass the same "
                "workspace to the forward and the backward");
}

std::int64_t BackendArgumentChecks::channel_permute(std::string_view op, const TensorView& src,
                                                    std::int64_t channels, std::int64_t height,
                                                    std::int64_t width,
                                                    const TensorView& dst) const {
  require_storage(op, "src", src);
  require_storage(op, "dst", dst);
  if (channels < 1 || height < 1 || width < 1)
    fail(op,
         "channels, height and width (" + std::to_string(channels) + ", " + std::to_string(height) +
             ", " + std::to_string(width) + ") must be at least 1",
         "pass one image's channels, height and width");
  const std::int64_t image = checked_product(op, "one image", {channels, height, width});
  if (src.numel() % image != 0)
    fail(op,
         "src is " + describe(src) + " (" + std::to_string(src.numel()) +
             " elements), not a whole number of " + pair_text(channels, height) + "x" +
             std::to_string(width) + " images",
         "check channels, height and width");
  require_numel(op, "dst", dst, src.numel());
  if (overlaps(src, dst)) fail(op, "dst overlaps src", "permute into a separate buffer");
  return src.numel() / image;
}

void BackendArgumentChecks::batchnorm_shape(std::string_view op, const BatchNormShape& s) const {
  if (s.rows < 1 || s.channels < 1)
    fail(op,
         "shape rows = " + std::to_string(s.rows) + ", channels = " + std::to_string(s.channels) +
             " must both be at least 1",
         "rows = N·H·W of the channels-last activations, channels = C");
  if (!(s.eps >= 0.0f))
    fail(op, "eps = " + std::to_string(s.eps) + " must be non-negative", "use eps = 1e-5");
}

namespace {

// Activations (or their gradients) of the shape: storage floats of [rows, C], leading dimensions
// folded.
void batchnorm_data(const BackendArgumentChecks& c, std::string_view op, std::string_view name,
                    const TensorView& v, const BatchNormShape& s) {
  c.require_storage(op, name, v);
  if (v.numel() != c.checked_product(op, name, {s.rows, s.channels}) ||
      v.shape.cols() != s.channels)
    c.fail(op,
           std::string(name) + " is " + describe(v) + " but the shape expects [rows, C] = [" +
               std::to_string(s.rows) + ", " + std::to_string(s.channels) +
               "] (or [N, H, W, C] with N·H·W = rows)",
           "batch norm takes channels-last activations");
}

constexpr std::string_view kOneDtype = "batch norm keeps one activation dtype";

// A per-channel fp32 [channels] vector (statistics, affine parameters and their gradients).
void channel_vector(const BackendArgumentChecks& c, std::string_view op, std::string_view name,
                    const TensorView& v, std::int64_t channels) {
  c.require_fp32(op, name, v);
  c.require_numel(op, name, v, channels);
}

// What both forwards check: the shape, x and y (one dtype, the same view or disjoint), and the
// affine parameters.
void batchnorm_forward(const BackendArgumentChecks& c, std::string_view op, const BatchNormShape& s,
                       const TensorView& x, const TensorView& y, const TensorView& gamma,
                       const TensorView& beta) {
  c.batchnorm_shape(op, s);
  batchnorm_data(c, op, "x", x, s);
  batchnorm_data(c, op, "y", y, s);
  c.require_same_storage(op, "x", x, "y", y, kOneDtype);
  c.require_same_or_disjoint(op, "x", x, "y", y);
  if (gamma.empty() != beta.empty())
    c.fail(op, "gamma and beta must be both given (affine) or both empty (not affine)",
           "pass both parameters or neither");
  if (gamma.empty()) return;
  channel_vector(c, op, "gamma", gamma, s.channels);
  channel_vector(c, op, "beta", beta, s.channels);
}

void batchnorm_workspace(const BackendArgumentChecks& c, std::string_view op,
                         const TensorView& workspace, std::size_t bytes) {
  c.require_bytes(op, "workspace", workspace, bytes,
                  "allocate batchnorm_workspace_bytes(shape, dtype) bytes and pass the same "
                  "workspace to the training forward and the backward");
}

}  // namespace

void BackendArgumentChecks::batchnorm_workspace_args(const BatchNormShape& s, DType x) const {
  constexpr std::string_view op = "batchnorm_workspace_bytes";
  batchnorm_shape(op, s);
  if (!is_storage_float(x))
    fail(op, "x dtype " + std::string(dtype_name(x)) + " is not supported",
         "batch norm takes fp32, bf16 or fp16 activations");
}

bool BackendArgumentChecks::batchnorm_forward_training(
    const TensorView& x, const TensorView& gamma, const TensorView& beta, const BatchNormShape& s,
    const TensorView& y, const TensorView& save_mean, const TensorView& save_var,
    const TensorView& running_mean, const TensorView& running_var, const TensorView& workspace,
    std::size_t workspace_bytes) const {
  constexpr std::string_view op = "batchnorm_forward_training";
  batchnorm_forward(*this, op, s, x, y, gamma, beta);
  const std::int64_t c = s.channels;
  channel_vector(*this, op, "save_mean", save_mean, c);
  channel_vector(*this, op, "save_var", save_var, c);
  if (!running_mean.empty()) channel_vector(*this, op, "running_mean", running_mean, c);
  if (!running_var.empty()) channel_vector(*this, op, "running_var", running_var, c);
  const bool keep = s.relu && !workspace.empty();
  if (keep) batchnorm_workspace(*this, op, workspace, workspace_bytes);
  if (s.rows < 2)
    fail(op, "training needs more than one value per channel (rows = 1)",
         "use a batch of at least two, or the inference forward");
  return keep;
}

void BackendArgumentChecks::batchnorm_forward_inference(
    const TensorView& x, const TensorView& gamma, const TensorView& beta,
    const TensorView& running_mean, const TensorView& running_var, const BatchNormShape& s,
    const TensorView& y) const {
  constexpr std::string_view op = "batchnorm_forward_inference";
  batchnorm_forward(*this, op, s, x, y, gamma, beta);
  channel_vector(*this, op, "running_mean", running_mean, s.channels);
  channel_vector(*this, op, "running_var", running_var, s.channels);
}

void BackendArgumentChecks::batchnorm_add_forward(const BatchNormAddArgs& a) const {
  constexpr std::string_view op = "batchnorm_add_forward";
  const BatchNormShape& s = a.shape;
  batchnorm_forward(*this, op, s, a.x, a.y, a.gamma, a.beta);
  if (!a.x.empty() && a.x.data == a.y.data)
    fail(op, "y is x", "write the sum to its own tensor or into the residual; x is read twice");
  batchnorm_data(*this, op, "residual", a.residual, s);
  require_same_storage(op, "residual", a.residual, "x", a.x, kOneDtype);
  require_same_or_disjoint(op, "residual", a.residual, "y", a.y);
  require_disjoint(op, "residual", a.residual, "x", a.x);
  const std::int64_t c = s.channels;
  if (!a.training) {
    channel_vector(*this, op, "running_mean", a.running_mean, c);
    channel_vector(*this, op, "running_var", a.running_var, c);
    return;
  }
  channel_vector(*this, op, "save_mean", a.save_mean, c);
  channel_vector(*this, op, "save_var", a.save_var, c);
  if (!a.running_mean.empty()) channel_vector(*this, op, "running_mean", a.running_mean, c);
  if (!a.running_var.empty()) channel_vector(*this, op, "running_var", a.running_var, c);
  if (!(a.momentum >= 0.0f && a.momentum <= 1.0f))
    fail(op, "momentum = " + std::to_string(a.momentum) + " is outside [0, 1]",
         "pass the running statistics' step, PyTorch's BatchNorm2d momentum (0.1 by default)");
  if (s.rows < 2)
    fail(op, "training needs more than one value per channel (rows = 1)",
         "use a batch of at least two, or training = false");
}

void BackendArgumentChecks::batchnorm_statistics(const TensorView& x, const BatchNormShape& s,
                                                 const TensorView& mean,
                                                 const TensorView& var) const {
  constexpr std::string_view op = "batchnorm_statistics";
  batchnorm_shape(op, s);
  batchnorm_data(*this, op, "x", x, s);
  channel_vector(*this, op, "mean", mean, s.channels);
  channel_vector(*this, op, "var", var, s.channels);
  if (overlaps(mean, var)) fail(op, "mean overlaps var", "pass two separate [C] vectors");
}

namespace {

// What both backward split ops check of dy, x, y (with the fused ReLU) and the statistics.
void batchnorm_split_inputs(const BackendArgumentChecks& c, std::string_view op,
                            const BatchNormShape& s, const TensorView& dy, const TensorView& x,
                            const TensorView& y, const TensorView& mean, const TensorView& var) {
  c.batchnorm_shape(op, s);
  batchnorm_data(c, op, "dy", dy, s);
  batchnorm_data(c, op, "x", x, s);
  c.require_same_storage(op, "x", x, "dy", dy, kOneDtype);
  if (s.relu) {
    if (y.empty())
      c.fail(op, "the fused ReLU's backward needs y (its mask)", "pass the forward's output y");
    batchnorm_data(c, op, "y", y, s);
    c.require_same_storage(op, "x", x, "y", y, kOneDtype);
  }
  channel_vector(c, op, "mean", mean, s.channels);
  channel_vector(c, op, "var", var, s.channels);
}

}  // namespace

void BackendArgumentChecks::batchnorm_backward_reduce(const TensorView& dy, const TensorView& x,
                                                      const TensorView& y, const TensorView& mean,
                                                      const TensorView& var,
                                                      const BatchNormShape& s,
                                                      const TensorView& sum_dy,
                                                      const TensorView& sum_dy_xhat) const {
  constexpr std::string_view op = "batchnorm_backward_reduce";
  batchnorm_split_inputs(*this, op, s, dy, x, y, mean, var);
  channel_vector(*this, op, "sum_dy", sum_dy, s.channels);
  channel_vector(*this, op, "sum_dy_xhat", sum_dy_xhat, s.channels);
  for (const TensorView* read : {&mean, &var, &sum_dy})
    if (overlaps(*read, sum_dy_xhat) || (read != &sum_dy && overlaps(*read, sum_dy)))
      fail(op, "sum_dy / sum_dy_xhat overlap each other or the statistics",
           "pass separate [C] vectors for the sums");
}

void BackendArgumentChecks::batchnorm_backward_elementwise(
    const TensorView& dy, const TensorView& x, const TensorView& y, const TensorView& gamma,
    const TensorView& mean, const TensorView& var, const TensorView& mean_dy,
    const TensorView& mean_dy_xhat, const BatchNormShape& s, const TensorView& dx) const {
  constexpr std::string_view op = "batchnorm_backward_elementwise";
  batchnorm_split_inputs(*this, op, s, dy, x, y, mean, var);
  batchnorm_data(*this, op, "dx", dx, s);
  require_same_storage(op, "x", x, "dx", dx, kOneDtype);
  require_same_or_disjoint(op, "dy", dy, "dx", dx);
  require_same_or_disjoint(op, "x", x, "dx", dx);
  if (s.relu) require_same_or_disjoint(op, "y", y, "dx", dx);
  if (!gamma.empty()) channel_vector(*this, op, "gamma", gamma, s.channels);
  channel_vector(*this, op, "mean_dy", mean_dy, s.channels);
  channel_vector(*this, op, "mean_dy_xhat", mean_dy_xhat, s.channels);
}

bool BackendArgumentChecks::batchnorm_backward(
    const TensorView& dy, const TensorView& x, const TensorView& y, const TensorView& gamma,
    const TensorView& save_mean, const TensorView& save_var, const BatchNormShape& s,
    const TensorView& workspace, std::size_t workspace_bytes, const TensorView& dx,
    const TensorView& dgamma, const TensorView& dbeta) const {
  constexpr std::string_view op = "batchnorm_backward";
  batchnorm_shape(op, s);
  batchnorm_data(*this, op, "dy", dy, s);
  batchnorm_data(*this, op, "x", x, s);
  batchnorm_data(*this, op, "dx", dx, s);
  require_same_storage(op, "x", x, "dy", dy, kOneDtype);
  require_same_storage(op, "x", x, "dx", dx, kOneDtype);
  require_same_or_disjoint(op, "dy", dy, "dx", dx);
  require_same_or_disjoint(op, "x", x, "dx", dx);
  const std::int64_t c = s.channels;
  channel_vector(*this, op, "save_mean", save_mean, c);
  channel_vector(*this, op, "save_var", save_var, c);
  const bool affine = !gamma.empty();
  if (affine) channel_vector(*this, op, "gamma", gamma, c);
  if (!dgamma.empty()) channel_vector(*this, op, "dgamma", dgamma, c);
  if (!dbeta.empty()) channel_vector(*this, op, "dbeta", dbeta, c);
  if (!affine && (!dgamma.empty() || !dbeta.empty()))
    fail(op, "dgamma / dbeta were given but gamma is empty (the norm is not affine)",
         "pass gamma for an affine norm, or no dgamma and dbeta");
  if (!s.relu) return false;
  if (!workspace.empty()) {
    batchnorm_workspace(*this, op, workspace, workspace_bytes);
    return true;
  }
  if (y.empty())
    fail(op, "the fused ReLU's backward needs the forward's workspace or y",
         "pass the workspace filled by batchnorm_forward_training, or y");
  batchnorm_data(*this, op, "y", y, s);
  require_same_storage(op, "x", x, "y", y, kOneDtype);
  require_same_or_disjoint(op, "y", y, "dx", dx);
  return false;
}

}  // namespace mixtrain::sdk
