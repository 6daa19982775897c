// Checks of DeviceBackend arguments against the contract in device_backend.h, shared by every
// backend so that the same mistake gets the same message everywhere.
//
// Contract: every check throws sdk::BackendError whose message starts with "<backend>.<op>: "
// (e.g. "backend_cpu.gemm: ") and names the argument, its dtype and shape, with a hint. Checks
// are about shapes, geometry, layouts, overlaps and presence, and the dtypes the SDK's contract
// fixes for every backend (storage floats for data, fp32 for statistics, gradients of weights and
// biases, int32 ids); which further dtypes an op supports (fp8 operands, a compute type), and a
// backend's own limits (what one kernel launch covers), stay each backend's own decision. What
// only the data can show (the ids' values) is the backend's to check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"

namespace mixtrain::sdk {

// "bf16 [512, 1024]"
std::string describe(const TensorView& v);

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
bool overlaps(const TensorView& a, const TensorView& b);

struct ByteImages;
struct HeadLayout;
struct SoftmaxShape;
struct Conv2dGeometry;
struct Conv2dWorkspaceQuery;
struct Conv2dForwardArgs;
struct Conv2dBackwardDataArgs;
struct Conv2dBackwardWeightsArgs;
struct Pool2dGeometry;
struct BatchNormShape;
struct BatchNormAddArgs;
struct BlockScaledWeight;

class BackendArgumentChecks {
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
  // `value` (the argument `name`) is at least `lo`.
  void require_at_least(std::string_view op, std::string_view name, std::int64_t value,
                        std::int64_t lo, const std::string& hint) const;
  // `v` (the argument `name`, any dtype) holds at least `bytes` bytes, with data when bytes > 0.
  void require_bytes(std::string_view op, std::string_view name, const TensorView& v,
                     std::size_t bytes, const std::string& hint) const;
  // a and b are the same tensor (in place: same data, dtype and numel) or do not overlap.
  void require_same_or_disjoint(std::string_view op, std::string_view a_name, const TensorView& a,
                                std::string_view b_name, const TensorView& b) const;
  // The output `out` does not overlap the input `in`.
  void require_disjoint(std::string_view op, std::string_view out_name, const TensorView& out,
                        std::string_view in_name, const TensorView& in) const;
  // a and b have one storage dtype (fp32 and tf32 count as one); `rule` ends the message
  // ("pooling keeps one dtype").
  void require_same_storage(std::string_view op, std::string_view a_name, const TensorView& a,
                            std::string_view b_name, const TensorView& b,
                            std::string_view rule) const;
  // The product of `dims`, or a failure naming `what` when it does not fit in int64.
  std::int64_t checked_product(std::string_view op, std::string_view what,
                               std::initializer_list<std::int64_t> dims) const;

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
  // gemm_gradient's arguments (gemm facet 1.5): the GEMM as gemm_shape() checks it, with no bias,
  // forward activation or its pre_activation; with has_activation_grad, activation gelu and a
  // storage-float pre_activation [m, n] that does not overlap C; c_column_sums fp32 [n], a_row_sums fp32 [m] with A transposed and 16/32-bit, neither
  // overlapping C. Returns the shape.
  GemmShape gemm_gradient_shape(const GemmGradientArgs& args) const;

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
  // layernorm_backward_accumulate's (layer norm 1.1): as layernorm_backward_shape's, with dx fp32
  // and overlapping neither dy nor x.
  RowsCols layernorm_backward_accumulate_shape(const TensorView& dy, const TensorView& x,
                                               const TensorView& gamma, const TensorView& mean,
                                               const TensorView& rstd, const TensorView& dx,
                                               const TensorView& dgamma,
                                               const TensorView& dbeta) const;
  // layernorm_add_forward's (layer norm 1.2): layernorm_forward_shape's for x = sum; a and b
  // storage of the sum's size, each either apart from the sum or the sum itself (same data and
  // dtype); y apart from a, b and the sum.
  RowsCols layernorm_add_forward_shape(const LayerNormAddArgs& args) const;

