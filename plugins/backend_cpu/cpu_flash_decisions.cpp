// CpuContext's flash-attention decision: which tile products flash attention runs (the option
// `flash_products`, cpu_flash_attention.h). The rule: bf16 products for bf16 q, k and v where the
// CPU has AMX-BF16 and the GEMM engine runs bf16 GEMMs natively there. On AMX a 64 x 64 x 64 bf16
// tile product took 1.0 µs against oneDNN's sgemm's 3.6 µs (bench/RESULTS.md, session 64);
// without AMX, oneDNN's bf16 matmul runs no faster than the decoded FP32 one (cpu_features.h), and
// rounding P and dS would cost accuracy for nothing (forced, it ran 1.3-1.45x slower than FP32
// there: AVX512-BF16 with AMX withheld from oneDNN). Where oneDNN offers no bf16 matmul at all
// (AVX2), a forced bf16 runs FP32 products and says so.
#include <string>

#include "cpu_context.h"
#include "cpu_flash_attention.h"
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
  return amx_bf16_gemms() ? FlashProducts::bf16 : FlashProducts::fp32;
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
  if (!amx_bf16_gemms())
    return "flash_products = auto: flash attention's tile products in FP32 (bf16 ones are taken "
           "with AMX-BF16 only)";
  return "flash_products = auto: flash attention's tile products for bf16 q, k and v in bf16 on "
         "AMX-BF16 (P and dS rounded to bf16), in FP32 for other dtypes";
}

}  // namespace mixtrain::backend_cpu
