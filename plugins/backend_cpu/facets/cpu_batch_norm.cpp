// Batch norm (training forward, inference forward, backward) over channels-last activations.
//
// - Data: x, y, dy, dx [rows, C] (rows = N·H·W of channels-last images), the caller's memory as
//   is; the work is cpu_batchnorm_kernels.h's (why not oneDNN's batch norm: there).
// - Statistics are FP32 whatever the activations: the batch mean and the biased variance are
//   written to save_mean / save_var; the backward reads them back. Every storage dtype (fp32,
//   bf16, fp16) is decoded exactly and the outputs are rounded once (RNE).
// - Affine: gamma and beta; both empty means not affine (1 and 0). dgamma / dbeta are written in
//   place or added.
// - Fused ReLU: the training forward leaves its per-channel scale and shift (2·C floats,
//   batchnorm_workspace_bytes) in the caller's workspace; the backward recomputes the
//   normalised value from x with them and masks dy where it was not positive, exactly where the
//   forward's ReLU cut. Without a workspace it masks dy where y is not positive (the same
//   elements but for a value that rounds to zero in y's dtype).
// - Batch norm + add + ReLU (1.2, batchnorm_add_forward): the training forward's statistics and
//   scale, then one pass y = act(affine(x) + residual), rounded once.
// - Running statistics (PyTorch's BatchNorm2d): r = (1 − momentum)·r + momentum·s, with the
//   unbiased variance s = var·rows/(rows − 1) for running_var, computed in double and rounded
//   once to fp32. As in PyTorch, training needs more than one row.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cpu_access.h"  // checks()
#include "cpu_batchnorm_kernels.h"
#include "cpu_context.h"
#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

// Runs `kernel` with typed pointers: fp32 storage as float, bf16 and fp16 as their bits, which
// the kernels decode and round in their loops (no fp32 copy of a tensor: the backend's scratch
// does not grow with a batch norm's activations). `inputs` and `outputs` are the tensors the kernel
// reads and writes (an input may be nullptr: none, passed on as a null pointer); the first input
// sets the dtype, which the argument checks hold the others to.
template <class Kernel>
void with_typed(std::initializer_list<const TensorView*> inputs,
                std::initializer_list<const TensorView*> outputs, Kernel&& kernel) {
  std::vector<void*> in, out;
  for (const TensorView* v : inputs) in.push_back(v != nullptr ? v->data : nullptr);
  for (const TensorView* v : outputs) out.push_back(v->data);
  switch ((*inputs.begin())->dtype) {
    case DType::bf16:
      kernel(Bf16Bits{}, in, out);
      return;
    case DType::fp16:
      kernel(Fp16Bits{}, in, out);
      return;
    default:
      kernel(float{}, in, out);  // fp32 storage (fp32, tf32): the checks allow no other dtype
      return;
  }
}

// The training forward's scale and shift per channel ((x − mean)·scale + shift): gamma / sqrt(var
// + eps) and beta, or 1 / sqrt(var + eps) and 0 when not affine.
void scale_and_shift(const float* var, const TensorView& gamma, const TensorView& beta,
                     std::int64_t channels, float eps, float* scale, float* shift) {
  for (std::int64_t j = 0; j < channels; ++j) {
    const double inv = 1.0 / std::sqrt(static_cast<double>(var[j]) + static_cast<double>(eps));
    scale[j] = static_cast<float>(gamma.empty() ? inv : gamma.as<const float>()[j] * inv);
    shift[j] = beta.empty() ? 0.0f : beta.as<const float>()[j];
  }
}

// PyTorch's BatchNorm2d momentum rule for the running statistics, from the batch's mean and
// biased variance (rows of them).
void update_running(TensorView running_mean, TensorView running_var, const float* mean,
                    const float* var, std::int64_t channels, std::int64_t rows, float momentum) {
  const double m = momentum;
  const double unbiased = static_cast<double>(rows) / static_cast<double>(rows - 1);
  for (std::int64_t j = 0; j < channels; ++j) {
    if (!running_mean.empty()) {
      float& r = running_mean.as<float>()[j];
      r = static_cast<float>((1.0 - m) * r + m * mean[j]);
    }
    if (!running_var.empty()) {
      float& r = running_var.as<float>()[j];
      r = static_cast<float>((1.0 - m) * r + m * unbiased * var[j]);
    }
  }
}

std::size_t workspace_bytes(const sdk::BatchNormShape& shape) {
  return shape.relu ? 2 * static_cast<std::size_t>(shape.channels) * sizeof(float) : 0;
}

}  // namespace

namespace {

class CpuBatchNorm final : public sdk::BatchNormFacet {
 public:
  explicit CpuBatchNorm(CpuContext& context) : context_(context) {}