  // softmax_cross_entropy's arguments: logits storage [rows, classes] (both > 0), labels int32
  // [rows], label_smoothing in [0, 1], loss fp32 [1], correct (optional) int32 [1], dlogits
  // (optional) storage like logits. Returns {rows, classes}.
  RowsCols softmax_cross_entropy_shape(const TensorView& logits, const TensorView& labels,
                                       float label_smoothing, const TensorView& loss,
                                       const TensorView& correct, const TensorView& dlogits) const;

  // bias_grad's arguments: dy storage [rows, n], dbias fp32 [n]. Returns {rows, n}.
  RowsCols bias_grad_shape(const TensorView& dy, const TensorView& dbias) const;

  // copy's arguments: both present, the same element count and dtype (fp32 and tf32 share
  // storage, so they may be copied into each other), one tensor or disjoint.
  void copy_args(const TensorView& dst, const TensorView& src) const;

  // cast's arguments: both present, each a storage float or fp8, the same element count; dst is
  // src itself (same address and element size: each element read before it is written) or apart
  // from it; an amax (when given) fp32 [1], apart from both.
  void cast_args(const TensorView& src, const TensorView& dst, const CastArgs& args) const;

  // ActivationFacet (backend_activation.h): activation_forward's x and y, storage floats of one
  // numel, y x itself or apart from it; activation_backward's x, dy and dx the same, dx dy or x
  // itself or apart from both; axpy's x a storage float and y fp32 of its numel, y x itself or
  // apart from it. A partial overlap would race on a device (one thread writes what another
  // reads).
  void activation_args(const TensorView& x, const TensorView& y) const;
  void activation_grad_args(const TensorView& x, const TensorView& dy, const TensorView& dx) const;
  void axpy_args(const TensorView& x, const TensorView& y) const;
  // cast_transpose's arguments (gemm facet 1.6): src fp32, bf16 or fp16, [rows, cols] with its
  // leading dims folded; out [rows, cols] and out_transposed [cols, rows] (by shape, not only
  // numel), at least one present, each fp8 and of one dtype; neither overlapping src, the other
  // or the amax (fp32 [1] when given). Returns {rows, cols}.
  RowsCols cast_transpose_shape(const CastTransposeArgs& args) const;
  // cast_transpose_gradient's (gemm facet 1.7): `cast` as cast_transpose_shape checks it; with
  // has_activation_grad, gelu and a present pre_activation of src's dtype and shape ([rows, cols]
  // as folded) that overlaps no output; column_sums (when given) fp32 [cols], apart from src,
  // pre_activation, the outputs and the amax. Returns {rows, cols}.
  RowsCols cast_transpose_gradient_shape(const CastTransposeGradientArgs& args) const;

  // A foreach op's lists: each of `others` as long as `self`; every tensor fp32 and present; the
  // i-th tensors of all lists of equal numel; the self tensors apart from each other (a device
  // updates them all at once: a tensor listed twice, or two that overlap, would race), and each
  // other[i] self[i] itself or apart from it.
  void foreach_lists(std::string_view op, std::span<const TensorView> self,
                     std::initializer_list<std::span<const TensorView>> others = {}) const;

  // --- Facets (backend_residual.h, backend_image_input.h, backend_attention.h,
  // backend_embedding.h, backend_dropout.h)

  // ResidualFacet::add: two or more inputs, each a storage float of y's numel, each y itself or
  // disjoint from it; y a storage float. Returns y's numel.
  std::int64_t residual_add(std::span<const TensorView> xs, const TensorView& y) const;
  // add_backward: dy storage; y storage of dy's numel when `relu`; dxs not empty, each empty or a
  // storage float of dy's numel, dy itself (same view) or disjoint from dy, y and the others.
  // Returns the numel.
  std::int64_t residual_add_backward(const TensorView& dy, const TensorView& y, bool relu,
                                     std::span<const TensorView> dxs) const;

  // ImageInputFacet::decode_images (backend_image_input.h): rows, channels and plane >= 0 with a
  // product that fits 64 bits; table fp32 [channels, 256] with data; y a storage float of
  // rows·channels·plane elements (any shape) disjoint from the table; pixels not null when
  // rows > 0. Returns the pixel count (0: nothing to upload or decode).
  std::int64_t decode_images(const ByteImages& images, const TensorView& table,
                             const TensorView& y) const;

  // split_heads / merge_heads (`op`): a sane layout, x [N, T, P, H, D] and y [P, N, H, T', D]
  // storage floats that do not overlap.
  void head_permute(std::string_view op, const TensorView& x, const HeadLayout& layout,
                    const TensorView& y) const;

