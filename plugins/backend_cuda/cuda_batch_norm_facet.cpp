// CudaBatchNorm: CUDA kernels (cuda_batch_norm.cu) with FP32 statistics.
//
// Why kernels and not cuDNN: cuDNN 9 has batch norm only inside its graph API (a
// NORM_FORWARD / NORM_BACKWARD operation in CUDNN_BATCH_NORM mode, or the older GEN_STATS +
// BN_FINALIZE fusion pattern); the legacy cudnnBatchNormalization* calls are deprecated. Those
// graph ops are served by runtime-fusion / specialised engines whose availability depends on
// the GPU, the layout and the cuDNN build (the frontend's batchnorm nodes are what NVIDIA
// documents, and this build does not carry the frontend), their statistics and reductions are
// not specified beyond FP32 compute, the fused ReLU's backward mask and the unbiased running
// variance would still be ours, and a batch norm is three memory-bound passes that a plain
// kernel runs at bandwidth. These kernels follow the CPU backend's formulas element for element
// (cuda_element_math.h), with deterministic fixed-order reductions.
//
// Semantics as the CPU backend (cpu_batchnorm.cpp): save_var is the biased variance; the running
// variance moves with the unbiased one (rows / (rows - 1)); the fused ReLU's backward recomputes
// the forward's value from x with the forward's scale and shift (the workspace, 2·C floats) or
// masks where y > 0; dgamma / dbeta written or accumulated. Batch norm + add + ReLU (1.2) is the
// training or inference forward with the residual added in the apply pass, rounded once.
#include <algorithm>

#include "cuda_access.h"
#include "cuda_batch_norm.h"
#include "cuda_batch_norm_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

using sdk::DType;
using sdk::TensorView;

namespace {

std::size_t workspace_bytes(const sdk::BatchNormShape& s) {
  return s.relu ? 2 * static_cast<std::size_t>(s.channels) * sizeof(float) : 0;
}

const float* ptr_or_null(const TensorView& v) {
  return v.empty() ? nullptr : v.as<const float>();
}
float* mutable_or_null(const TensorView& v) {
  return v.empty() ? nullptr : v.as<float>();
}

// The forward kernels' common arguments (training and inference differ in the statistics only).
// residual: batch norm + add + ReLU's (empty: none).
kernels::BnForward forward_args(const TensorView& x, const TensorView& y, const TensorView& gamma,
                                const TensorView& beta, const sdk::BatchNormShape& shape,
                                const TensorView& residual = {}) {
  return {.x = x.data,
          .y = y.data,
          .residual = residual.empty() ? nullptr : residual.data,
          .t = elem_of(x.dtype),
          .gamma = ptr_or_null(gamma),
          .beta = ptr_or_null(beta),
          .eps = shape.eps,
          .relu = shape.relu,
          .rows = shape.rows,
          .channels = shape.channels};
}
}  // namespace

std::size_t CudaBatchNorm::batchnorm_workspace_bytes(const sdk::BatchNormShape& shape,
                                                     DType x) const {
  checks().batchnorm_workspace_args(shape, x);
  return workspace_bytes(shape);
}

void CudaBatchNorm::batchnorm_forward_training(TensorView x, TensorView gamma, TensorView beta,
                                               const sdk::BatchNormShape& shape, float momentum,
                                               TensorView y, TensorView save_mean,
                                               TensorView save_var, TensorView running_mean,
                                               TensorView running_var, TensorView workspace) {
  context_.activate();
  constexpr const char* op = "batchnorm_forward_training";
  const bool keep = checks().batchnorm_forward_training(x, gamma, beta, shape, y, save_mean,
                                                        save_var, running_mean, running_var,
                                                        workspace, workspace_bytes(shape));
  const std::int64_t c = shape.channels;
  double* partial =
      context_.partial.as<double>(kernels::bn_partial_doubles(shape.rows, c), context_.stream, op);
  float* scale_shift =
      keep ? workspace.as<float>()
           : context_.partial2.as<float>(2 * static_cast<std::size_t>(c), context_.stream, op);
  context_.account_buffers();
  const kernels::BnForward a = forward_args(x, y, gamma, beta, shape);
  check_cuda(kernels::bn_forward_training(a, momentum, save_mean.as<float>(), save_var.as<float>(),
                                          running_mean.empty() ? nullptr : running_mean.as<float>(),
                                          running_var.empty() ? nullptr : running_var.as<float>(),
                                          scale_shift, partial, context_.stream),
             op, "kernel launch");
}

