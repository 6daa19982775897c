#include "cpu_bf16_rows.h"

#include "cpu_isa.h"

namespace mixtrain::backend_cpu {

namespace {

[[gnu::always_inline]] inline void decode_rows(const Bf16Bits* src, std::int64_t stride,
                                               std::int64_t count, std::int64_t d, float* dst) {
  for (std::int64_t r = 0; r < count; ++r)
    for (std::int64_t j = 0; j < d; ++j) dst[r * d + j] = float_from_bf16(src[r * stride + j]);
}

[[gnu::always_inline]] inline void encode_rows(const float* src, std::int64_t count, std::int64_t d,
                                               Bf16Bits* dst, std::int64_t stride) {
  for (std::int64_t r = 0; r < count; ++r)
    for (std::int64_t j = 0; j < d; ++j) dst[r * stride + j] = bf16_from_float(src[r * d + j]);
}

MIXTRAIN_ISA_VARIANTS(decode_rows)
MIXTRAIN_ISA_VARIANTS(encode_rows)

}  // namespace

void decode_bf16_rows(const Bf16Bits* src, std::int64_t stride, std::int64_t count, std::int64_t d,
                      float* dst) {
  decode_rows_best(src, stride, count, d, dst);
}

void encode_bf16_rows(const float* src, std::int64_t count, std::int64_t d, Bf16Bits* dst,
                      std::int64_t stride) {
  encode_rows_best(src, count, d, dst, stride);
}

}  // namespace mixtrain::backend_cpu