  // softmax_forward: a sane shape whose causal mask leaves every row a key; fp32 scores and probs
  // of batch*rows*cols, the same view or disjoint. Returns the element count.
  std::int64_t softmax_forward(const TensorView& scores, const SoftmaxShape& shape,
                               const TensorView& probs) const;
  // softmax_backward: the shape as above; fp32 probs, dprobs, dscores of batch*rows*cols; dscores
  // is dprobs or disjoint from it, and never overlaps probs. Returns the element count.
  std::int64_t softmax_backward(const TensorView& probs, const TensorView& dprobs,
                                const SoftmaxShape& shape, const TensorView& dscores) const;

  // flash_forward: a layout of qkv as the QKV projection writes it (parts 3, head_tokens 0 or
  // tokens, head_offset 0, batch and tokens >= 0, heads and head_dim >= 1); qkv a storage float
  // [N, T, 3, H, D], out [N, T, H, D] of qkv's dtype, lse fp32 [N, H, T]; out and lse overlap
  // nothing. Returns N·T·H·D.
  std::int64_t flash_forward(const TensorView& qkv, const HeadLayout& layout, const TensorView& out,
                             const TensorView& lse) const;
  // flash_backward: qkv, out and lse as flash_forward takes them; dout a storage float
  // [N, T, H, D]; dqkv [N, T, 3, H, D] of dout's dtype, overlapping no input. Returns N·T·H·D.
  std::int64_t flash_backward(const TensorView& qkv, const TensorView& out, const TensorView& dout,
                              const TensorView& lse, const HeadLayout& layout,
                              const TensorView& dqkv) const;
  // flash_decode: a layout of one sequence's KV cache (batch 1, parts 3, heads and head_dim >= 1,
  // tokens >= 0 new queries at head_offset, head_offset + tokens <= the capacity); cache a
  // storage float [3, 1, H, T', D], out a storage float [1, tokens, H, D] apart from it. Returns
  // tokens·H·D.
  std::int64_t flash_decode(const TensorView& cache, const HeadLayout& layout,
                            const TensorView& out) const;

  struct EmbeddingShape {
    std::int64_t rows = 0, vocab = 0, width = 0;
  };
  // gather: ids int32 (any shape, rows = its numel), table storage [V, C], out storage [rows, C]
  // (leading dimensions folded) disjoint from both.
  EmbeddingShape embedding_gather(const TensorView& ids, const TensorView& table,
                                  const TensorView& out) const;
  // scatter_add: beta 0 or 1, ids int32, dy storage [rows, C], dtable fp32 [V, C] disjoint from
  // both.
  EmbeddingShape embedding_scatter_add(const TensorView& ids, const TensorView& dy,
                                       const TensorView& dtable, float beta) const;

  // dropout_forward / dropout_backward (`op`): `in` and `out` storage floats of equal numel, the
  // same view or disjoint; p in [0, 1).
  void dropout(std::string_view op, std::string_view in_name, const TensorView& in,
               std::string_view out_name, const TensorView& out, float p) const;

  // --- Layers (backend_convolution.h, backend_batch_norm.h). A 4-D view must match the
  // geometry's dims exactly, any other view must hold as many elements; activations are
  // channels-last [N, H, W, C], weights PyTorch's [O, C/groups, KH, KW].

