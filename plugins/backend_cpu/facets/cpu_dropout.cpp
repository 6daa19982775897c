// CpuDropout: the CPU backend's DropoutFacet, the mask of sdk/backend_dropout.h element by
// element. The whole facet (class, kernel, registration) is this file.
//
// - OpenMP over chunks of kChunk elements; element i's keep bit is dropout_keeps(key, i, ...), a
//   function of the key and i alone, so the output has the same bits for any thread count and
//   any schedule.
// - fp32 math: the input is decoded exactly, multiplied by 1 / (1 - p) once, and rounded once
//   (RNE) into the output's dtype. Forward and backward are the same pass over different
//   tensors: the backward of a multiplication by a fixed mask is that multiplication.
#include <algorithm>
#include <cmath>
#include <string>

#include "cpu_access.h"
#include "cpu_context.h"
#include "mixtrain/sdk/backend_dropout.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

// out[i] = keeps(key, i) ? in[i] · scale(p) : 0, after the facet's checks.
void apply_mask(std::string_view op, std::string_view in_name, const TensorView& in,
                std::string_view out_name, const TensorView& out, float p, sdk::DropoutKey key) {
  checks().dropout(op, in_name, in, out_name, out, p);
  const std::uint32_t threshold = sdk::dropout_threshold(p);
  const float scale = sdk::dropout_scale(p);
  const std::int64_t total = in.numel();
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float in_buf[kChunk], out_buf[kChunk];
    const float* x = read_chunk(in, c0, len, in_buf);
    float* y = write_target(out, c0, out_buf);
#pragma omp simd
    for (std::int64_t j = 0; j < len; ++j) {
      const bool keep = sdk::dropout_keeps(key, static_cast<std::uint64_t>(c0 + j), threshold);
      y[j] = keep ? x[j] * scale : 0.0f;
    }
    commit_chunk(out, c0, len, y);
  }
}

class CpuDropout final : public sdk::DropoutFacet {
 public:
  explicit CpuDropout(CpuContext& context) : context_(context) {}

  void dropout_forward(TensorView x, TensorView y, float p, sdk::DropoutKey key) override {
    context_.use_threads();
    apply_mask("dropout_forward", "x", x, "y", y, p, key);
  }
  void dropout_backward(TensorView dy, TensorView dx, float p, sdk::DropoutKey key) override {
    context_.use_threads();
    apply_mask("dropout_backward", "dy", dy, "dx", dx, p, key);
  }

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::DropoutFacet, CpuDropout> kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cpu
