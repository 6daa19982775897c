// CpuResidual: the CPU backend's ResidualFacet: the n-ary residual add in one pass (fp32 sum,
// optional ReLU, one rounding into y), and its backward, every input's gradient from one read of
// dy (and y).
#include <algorithm>
#include <bit>
#include <cstdint>

#include "cpu_access.h"
#include "cpu_context.h"
#include "cpu_residual_kernels.h"
#include "cpu_typed_storage.h"
#include "mixtrain/sdk/backend_residual.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

class CpuResidual final : public sdk::ResidualFacet {
 public:
  explicit CpuResidual(CpuContext& context) : context_(context) {}

  void add(std::span<const sdk::TensorView> xs, bool relu, sdk::TensorView y) override;
  void add_backward(sdk::TensorView dy, sdk::TensorView y, bool relu,
                    std::span<const sdk::TensorView> dxs) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::ResidualFacet, CpuResidual> kRegistration;

// The common joins (fp32 or bf16 storage throughout, one or two gradients: a ResNet block's
// input and its branch, GPT's residual stream) in one element-wise loop (cpu_residual_kernels.h);
// false leaves the call to the generic chunked path, which gives the same bits.
bool add_backward_in_one_loop(const TensorView& dy, const TensorView& y,
                              std::span<const TensorView> dxs, std::int64_t total) {
  if (!typed_storage(dy) || (!y.empty() && !typed_storage(y))) return false;
  const TensorView* out[2] = {};
  int count = 0;
  for (const TensorView& dx : dxs) {
    if (dx.empty()) continue;
    if (!typed_storage(dx) || count == 2) return false;
    out[count++] = &dx;
  }
  if (count > 0) residual_backward_pair(dy, y, *out[0], *out[count - 1], total);
  return true;
}

}  // namespace

void CpuResidual::add(std::span<const TensorView> xs, bool relu, TensorView y) {
  context_.use_threads();
  const std::int64_t total = checks().residual_add(xs, y);
  // One pass: each chunk of every input is read (decoded) once, summed in FP32, rectified and
  // rounded once into y; y may be an input, whose chunk is read before it is written.
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float sum[kChunk], buf[kChunk];
    const float* first = read_chunk(xs[0], c0, len, buf);
    std::copy(first, first + len, sum);
    for (std::size_t k = 1; k < xs.size(); ++k) {
      const float* in = read_chunk(xs[k], c0, len, buf);
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) sum[i] += in[i];
    }
    if (relu) {
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) sum[i] = sum[i] < 0.0f ? 0.0f : sum[i];  // NaN stays
    }
    commit_chunk(y, c0, len, sum);
  }
}

void CpuResidual::add_backward(TensorView dy, TensorView y, bool relu,
                               std::span<const TensorView> dxs) {
  context_.use_threads();
  const std::int64_t total = checks().residual_add_backward(dy, y, relu, dxs);
  // fp32 and bf16 with one or two gradients in one element-wise loop; any other storage here:
  // each chunk of dy (and y) is read once, masked into g, and g is rounded once into every
  // gradient; a gradient that is dy itself is written after g is complete.
  if (add_backward_in_one_loop(dy, relu ? y : TensorView{}, dxs, total)) return;
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float g[kChunk], buf[kChunk];
    const float* d = read_chunk(dy, c0, len, buf);
    std::copy(d, d + len, g);
    if (relu) {
      const float* out = read_chunk(y, c0, len, buf);
      // dy where y > 0, else +0 (y NaN too), as activation_backward's relu: a bit mask, so it
      // vectorises.
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) {
        const std::uint32_t keep = out[i] > 0.0f ? 0xffffffffu : 0u;
        g[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(g[i]) & keep);
      }
    }
    for (const TensorView& dx : dxs)
      if (!dx.empty()) commit_chunk(dx, c0, len, g);
  }
}

}  // namespace mixtrain::backend_cpu