  // Every dimension >= 1 (padding >= 0), groups dividing both channel counts, a kernel that fits.
  void conv2d_geometry(std::string_view op, const Conv2dGeometry& g) const;
  // The geometry, then x, w (not transposed), y of its shapes, a bias (optional) fp32 [O], y
  // disjoint from x and w. Not the operands', output's and compute dtypes: those are the
  // backend's.
  void conv2d_forward(const Conv2dForwardArgs& args) const;
  // The geometry, dy, w (not transposed), dx of its shapes, dx disjoint from dy and w.
  void conv2d_backward_data(const Conv2dBackwardDataArgs& args) const;
  // conv2d_backward_data_accumulate's (convolution facet 1.1): conv2d_backward_data's, and dx fp32
  // or of dy's 16-bit dtype.
  void conv2d_backward_data_accumulate(const Conv2dBackwardDataArgs& args) const;
  // The geometry, x, dy (not transposed) of its shapes, dw fp32 [O, C/groups, KH, KW], dbias
  // (optional) fp32 [O], dw disjoint from x and dy.
  void conv2d_backward_weights(const Conv2dBackwardWeightsArgs& args) const;
  // A convolution call's workspace from its caller (convolution facet 1.2): empty, or overlapping
  // none of the call's operands and outputs. `op` names the call in the message.
  void conv2d_workspace(std::string_view op, const TensorView& workspace,
                        const Conv2dForwardArgs& args) const;
  void conv2d_workspace(std::string_view op, const TensorView& workspace,
                        const Conv2dBackwardDataArgs& args) const;
  void conv2d_workspace(std::string_view op, const TensorView& workspace,
                        const Conv2dBackwardWeightsArgs& args) const;
  // conv2d_workspace_bytes' query: one of the four convolution ops, the geometry, compute fp32 or
  // tf32, and an accumulating dx fp32 or dy's 16-bit dtype (the calls' shared dtype rule). Not the
  // operands' dtypes: those are the backend's to check, as for the calls.
  void conv2d_workspace_query(const Conv2dWorkspaceQuery& query) const;

  // Every dimension >= 1 (padding >= 0), padding at most half the kernel, a kernel that fits.
  void pool2d_geometry(std::string_view op, const Pool2dGeometry& g) const;
  // The geometry, x [N, H, W, C] and y [N, OH, OW, C] storage floats of one dtype, y disjoint
  // from x.
  void pool2d_forward(const Pool2dGeometry& g, const TensorView& x, const TensorView& y) const;
  // The geometry, dy [N, OH, OW, C] and dx [N, H, W, C] storage floats of one dtype, dx disjoint
  // from dy; max pooling without a workspace needs x, [N, H, W, C] of dy's dtype.
  void pool2d_backward(const Pool2dGeometry& g, const TensorView& dy, const TensorView& x,
                       const TensorView& workspace, const TensorView& dx) const;
  // A pooling workspace of at least `bytes` bytes.
  void pool2d_workspace(std::string_view op, const TensorView& workspace, std::size_t bytes) const;
  // pool2d_workspace_bytes: the geometry, x a storage float when pooling by max (the only kind
  // with a workspace). Returns whether the kind has one.
  bool pool2d_workspace_args(const Pool2dGeometry& g, DType x) const;

  // to_channels_last / to_channels_first (`op`): src and dst storage floats, channels, height and
  // width >= 1, src a whole number of images, dst of src's numel and disjoint from it. Returns
  // the number of images.
  std::int64_t channel_permute(std::string_view op, const TensorView& src, std::int64_t channels,
                               std::int64_t height, std::int64_t width,
                               const TensorView& dst) const;

  // rows, channels >= 1 and eps >= 0.
  void batchnorm_shape(std::string_view op, const BatchNormShape& s) const;
  // batchnorm_workspace_bytes: the shape, x a storage float.
  void batchnorm_workspace_args(const BatchNormShape& s, DType x) const;
  // The training forward: the shape with rows >= 2; x and y storage [rows, C] of one dtype (the
  // same view or disjoint); gamma and beta both fp32 [C] (affine) or both empty; save_mean,
  // save_var and the running statistics (optional) fp32 [C]; with the fused ReLU, a workspace
  // (optional) of `workspace_bytes`. Returns whether the workspace keeps the scale and shift.
  bool batchnorm_forward_training(const TensorView& x, const TensorView& gamma,
                                  const TensorView& beta, const BatchNormShape& s,
                                  const TensorView& y, const TensorView& save_mean,
                                  const TensorView& save_var, const TensorView& running_mean,
                                  const TensorView& running_var, const TensorView& workspace,
                                  std::size_t workspace_bytes) const;
  // The inference forward: x, y, gamma, beta as above; running_mean, running_var fp32 [C].
  void batchnorm_forward_inference(const TensorView& x, const TensorView& gamma,
                                   const TensorView& beta, const TensorView& running_mean,
                                   const TensorView& running_var, const BatchNormShape& s,
                                   const TensorView& y) const;
  // The backward: the shape; dy, x, dx storage [rows, C] of one dtype, dx the same view as dy, x
  // (and y) or disjoint; save_mean, save_var, gamma (affine), dgamma, dbeta (optional) fp32 [C],
  // no gradients of affine parameters without gamma; with the fused ReLU, the workspace (of
  // `workspace_bytes`) or y. Returns whether the ReLU mask comes from the workspace.
  bool batchnorm_backward(const TensorView& dy, const TensorView& x, const TensorView& y,
                          const TensorView& gamma, const TensorView& save_mean,
                          const TensorView& save_var, const BatchNormShape& s,
                          const TensorView& workspace, std::size_t workspace_bytes,
                          const TensorView& dx, const TensorView& dgamma,
                          const TensorView& dbeta) const;