  std::size_t batchnorm_workspace_bytes(const sdk::BatchNormShape& shape,
                                        sdk::DType x) const override;
  void batchnorm_forward_training(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta,
                                  const sdk::BatchNormShape& shape, float momentum,
                                  sdk::TensorView y, sdk::TensorView save_mean,
                                  sdk::TensorView save_var, sdk::TensorView running_mean,
                                  sdk::TensorView running_var, sdk::TensorView workspace) override;
  void batchnorm_forward_inference(sdk::TensorView x, sdk::TensorView gamma, sdk::TensorView beta,
                                   sdk::TensorView running_mean, sdk::TensorView running_var,
                                   const sdk::BatchNormShape& shape, sdk::TensorView y) override;
  void batchnorm_backward(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                          sdk::TensorView gamma, sdk::TensorView save_mean,
                          sdk::TensorView save_var, const sdk::BatchNormShape& shape,
                          sdk::TensorView workspace, sdk::TensorView dx, sdk::TensorView dgamma,
                          sdk::TensorView dbeta, bool accumulate) override;
  // Version 2: synchronized batch norm's split ops (contract in backend_batch_norm.h).
  void batchnorm_statistics(sdk::TensorView x, const sdk::BatchNormShape& shape,
                            sdk::TensorView mean, sdk::TensorView var) override;
  void batchnorm_backward_reduce(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                 sdk::TensorView mean, sdk::TensorView var,
                                 const sdk::BatchNormShape& shape, sdk::TensorView sum_dy,
                                 sdk::TensorView sum_dy_xhat) override;
  void batchnorm_backward_elementwise(sdk::TensorView dy, sdk::TensorView x, sdk::TensorView y,
                                      sdk::TensorView gamma, sdk::TensorView mean,
                                      sdk::TensorView var, sdk::TensorView mean_dy,
                                      sdk::TensorView mean_dy_xhat,
                                      const sdk::BatchNormShape& shape,
                                      sdk::TensorView dx) override;
  // 1.2: batch norm + add + ReLU.
  void batchnorm_add_forward(const sdk::BatchNormAddArgs& args) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::BatchNormFacet, CpuBatchNorm> kRegistration;

}  // namespace

std::size_t CpuBatchNorm::batchnorm_workspace_bytes(const sdk::BatchNormShape& shape,
                                                    DType x) const {
  checks().batchnorm_workspace_args(shape, x);
  return workspace_bytes(shape);
}

void CpuBatchNorm::batchnorm_forward_training(TensorView x, TensorView gamma, TensorView beta,
                                              const sdk::BatchNormShape& shape, float momentum,
                                              TensorView y, TensorView save_mean,
                                              TensorView save_var, TensorView running_mean,
                                              TensorView running_var, TensorView workspace) {
  context_.use_threads();
  const bool keep = checks().batchnorm_forward_training(x, gamma, beta, shape, y, save_mean,
                                                        save_var, running_mean, running_var,
                                                        workspace, workspace_bytes(shape));
  const std::int64_t c = shape.channels;

  float* mean = save_mean.as<float>();
  float* var = save_var.as<float>();
  float* scale = nullptr;
  std::vector<float> local;
  if (keep) {
    scale = workspace.as<float>();  // kept for the backward's ReLU mask
  } else {
    local.resize(static_cast<std::size_t>(2 * c));
    scale = local.data();
  }
  float* shift = scale + c;
  // One pass for the statistics, one for y, over x as stored.
  with_typed({&x}, {&y}, [&](auto t, auto& in, auto& out) {
    using T = decltype(t);
    const auto* xs = static_cast<const T*>(in[0]);
    channel_moments(xs, shape.rows, c, mean, var);
    scale_and_shift(var, gamma, beta, c, shape.eps, scale, shift);
    channel_affine(xs, static_cast<T*>(out[0]), shape.rows, c, mean, scale, shift, shape.relu);
  });
  update_running(running_mean, running_var, mean, var, c, shape.rows, momentum);
}

void CpuBatchNorm::batchnorm_add_forward(const sdk::BatchNormAddArgs& a) {
  context_.use_threads();
  checks().batchnorm_add_forward(a);
  const sdk::BatchNormShape& shape = a.shape;
  const std::int64_t c = shape.channels;
  std::vector<float> coefficients(static_cast<std::size_t>(2 * c));
  float* scale = coefficients.data();
  float* shift = scale + c;
  const float* mean = a.training ? a.save_mean.as<float>() : a.running_mean.as<const float>();
  with_typed({&a.x, &a.residual}, {&a.y}, [&](auto t, auto& in, auto& out) {
    using T = decltype(t);
    const auto* xs = static_cast<const T*>(in[0]);
    if (a.training)
      channel_moments(xs, shape.rows, c, a.save_mean.as<float>(), a.save_var.as<float>());
    const float* var = a.training ? a.save_var.as<const float>() : a.running_var.as<const float>();
    scale_and_shift(var, a.gamma, a.beta, c, shape.eps, scale, shift);
    channel_affine_add(xs, static_cast<const T*>(in[1]), static_cast<T*>(out[0]), shape.rows, c,
                       mean, scale, shift, shape.relu);
  });
  if (a.training)
    update_running(a.running_mean, a.running_var, a.save_mean.as<const float>(),
                   a.save_var.as<const float>(), c, shape.rows, a.momentum);
}

void CpuBatchNorm::batchnorm_forward_inference(TensorView x, TensorView gamma, TensorView beta,
                                               TensorView running_mean, TensorView running_var,
                                               const sdk::BatchNormShape& shape, TensorView y) {
  context_.use_threads();
  checks().batchnorm_forward_inference(x, gamma, beta, running_mean, running_var, shape, y);
  const std::int64_t c = shape.channels;

  std::vector<float> coefficients(static_cast<std::size_t>(2 * c));
  float* scale = coefficients.data();
  scale_and_shift(running_var.as<const float>(), gamma, beta, c, shape.eps, scale, scale + c);
  with_typed({&x}, {&y}, [&](auto t, auto& in, auto& out) {
    using T = decltype(t);
    channel_affine(static_cast<const T*>(in[0]), static_cast<T*>(out[0]), shape.rows, c,
                   running_mean.as<const float>(), scale, scale + c, shape.relu);
  });
}

void CpuBatchNorm::batchnorm_backward(TensorView dy, TensorView x, TensorView y, TensorView gamma,
                                      TensorView save_mean, TensorView save_var,
                                      const sdk::BatchNormShape& shape, TensorView workspace,
                                      TensorView dx, TensorView dgamma, TensorView dbeta,
                                      bool accumulate) {
  context_.use_threads();
  const bool from_workspace =
      checks().batchnorm_backward(dy, x, y, gamma, save_mean, save_var, shape, workspace,
                                  workspace_bytes(shape), dx, dgamma, dbeta);
  const std::int64_t c = shape.channels;
  const bool affine = !gamma.empty();
  ReluMask mask;
  if (from_workspace) {
    mask.kind = ReluMask::Kind::recompute;
    mask.scale = workspace.as<const float>();
    mask.shift = mask.scale + c;
  } else if (shape.relu) {
    mask.kind = ReluMask::Kind::from_y;
  }

  // With g = dy masked by the ReLU, x̂ = (x − mean)·inv and M = rows:
  //   dbeta = Σ g, dgamma = Σ g·x̂, dx = gamma·inv·(g − Σ g / M − x̂·Σ g·x̂ / M)
  //      = a·g + b·(x − mean) + d, a = gamma·inv, b = −a·inv²·Σ g·(x − mean) / M, d = −a·Σ g / M.
  const float* mean = save_mean.as<const float>();
  const float* var = save_var.as<const float>();
  const auto cs = static_cast<std::size_t>(c);
  std::vector<double> sums(2 * cs);
  std::vector<float> coefficients(3 * cs);
  float* ka = coefficients.data();
  float* kb = ka + c;
  float* kd = kb + c;
  const double rows = static_cast<double>(shape.rows);
  // dx's coefficients, and dgamma / dbeta, from the sums.
  auto finish_sums = [&] {
    for (std::size_t j = 0; j < cs; ++j) {
      const double inv =
          1.0 / std::sqrt(static_cast<double>(var[j]) + static_cast<double>(shape.eps));
      const double a = (affine ? gamma.as<const float>()[j] : 1.0f) * inv;
      ka[j] = static_cast<float>(a);
      kb[j] = static_cast<float>(-a * inv * inv * sums[cs + j] / rows);
      kd[j] = static_cast<float>(-a * sums[j] / rows);
      const auto db = static_cast<float>(sums[j]);
      const auto dg = static_cast<float>(sums[cs + j] * inv);
      if (!dgamma.empty()) dgamma.as<float>()[j] = accumulate ? dgamma.as<float>()[j] + dg : dg;
      if (!dbeta.empty()) dbeta.as<float>()[j] = accumulate ? dbeta.as<float>()[j] + db : db;
    }
  };
  const TensorView* mask_y = mask.kind == ReluMask::Kind::from_y ? &y : nullptr;
  with_typed({&x, &dy, mask_y}, {&dx}, [&](auto t, auto& in, auto& out) {
    using T = decltype(t);
    ReluMask typed = mask;
    typed.y = in[2];
    const auto* xs = static_cast<const T*>(in[0]);
    const auto* dys = static_cast<const T*>(in[1]);
    channel_grad_sums(xs, dys, typed, shape.rows, c, mean, sums.data(), sums.data() + cs);
    finish_sums();
    channel_grad_input(xs, dys, typed, static_cast<T*>(out[0]), shape.rows, c, mean, ka, kb, kd);
  });
}

}  // namespace mixtrain::backend_cpu