void CudaBatchNorm::batchnorm_forward_inference(TensorView x, TensorView gamma, TensorView beta,
                                                TensorView running_mean, TensorView running_var,
                                                const sdk::BatchNormShape& shape, TensorView y) {
  context_.activate();
  constexpr const char* op = "batchnorm_forward_inference";
  checks().batchnorm_forward_inference(x, gamma, beta, running_mean, running_var, shape, y);
  const std::int64_t c = shape.channels;
  float* scale_shift =
      context_.partial2.as<float>(2 * static_cast<std::size_t>(c), context_.stream, op);
  context_.account_buffers();
  const kernels::BnForward a = forward_args(x, y, gamma, beta, shape);
  check_cuda(
      kernels::bn_forward_inference(a, running_mean.as<const float>(),
                                    running_var.as<const float>(), scale_shift, context_.stream),
      op, "kernel launch");
}

void CudaBatchNorm::batchnorm_backward(TensorView dy, TensorView x, TensorView y, TensorView gamma,
                                       TensorView save_mean, TensorView save_var,
                                       const sdk::BatchNormShape& shape, TensorView workspace,
                                       TensorView dx, TensorView dgamma, TensorView dbeta,
                                       bool accumulate) {
  context_.activate();
  constexpr const char* op = "batchnorm_backward";
  const bool from_workspace =
      checks().batchnorm_backward(dy, x, y, gamma, save_mean, save_var, shape, workspace,
                                  workspace_bytes(shape), dx, dgamma, dbeta);
  const std::int64_t c = shape.channels;
  double* partial =
      context_.partial.as<double>(kernels::bn_partial_doubles(shape.rows, c), context_.stream, op);
  float* coeff = context_.partial2.as<float>(3 * static_cast<std::size_t>(c), context_.stream, op);
  context_.account_buffers();
  kernels::BnBackward a{};
  a.dy = dy.data;
  a.x = x.data;
  a.y = shape.relu && !from_workspace ? y.data : nullptr;
  a.dx = dx.data;
  a.t = elem_of(x.dtype);
  a.gamma = ptr_or_null(gamma);
  a.save_mean = save_mean.as<const float>();
  a.save_var = save_var.as<const float>();
  a.scale_shift = from_workspace ? workspace.as<const float>() : nullptr;
  a.mask = !shape.relu ? 0 : (from_workspace ? 1 : 2);
  a.eps = shape.eps;
  a.rows = shape.rows;
  a.channels = c;
  check_cuda(kernels::bn_backward(a, dgamma.empty() ? nullptr : dgamma.as<float>(),
                                  dbeta.empty() ? nullptr : dbeta.as<float>(), accumulate, coeff,
                                  partial, context_.stream),
             op, "kernel launch");
}

// 1.2: the training or the inference forward's kernels, the apply pass reading the residual too.
// The scale and shift go to scratch: nothing is kept for a backward.
void CudaBatchNorm::batchnorm_add_forward(const sdk::BatchNormAddArgs& args) {
  context_.activate();
  constexpr const char* op = "batchnorm_add_forward";
  checks().batchnorm_add_forward(args);
  const sdk::BatchNormShape& shape = args.shape;
  const std::int64_t c = shape.channels;
  float* scale_shift =
      context_.partial2.as<float>(2 * static_cast<std::size_t>(c), context_.stream, op);
  double* partial = nullptr;
  if (args.training)
    partial = context_.partial.as<double>(kernels::bn_partial_doubles(shape.rows, c),
                                          context_.stream, op);
  context_.account_buffers();
  const kernels::BnForward a =
      forward_args(args.x, args.y, args.gamma, args.beta, shape, args.residual);
  if (args.training)
    check_cuda(kernels::bn_forward_training(
                   a, args.momentum, args.save_mean.as<float>(), args.save_var.as<float>(),
                   mutable_or_null(args.running_mean), mutable_or_null(args.running_var),
                   scale_shift, partial, context_.stream),
               op, "kernel launch");
  else
    check_cuda(kernels::bn_forward_inference(a, args.running_mean.as<const float>(),
                                             args.running_var.as<const float>(), scale_shift,
                                             context_.stream),
               op, "kernel launch");
}

