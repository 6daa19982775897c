// Convolutions as one GEMM, where cpu_conv_gemm_rule.h's rule takes them instead of oneDNN's
// convolution: the weight gradient over its input's columns (CpuContext::wgrad_as_gemm), the data
// gradient of an unpadded 1x1 convolution, plain or accumulating (CpuContext::dgrad_as_gemm), and
// the forward of an unpadded 1x1 convolution (CpuContext::fprop_as_gemm).
//
// Contract, weight_gradient_as_gemm
// - args are the convolution facet's, already checked (conv2d_backward_weights), with one group
//   (wgrad_gemm_shape) and no fp8 dy with dbias asked for.
// - cols [M, KH·KW·C], M = N·OH·OW: x itself for a 1x1 kernel at stride 1 without padding; else
//   each output pixel's KH·KW input pixels (im2col), zeros where a tap falls in the padding, in x's
//   dtype, copied as stored into `cols` (wgrad_gemm_cols_bytes()): in (kh, kw, c) order, or in
//   OIHW's (c, kh, kw): `columns` (wgrad_columns() decides for the facet).
// - z [O, KH·KW·C] = dyᵀ [O, M] · cols through the backend's GemmEngine (cpu_gemm.h: its
//   precision rules, which are the convolution's; fp8 scale_invs scale the product once; FP32
//   accumulation). For a 1x1 kernel or columns in OIHW's order z is dw itself, accumulated as
//   beta = 1; otherwise z is dw in OHWI order, in `product` (wgrad_gemm_product_bytes()), and one
//   cached oneDNN reorder moves it into dw's OIHW (adding to dw when accumulating). Either order
//   gives the same bits: each element sums the same terms over M in the same order.
// - dbias fp32 [O] (when not empty) = (accumulate ? dbias : 0) + Σ_M dy, summed in double per
//   channel (sum_columns, cpu_activation_kernels.h: the activation facet's bias gradient).
// - Errors: sdk::BackendError from the GEMM engine.
#pragma once

#include <cstddef>

#include "cpu_context.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu {

// Bytes of the gathered columns (0 where the GEMM reads x itself) and of the OHWI product (0 for
// a 1x1 kernel or OIHW's column order, whose product is dw).
std::size_t wgrad_gemm_cols_bytes(const sdk::Conv2dGeometry& g, sdk::DType x);
std::size_t wgrad_gemm_product_bytes(const sdk::Conv2dGeometry& g, WgradColumns columns);

void weight_gradient_as_gemm(CpuContext& context, const sdk::Conv2dBackwardWeightsArgs& args,
                             WgradColumns columns, void* cols, float* product);

// Contract, data_gradient_as_gemm
// - args are the convolution facet's, already checked (conv2d_backward_data, or
//   conv2d_backward_data_accumulate when `accumulate`, then with an fp32 dx), with a geometry that
//   dgrad_gemm_shape() accepts: an unpadded 1x1 kernel, one group, any stride.
// - Stride 1 into a dx the GEMM engine writes itself (fp32; bf16 from bf16 operands on its native
//   route, GemmEngine::writes_c_directly): dx [M, C] (+)= dy [M, O] · w [O, C] (1x1 OIHW is
//   [O, C]), M = N·H·W, one GEMM through the backend's GemmEngine (its precision rules; fp8
//   scale_invs scale the product once; FP32 accumulation; beta = 1 when accumulating, into fp32
//   only: dx's old value added once).
// - Otherwise (a stride (sh, sw), or another 16-bit dx): z [N·OH·OW, C] = dy · w, the same GEMM,
//   into the fp32 `product` (dgrad_gemm_product_bytes(), the call's workspace, so the engine's own
//   scratch does not grow for a 16-bit C); x pixel (n, i·sh, j·sw) takes z's row (n, i, j),
//   rounded once into dx's dtype or added to dx's fp32; every other pixel of dx is zero (+0), or
//   left as it is when accumulating. No scratch for the direct case (a decoded operand is the
//   engine's own).
std::size_t dgrad_gemm_product_bytes(CpuContext& context, const sdk::Conv2dBackwardDataArgs& args);

void data_gradient_as_gemm(CpuContext& context, const sdk::Conv2dBackwardDataArgs& args,
                           bool accumulate, float* product);

// Contract, forward_as_gemm
// - args are the convolution facet's, already checked (conv2d_forward), with a geometry that
//   fprop_gemm_shape() accepts (an unpadded 1x1 kernel, one group, any stride); y is fp32, bf16 or
//   fp16, as every forward's.
// - y [M, O] = cols [M, C] · wᵀ (+ bias), M = N·OH·OW, w [O, C] (1x1 OIHW) read transposed: one
//   GEMM through the backend's GemmEngine (its precision rules, the convolution's; fp8
//   scale_invs scale the product once, before the bias; FP32 accumulation). cols is x itself at
//   stride 1, else x's every stride-th pixel gathered into `cols` (fprop_gemm_cols_bytes()). No
//   other scratch on the native bf16 route, where the engine writes a bf16 y itself; elsewhere
//   the engine's own holds decoded operands and a 16-bit y's fp32 product (cpu_gemm.h).
std::size_t fprop_gemm_cols_bytes(const sdk::Conv2dGeometry& g, sdk::DType x);

void forward_as_gemm(CpuContext& context, const sdk::Conv2dForwardArgs& args, void* cols);

}  // namespace mixtrain::backend_cpu
