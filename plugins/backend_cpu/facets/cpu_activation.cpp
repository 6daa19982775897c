// CpuActivation: the CPU backend's ActivationFacet. The bias gradient (a column sum in double
// over fp32 / bf16 / fp16 storage) and the activations are cpu_activation_kernels.h's, shared
// with the GEMM facet's epilogues; axpy adds into an fp32 accumulator.
#include <algorithm>

#include "cpu_access.h"
#include "cpu_activation_kernels.h"
#include "cpu_context.h"
#include "mixtrain/sdk/backend_activation.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::Activation;
using sdk::TensorView;

namespace {

class CpuActivation final : public sdk::ActivationFacet {
 public:
  explicit CpuActivation(CpuContext& context) : context_(context) {}

  void bias_grad(sdk::TensorView dy, sdk::TensorView dbias, bool accumulate) override;
  void activation_forward(sdk::Activation act, sdk::TensorView x, sdk::TensorView y) override;
  void activation_backward(sdk::Activation act, sdk::TensorView x, sdk::TensorView dy,
                           sdk::TensorView dx) override;
  void axpy(float alpha, sdk::TensorView x, sdk::TensorView y) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::ActivationFacet, CpuActivation> kRegistration;

}  // namespace

void CpuActivation::bias_grad(TensorView dy, TensorView dbias, bool accumulate) {
  const auto shape = checks().bias_grad_shape(dy, dbias);
  sum_columns(context_, dy, shape.rows, shape.cols, dbias.as<float>(), accumulate);
}

void CpuActivation::activation_forward(Activation act, TensorView x, TensorView y) {
  apply_activation(context_, act, x, y);
}

void CpuActivation::activation_backward(Activation act, TensorView x, TensorView dy,
                                        TensorView dx) {
  apply_activation_grad(context_, act, x, dy, dx);
  context_.account_scratch();  // mixed storages decode into the eltwise engine's scratch
}

void CpuActivation::axpy(float alpha, TensorView x, TensorView y) {
  context_.use_threads();
  checks().axpy_args(x, y);
  const std::int64_t total = x.numel();
  float* out = y.as<float>();
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float buf[kChunk];
    const float* in = read_chunk(x, c0, len, buf);
    float* o = out + c0;
#pragma omp simd
    for (std::int64_t i = 0; i < len; ++i) o[i] += alpha * in[i];
  }
}

}  // namespace mixtrain::backend_cpu