// --- Version 2: synchronized batch norm's split ops -------------------------------------------
// The same kernels as the fused ops, so that with one rank's statistics and sums they give the
// fused results: the statistics are the training forward's, the sums the backward's, and dx's
// coefficients differ only by the rounding of the all-reduced means to fp32.

namespace mixtrain::backend_cpu {

void CpuBatchNorm::batchnorm_statistics(TensorView x, const sdk::BatchNormShape& shape,
                                        TensorView mean, TensorView var) {
  context_.use_threads();
  checks().batchnorm_statistics(x, shape, mean, var);
  with_typed({&x}, {}, [&](auto t, auto& in, auto&) {
    using T = decltype(t);
    channel_moments(static_cast<const T*>(in[0]), shape.rows, shape.channels, mean.as<float>(),
                    var.as<float>());
  });
}

void CpuBatchNorm::batchnorm_backward_reduce(TensorView dy, TensorView x, TensorView y,
                                             TensorView mean, TensorView var,
                                             const sdk::BatchNormShape& shape, TensorView sum_dy,
                                             TensorView sum_dy_xhat) {
  context_.use_threads();
  checks().batchnorm_backward_reduce(dy, x, y, mean, var, shape, sum_dy, sum_dy_xhat);
  const auto cs = static_cast<std::size_t>(shape.channels);
  ReluMask mask;
  if (shape.relu) mask.kind = ReluMask::Kind::from_y;
  std::vector<double> sums(2 * cs);
  const TensorView* mask_y = shape.relu ? &y : nullptr;
  with_typed({&x, &dy, mask_y}, {}, [&](auto t, auto& in, auto&) {
    using T = decltype(t);
    ReluMask typed = mask;
    typed.y = in[2];
    channel_grad_sums(static_cast<const T*>(in[0]), static_cast<const T*>(in[1]), typed, shape.rows,
                      shape.channels, mean.as<const float>(), sums.data(), sums.data() + cs);
  });
  const float* v = var.as<const float>();
  for (std::size_t j = 0; j < cs; ++j) {
    const double inv = 1.0 / std::sqrt(static_cast<double>(v[j]) + static_cast<double>(shape.eps));
    sum_dy.as<float>()[j] = static_cast<float>(sums[j]);
    sum_dy_xhat.as<float>()[j] = static_cast<float>(sums[cs + j] * inv);
  }
}

void CpuBatchNorm::batchnorm_backward_elementwise(TensorView dy, TensorView x, TensorView y,
                                                  TensorView gamma, TensorView mean, TensorView var,
                                                  TensorView mean_dy, TensorView mean_dy_xhat,
                                                  const sdk::BatchNormShape& shape, TensorView dx) {
  context_.use_threads();
  checks().batchnorm_backward_elementwise(dy, x, y, gamma, mean, var, mean_dy, mean_dy_xhat, shape,
                                          dx);
  const std::int64_t c = shape.channels;
  // dx = a·g + b·(x − mean) + d with a = gamma·inv, b = −a·inv·mean_dy_xhat (x̂ = (x − mean)·inv),
  // d = −a·mean_dy: the fused backward's form, so the same kernel writes it.
  std::vector<float> coefficients(3 * static_cast<std::size_t>(c));
  float* ka = coefficients.data();
  float* kb = ka + c;
  float* kd = kb + c;
  for (std::int64_t j = 0; j < c; ++j) {
    const double inv = 1.0 / std::sqrt(static_cast<double>(var.as<const float>()[j]) +
                                       static_cast<double>(shape.eps));
    const double a = (gamma.empty() ? 1.0f : gamma.as<const float>()[j]) * inv;
    ka[j] = static_cast<float>(a);
    kb[j] = static_cast<float>(-a * inv * mean_dy_xhat.as<const float>()[j]);
    kd[j] = static_cast<float>(-a * mean_dy.as<const float>()[j]);
  }
  ReluMask mask;
  if (shape.relu) mask.kind = ReluMask::Kind::from_y;
  const TensorView* mask_y = shape.relu ? &y : nullptr;
  with_typed({&x, &dy, mask_y}, {&dx}, [&](auto t, auto& in, auto& out) {
    using T = decltype(t);
    ReluMask typed = mask;
    typed.y = in[2];
    channel_grad_input(static_cast<const T*>(in[0]), static_cast<const T*>(in[1]), typed,
                       static_cast<T*>(out[0]), shape.rows, c, mean.as<const float>(), ka, kb, kd);
  });
}

}  // namespace mixtrain::backend_cpu
