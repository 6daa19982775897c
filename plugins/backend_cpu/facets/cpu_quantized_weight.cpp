// CpuQuantizedWeight: the CPU backend's QuantizedWeightFacet, NF4 decoded element by element as
// sdk/support/nf4.h defines it. The whole facet (class, kernel, registration) is this file.
//
// - OpenMP over chunks of kChunk elements; element i depends on its code and its block's absmax
//   alone, so the output has the same bits for any thread count.
// - One fp32 product per element (nf4_value, the reference's own expression), rounded once (RNE)
//   into out's dtype by commit_chunk.
#include <algorithm>
#include <string>

#include "cpu_access.h"
#include "cpu_context.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/support/facet_registry.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

constexpr std::string_view kOp = "dequantize_nf4";

class CpuQuantizedWeight final : public sdk::QuantizedWeightFacet {
 public:
  explicit CpuQuantizedWeight(CpuContext& context) : context_(context) {}

  void dequantize_nf4(const void* codes, TensorView absmax, std::int64_t block,
                      TensorView out) override {
    if (codes == nullptr) fail(kOp, "codes is a null pointer", "pass the packed NF4 codes");
    if (block < 1)
      fail(kOp, "block size " + std::to_string(block) + " < 1", "QLoRA's block size is 64");
    require_present(kOp, "out", out);
    require_storage(kOp, "out", out);
    require_present(kOp, "absmax", absmax);
    require_fp32(kOp, "absmax", absmax);
    const std::int64_t n = out.numel();
    require_numel(kOp, "absmax", absmax, sdk::nf4_block_count(n, block));
    context_.use_threads();
    const std::span packed(static_cast<const std::uint8_t*>(codes),
                           static_cast<std::size_t>(sdk::nf4_code_bytes(n)));
    const std::span scales(absmax.as<const float>(), static_cast<std::size_t>(absmax.numel()));
#pragma omp parallel for schedule(static) if (parallel_worth(n))
    for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, n - c0);
      float buf[kChunk];
      float* y = write_target(out, c0, buf);
      for (std::int64_t j = 0; j < len; ++j) y[j] = sdk::nf4_value(packed, scales, block, c0 + j);
      commit_chunk(out, c0, len, y);
    }
  }

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::QuantizedWeightFacet, CpuQuantizedWeight>
    kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cpu
