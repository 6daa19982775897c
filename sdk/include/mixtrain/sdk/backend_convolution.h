// ConvolutionFacet: 2-D convolution and pooling over channels-last images, forward and backward,
// and the two permutes between channels-first and channels-last.
//
// Contract
// - A backend offers it as find_facet("convolution") (nullptr: the backend has none).
// - Layout: every image activation is channels-last, x [N, H, W, C] — one layout from the first
//   convolution to the global pooling, so no op reorders activations around itself (oneDNN's
//   nhwc and cuDNN's NHWC, the layout Tensor Cores want). Data arrives channels-first
//   [N, C, H, W] (what files and PyTorch hold); to_channels_last / to_channels_first permute.
// - Weights are PyTorch's layout, w [O, C/groups, KH, KW] fp32 master (or a 16/8-bit working
//   copy of it): checkpoints and exports need no permute. A backend may reorder a weight into
//   its preferred layout internally; it creates such reorders once per geometry and reuses them.
// - Precision, as the GEMMs (backend_gemm.h): operands x, w, dy are fp32, tf32 (fp32 storage
//   rounded to tf32), bf16, fp16 or fp8 (with scale_inv: real value = stored · scale_inv), in any
//   mix; products accumulate in FP32; outputs y and dx are fp32, bf16 or fp16, rounded once.
//   Weight and bias gradients are fp32. A backend without native support for a format computes on
//   the exact FP32 values of the rounded operands.
// - Accumulating writes: dw and dbias are overwritten when `accumulate` is false, added to when
//   true (a parameter gradient's second contribution of a step).
// - supports(op, dtypes) answers without running anything, for the dtypes listed at each op.
// - Shapes are checked against the geometry; a mismatch raises BackendError.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods). 1.1 appended conv2d_backward_data_accumulate, the data
//   gradient added into an fp32 sum; it is refused by default (supports() false, the call a
//   BackendError), and a host asks for it only where the facet is 1.1 or later. 1.2 appended the
//   convolution's workspace from its caller (conv2d_workspace_bytes and the four *_with_workspace
//   calls); by default a backend wants none and the calls run as without it, and a host calls them
//   only where the facet is 1.2 or later.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