  // 1.2's batchnorm_add_forward: as the training forward (rows >= 2, save_mean and save_var
  // required) or the inference one (running statistics required) for x, y, gamma, beta; y
  // disjoint from x; residual storage [rows, C] of x's dtype, y itself or disjoint from it and x;
  // momentum in [0, 1] when training.
  void batchnorm_add_forward(const BatchNormAddArgs& a) const;

  // Version 2's split ops. batchnorm_statistics: the shape; x storage [rows, C]; mean and var
  // fp32 [C].
  void batchnorm_statistics(const TensorView& x, const BatchNormShape& s, const TensorView& mean,
                            const TensorView& var) const;
  // batchnorm_backward_reduce: the shape; dy and x storage [rows, C] of one dtype; y too with the
  // fused ReLU; mean, var, sum_dy, sum_dy_xhat fp32 [C], the sums disjoint from everything read.
  void batchnorm_backward_reduce(const TensorView& dy, const TensorView& x, const TensorView& y,
                                 const TensorView& mean, const TensorView& var,
                                 const BatchNormShape& s, const TensorView& sum_dy,
                                 const TensorView& sum_dy_xhat) const;
  // batchnorm_backward_elementwise: as the reduce for dy, x and y; dx storage [rows, C] of x's
  // dtype, the same view as dy, x (and y) or disjoint; gamma (optional), mean, var, mean_dy and
  // mean_dy_xhat fp32 [C].
  void batchnorm_backward_elementwise(const TensorView& dy, const TensorView& x,
                                      const TensorView& y, const TensorView& gamma,
                                      const TensorView& mean, const TensorView& var,
                                      const TensorView& mean_dy, const TensorView& mean_dy_xhat,
                                      const BatchNormShape& s, const TensorView& dx) const;

  // --- QuantizedWeightFacet (backend_quantized_weight.h)

  // dequantize_nf4: codes not null, block >= 1, out a present storage float, absmax fp32 of
  // nf4_block_count(out's numel, block) values (support/nf4.h). Returns out's numel.
  std::int64_t dequantize_nf4(const void* codes, const TensorView& absmax, std::int64_t block,
                              const TensorView& out) const;
  // dequantize_block_scaled: out a present storage float [rows, cols]; w.layout one that
  // support/block_scaling.h's block_grid takes for that shape; codes of 1-byte storage, rows·cols
  // bytes (E2M1: two a byte, ceil(rows·cols / 2)); scales fp32 for the fp32 layouts, else 1-byte
  // scale codes, one per block; with the layout's tensor scale, fp32 [1]. Returns the block grid
  // ({rows, cols} of blocks).
  RowsCols dequantize_block_scaled(const BlockScaledWeight& w, const TensorView& out) const;

  // One entry of a fused optimizer update: master and grad fp32 of equal size, working (optional)
  // in a storage dtype, and the fp32 state slots the optimizer needs.
  void optimizer_param(std::string_view op, std::size_t index, const ParamTensors& p,
                       bool needs_state1, bool needs_state2) const;
  // The status a queued gradient check writes and a gated update reads: present, int32,
  // GradientStatus::kWords elements.
  void gradient_status(std::string_view op, const TensorView& status) const;
  // count_underflow's (gradient_check 1.2): values present and fp32, the threshold finite and
  // not negative.
  void count_underflow(const TensorView& values, float threshold) const;

 private:
  std::string backend_;
  // cast_transpose_shape's checks, its messages naming `op`.
  RowsCols cast_layouts_shape(std::string_view op, const CastTransposeArgs& args) const;
};

}  // namespace mixtrain::sdk
