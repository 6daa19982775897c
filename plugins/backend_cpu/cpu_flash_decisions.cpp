// CpuContext's flash-attention decision: which tile products flash attention runs (the option
// `flash_products`, cpu_flash_attention.h). The rule: bf16 products for bf16 q, k and v where the
// GEMM engine runs bf16 GEMMs natively (cpu_features.h's onednn_bf16_preferred: AMX-BF16, or
// AVX512-BF16 on an AMD CPU), the CPU classes where oneDNN's bf16 matmul beats the FP32 one. On
// AMX a 64 x 64 x 64 bf16 tile product took 1.0 µs against oneDNN's sgemm's 3.6 µs (bench/
// RESULTS.md, session 64); on AMD Zen 4 (AVX512-BF16, no AMX) GPT-2 small's attention ran 1.5x
// faster with them (bench_flash_attention, 12 heads x 1024 tokens: forward 11.0 -> 7.4 ms,
// backward 24.7 -> 15.9; session 85). On Intel AVX512-BF16 without AMX, where the engine emulates
// bf16 GEMMs, oneDNN's bf16 matmul runs no faster than the decoded FP32 one, and rounding P and dS
// would cost accuracy for nothing (forced, it ran 1.3-1.45x slower than FP32 there). Where oneDNN
// offers no bf16 matmul at all (AVX2), a forced bf16 runs FP32 products and says so.
#include <string>

#include "cpu_context.h"
#include "cpu_flash_attention.h"
#include "cpu_gemm.h"
#include "cpu_tile_matmul.h"

namespace mixtrain::backend_cpu {

FlashProducts CpuContext::flash_products(sdk::DType qkv) const {
  // bf16 asked of a CPU where oneDNN has no bf16 matmul (AVX2 and older): FP32, as the note says.
  if (qkv != sdk::DType::bf16 || !Bf16TileMatmul::available()) return FlashProducts::fp32;
  switch (flash_products_) {
    case FlashProductsChoice::bf16:
      return FlashProducts::bf16;
    case FlashProductsChoice::fp32:
      return FlashProducts::fp32;
    case FlashProductsChoice::automatic:
      break;
  }
  return gemm_->bf16_native() ? FlashProducts::bf16 : FlashProducts::fp32;
}

std::string CpuContext::flash_products_note() const {
  switch (flash_products_) {
    case FlashProductsChoice::bf16:
      if (!Bf16TileMatmul::available())
        return "flash_products = bf16 asked, but oneDNN has no bf16 matmul on this CPU: flash "
               "attention's tile products in FP32";
      return "flash_products = bf16: flash attention's tile products in bf16 for bf16 q, k and "
             "v (P and dS rounded to bf16)";
    case FlashProductsChoice::fp32:
      return "flash_products = fp32: flash attention's tile products in FP32";
    case FlashProductsChoice::automatic:
      break;
  }
  if (!gemm_->bf16_native())
    return "flash_products = auto: flash attention's tile products in FP32 (bf16 ones are taken "
           "where bf16 GEMMs run natively: AMX-BF16, or AVX512-BF16 on an AMD CPU)";
  return std::string(
             "flash_products = auto: flash attention's tile products for bf16 q, k and v "
             "in bf16 with native bf16 GEMMs (") +
         (has_amx_bf16() ? "AMX-BF16" : "AVX512-BF16") +
         "; P and dS rounded to bf16), in FP32 for other dtypes";
}

}  // namespace mixtrain::backend_cpu