// PyTorch's Conv2d arithmetic: OH = (H + 2·pad_h − dilation_h·(KH − 1) − 1) / stride_h + 1.
struct Conv2dGeometry {
  std::int64_t batch = 1, in_channels = 1, height = 1, width = 1;
  std::int64_t out_channels = 1, kernel_h = 1, kernel_w = 1;
  std::int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  std::int64_t dilation_h = 1, dilation_w = 1, groups = 1;
  std::int64_t out_height() const {
    return (height + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h + 1;
  }
  std::int64_t out_width() const {
    return (width + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1;
  }
};

// y [N, OH, OW, O] = conv(x [N, H, W, C], w [O, C/g, KH, KW]) (+ bias fp32 [O]).
// `compute` is fp32, or tf32 to round fp32 operands to tf32 first.
struct Conv2dForwardArgs {
  Conv2dGeometry geometry;
  GemmOperand x, w;  // `transpose` must be false
  TensorView bias;   // fp32 [O] or empty
  TensorView y;
  DType compute = DType::fp32;
};

// dx [N, H, W, C] = the gradient of conv w.r.t. x, from dy [N, OH, OW, O] and w.
struct Conv2dBackwardDataArgs {
  Conv2dGeometry geometry;
  GemmOperand dy, w;
  TensorView dx;
  DType compute = DType::fp32;
};

// dw fp32 [O, C/g, KH, KW] (and dbias fp32 [O] = Σ dy when not empty) from x and dy.
struct Conv2dBackwardWeightsArgs {
  Conv2dGeometry geometry;
  GemmOperand x, dy;
  TensorView dw, dbias;
  bool accumulate = false;
  DType compute = DType::fp32;
};

enum class PoolKind { max, average };

// Pooling over [N, H, W, C]: windows of KH×KW every stride, zero padding `pad` each side (never
// chosen by max; average divides by KH·KW when count_include_pad, else by the window's in-image
// elements — PyTorch's AvgPool2d). Output [N, OH, OW, C] with PyTorch's floor arithmetic.
// A global average pool is KH = H, KW = W, no padding: y [N, 1, 1, C] = [N, C].
struct Pool2dGeometry {
  PoolKind kind = PoolKind::max;
  std::int64_t batch = 1, channels = 1, height = 1, width = 1;
  std::int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool count_include_pad = true;
  std::int64_t out_height() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  std::int64_t out_width() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
};

enum class ConvolutionOp {
  conv2d_forward,           // dtypes {x, w, y}
  conv2d_backward_data,     // dtypes {dy, w, dx}
  conv2d_backward_weights,  // dtypes {x, dy} (dw and dbias are fp32)
  pool2d_forward,           // dtypes {x, y}: fp32, bf16, fp16, the same for both
  pool2d_backward,          // dtypes {dy, dx}: likewise; a backend may also offer dy fp32 with a
                            // bf16 or fp16 dx (supports()): a gradient summed over several
                            // readers, rounded once into dx instead of cast first
  to_channels_last,         // dtypes {src, dst}: fp32, bf16, fp16, either mix (rounds once)
  to_channels_first,        // likewise
  // 1.1
  conv2d_backward_data_accumulate,  // dtypes {dy, w, dx}: dx fp32, or dy's 16-bit dtype (below)
};
MIXTRAIN_SDK_API std::string_view op_name(ConvolutionOp op) noexcept;
constexpr std::uint16_t introduced_in(ConvolutionOp op) noexcept {
  return op == ConvolutionOp::conv2d_backward_data_accumulate ? 1 : 0;
}
MIXTRAIN_SDK_API OpSignature op_signature(ConvolutionOp op) noexcept;

// What a convolution call will be, for conv2d_workspace_bytes (1.2): its op, its geometry, and the
// dtypes and flags of the args it will get.
struct Conv2dWorkspaceQuery {
  // conv2d_forward, conv2d_backward_data, conv2d_backward_data_accumulate or
  // conv2d_backward_weights.
  ConvolutionOp op = ConvolutionOp::conv2d_forward;
  Conv2dGeometry geometry;
  DType a = DType::fp32;        // x (forward, backward weights), dy (backward data)
  DType b = DType::fp32;        // w (forward, backward data), dy (backward weights)
  DType out = DType::fp32;      // y (forward), dx (backward data); ignored for backward weights
  DType compute = DType::fp32;  // fp32, or tf32
  bool bias = false;            // forward: a bias added; backward weights: dbias written
  bool accumulate = false;      // backward weights: dw added to
};

class MIXTRAIN_SDK_API ConvolutionFacet : public Facet {
 public:
  using Op = ConvolutionOp;
  static constexpr FacetVersion kVersion{1, 2};
  static constexpr std::string_view kName = "convolution";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(ConvolutionOp op, std::span<const DType> dtypes) const;

  virtual void conv2d_forward(const Conv2dForwardArgs& args) = 0;
  virtual void conv2d_backward_data(const Conv2dBackwardDataArgs& args) = 0;
  virtual void conv2d_backward_weights(const Conv2dBackwardWeightsArgs& args) = 0;

  // Bytes of the workspace a max pool's forward (training) leaves for its backward (the argmax
  // indices oneDNN keeps; 0 when the backend recomputes them from x and y). The caller allocates
  // it and passes the same memory to both calls.
  virtual std::size_t pool2d_workspace_bytes(const Pool2dGeometry& geometry, DType x) const = 0;
  // y = pool(x). `workspace` (max, training only; empty in evaluation) receives what backward
  // needs. Max follows PyTorch's max_pool2d on special values: a window holding a NaN gives NaN
  // (a dropped NaN would hide a broken forward pass from the loss scaler), and a window whose
  // in-image elements are all -inf gives -inf. Where dy comes from such a window the backward may
  // route it to any of the window's elements (the loss is then NaN).
  virtual void pool2d_forward(const Pool2dGeometry& geometry, TensorView x, TensorView y,
                              TensorView workspace) = 0;
  // dx (overwritten) from dy; max pooling routes each dy to its window's maximum (the first one
  // in row-major window order on ties, as PyTorch), read from `workspace` or from x and y. x and
  // dx share a dtype; dy is theirs, or fp32 where supports(pool2d_backward, {fp32, dx}) says so.
  virtual void pool2d_backward(const Pool2dGeometry& geometry, TensorView dy, TensorView x,
                               TensorView y, TensorView workspace, TensorView dx) = 0;

  // dst [N, H, W, C] = src [N, C, H, W] (to_channels_last) and back (to_channels_first); both
  // views hold N·C·H·W elements. `channels`, `height`, `width` describe one image.
  virtual void to_channels_last(TensorView src, std::int64_t channels, std::int64_t height,
                                std::int64_t width, TensorView dst) = 0;
  virtual void to_channels_first(TensorView src, std::int64_t channels, std::int64_t height,
                                 std::int64_t width, TensorView dst) = 0;

  // --- 1.1 ---------------------------------------------------------------------------------------
  // conv2d_backward_data that adds the data gradient into an fp32 dx instead of overwriting it:
  // dx += (the gradient, accumulated in FP32), added in FP32. A backend adds it unrounded where
  // its library can; where it cannot, it may round it once into the 16-bit dtype of 16-bit
  // operands first (the bits conv2d_backward_data writes there, which the host would otherwise
  // add), never anything coarser; fp32 operands' gradient is never rounded.
  // Why: a tensor read by several ops has one FP32 gradient (a ResNet block's input, read by its
  // first convolution and by the shortcut); without this the convolution writes its contribution
  // apart and the host adds it in a separate pass over the whole tensor.
  // A 16-bit dx of dy's dtype (a 16-bit sum: the host's model.fp32_gradient_sums = false) is a
  // dtype pair a backend may add through supports(), no declaration changed: dx = round(dx + the
  // gradient), the sum in FP32 rounded once into dx (from the gradient rounded once into that
  // dtype first, where the library cannot add it unrounded).
  // dy, w, the geometry and compute are conv2d_backward_data's; dx must be fp32 (or dy's 16-bit
  // dtype) and overlap neither dy nor w (BackendArgumentChecks::conv2d_backward_data_accumulate).
  // Default:
  // BackendError, and supports() false; a backend offers it by overriding both (a facet that
  // forwards supports() to another one forwards this call too).
  virtual void conv2d_backward_data_accumulate(const Conv2dBackwardDataArgs& args);

  // --- 1.2 ---------------------------------------------------------------------------------------
  // The convolution's workspace from its caller. Why: a backend that keeps the largest workspace
  // any call asked for holds it for good, on top of the host's peak (ResNet-50's stem: cuDNN pads
  // the image's 3 channels to 8 in a 103 MB workspace); a host that plans it in its step's memory,
  // live at the op's step only, takes it from bytes that are free then.
  // conv2d_workspace_bytes: the bytes a call of that shape can use from its caller, for operands
  // and outputs at 16-byte-aligned addresses; 0 (the default): none, the backend keeps its own.
  // It may build and cache the backend's plan (a primitive) for the shape; it allocates no
  // scratch. A backend that answers checks the query as it would check the call (BackendError:
  // the geometry, the op, the dtypes); the default answers 0 to any.
  virtual std::size_t conv2d_workspace_bytes(const Conv2dWorkspaceQuery& query) const;
  // The four calls with a workspace: the same results, bit for bit, as without it. `workspace`
  // (its bytes count, not its dtype) is the backend's to overwrite during the call; it holds
  // nothing before or after, and must overlap none of the call's operands and outputs
  // (BackendArgumentChecks::conv2d_workspace). Empty or smaller than the call wants: the backend
  // uses its own, as without it. Default: the call without it.
  virtual void conv2d_forward_with_workspace(const Conv2dForwardArgs& args, TensorView workspace);
  virtual void conv2d_backward_data_with_workspace(const Conv2dBackwardDataArgs& args,
                                                   TensorView workspace);
  virtual void conv2d_backward_data_accumulate_with_workspace(const Conv2dBackwardDataArgs& args,
                                                              TensorView workspace);
  virtual void conv2d_backward_weights_with_workspace(const Conv2dBackwardWeightsArgs& args,
                                                      TensorView workspace);

 protected:
  ~ConvolutionFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
