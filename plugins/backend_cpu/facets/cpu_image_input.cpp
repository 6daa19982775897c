// CpuImageInput: the CPU backend's ImageInputFacet. The "device" is host memory, so nothing
// travels: each byte is looked up in its channel's row of the table and rounded once into y. It
// exists so that a byte-image run keeps one data path on every backend (the trainer gathers and
// augments bytes, a quarter of the floats' memory traffic) and the conformance kit holds every
// backend to the same decode.
#include <algorithm>

#include "cpu_access.h"
#include "cpu_context.h"
#include "mixtrain/sdk/backend_image_input.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

class CpuImageInput final : public sdk::ImageInputFacet {
 public:
  explicit CpuImageInput(CpuContext& context) : context_(context) {}

  void decode_images(const sdk::ByteImages& images, TensorView table, TensorView y) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::ImageInputFacet, CpuImageInput> kRegistration;

}  // namespace

void CpuImageInput::decode_images(const sdk::ByteImages& images, TensorView table, TensorView y) {
  context_.use_threads();
  const std::int64_t pixels = checks().decode_images(images, table, y);
  if (pixels == 0) return;
  // pixels is [rows, C, plane] bytes; table is [C, 256] fp32; y is [rows, C, plane].
  const std::int64_t planes = images.rows * images.channels, plane = images.plane;
  const auto* values = static_cast<const float*>(table.data);
#pragma omp parallel for schedule(static) if (parallel_worth(pixels))
  for (std::int64_t q = 0; q < planes; ++q) {
    const float* row = values + (q % images.channels) * 256;
    const std::uint8_t* in = images.pixels + q * plane;
    for (std::int64_t c0 = 0; c0 < plane; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, plane - c0);
      float out[kChunk];
      for (std::int64_t i = 0; i < len; ++i) out[i] = row[in[c0 + i]];
      commit_chunk(y, q * plane + c0, len, out);
    }
  }
}

}  // namespace mixtrain::backend_cpu