// --- Version 2: synchronized batch norm's split ops (the fused ops' kernels, cuda_batch_norm.cu)

namespace {
// The backward split ops' common arguments: the ReLU mask from y (mask 2), never the workspace.
kernels::BnBackward split_args(const TensorView& dy, const TensorView& x, const TensorView& y,
                               const TensorView& gamma, const TensorView& mean,
                               const TensorView& var, const sdk::BatchNormShape& shape) {
  kernels::BnBackward a{};
  a.dy = dy.data;
  a.x = x.data;
  a.y = shape.relu ? y.data : nullptr;
  a.t = elem_of(x.dtype);
  a.gamma = ptr_or_null(gamma);
  a.save_mean = mean.as<const float>();
  a.save_var = var.as<const float>();
  a.mask = shape.relu ? 2 : 0;
  a.eps = shape.eps;
  a.rows = shape.rows;
  a.channels = shape.channels;
  return a;
}
}  // namespace

void CudaBatchNorm::batchnorm_statistics(TensorView x, const sdk::BatchNormShape& shape,
                                         TensorView mean, TensorView var) {
  context_.activate();
  constexpr const char* op = "batchnorm_statistics";
  checks().batchnorm_statistics(x, shape, mean, var);
  const std::int64_t c = shape.channels;
  double* partial =
      context_.partial.as<double>(kernels::bn_partial_doubles(shape.rows, c), context_.stream, op);
  float* scale_shift =
      context_.partial2.as<float>(2 * static_cast<std::size_t>(c), context_.stream, op);
  context_.account_buffers();
  sdk::BatchNormShape plain = shape;
  plain.relu = false;
  const kernels::BnForward a = forward_args(x, {}, {}, {}, plain);
  check_cuda(kernels::bn_statistics(a, mean.as<float>(), var.as<float>(), scale_shift, partial,
                                    context_.stream),
             op, "kernel launch");
}

void CudaBatchNorm::batchnorm_backward_reduce(TensorView dy, TensorView x, TensorView y,
                                              TensorView mean, TensorView var,
                                              const sdk::BatchNormShape& shape, TensorView sum_dy,
                                              TensorView sum_dy_xhat) {
  context_.activate();
  constexpr const char* op = "batchnorm_backward_reduce";
  checks().batchnorm_backward_reduce(dy, x, y, mean, var, shape, sum_dy, sum_dy_xhat);
  const std::int64_t c = shape.channels;
  double* partial =
      context_.partial.as<double>(kernels::bn_partial_doubles(shape.rows, c), context_.stream, op);
  float* coeff = context_.partial2.as<float>(3 * static_cast<std::size_t>(c), context_.stream, op);
  context_.account_buffers();
  check_cuda(
      kernels::bn_backward_reduce(split_args(dy, x, y, {}, mean, var, shape), sum_dy.as<float>(),
                                  sum_dy_xhat.as<float>(), coeff, partial, context_.stream),
      op, "kernel launch");
}

void CudaBatchNorm::batchnorm_backward_elementwise(
    TensorView dy, TensorView x, TensorView y, TensorView gamma, TensorView mean, TensorView var,
    TensorView mean_dy, TensorView mean_dy_xhat, const sdk::BatchNormShape& shape, TensorView dx) {
  context_.activate();
  constexpr const char* op = "batchnorm_backward_elementwise";
  checks().batchnorm_backward_elementwise(dy, x, y, gamma, mean, var, mean_dy, mean_dy_xhat, shape,
                                          dx);
  float* coeff = context_.partial2.as<float>(3 * static_cast<std::size_t>(shape.channels),
                                             context_.stream, op);
  context_.account_buffers();
  kernels::BnBackward a = split_args(dy, x, y, gamma, mean, var, shape);
  a.dx = dx.data;
  check_cuda(
      kernels::bn_backward_elementwise(a, mean_dy.as<const float>(), mean_dy_xhat.as<const float>(),
                                       coeff, context_.stream),
      op, "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::BatchNormFacet, CudaBatchNorm> kCudaBatchNormRegistration;

}  // namespace mixtrain::backend_cuda
