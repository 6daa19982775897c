// CpuQuantizedWeight: the CPU backend's QuantizedWeightFacet: NF4 decoded as sdk/support/nf4.h
// defines it (cpu_nf4_decode.h: a table of each block's 16 values, rounded once into out's dtype),
// and block-scaled weights as sdk/support/block_scaling.h's dequantize_block_scaled() does.
//
// - Arguments: the SDK's shared checks (sdk/support/backend_argument_checks.h).
// - OpenMP over runs of whole blocks (NF4) or over rows (block-scaled); an element depends on its
//   code and its block's scales alone, so the output has the same bits for any thread count.
// - Block-scaled: code × block scale × tensor scale in double, exact (at most 4 + 24 + 24
//   significant bits), rounded once to fp32, as the reference computes it, then rounded once
//   (RNE) into out's dtype (cpu_block_scaled_decode.h).

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "cpu_access.h"
#include "cpu_block_scaled.h"
#include "cpu_block_scaled_decode.h"
#include "cpu_context.h"
#include "cpu_nf4_decode.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/facet_registry.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

class CpuQuantizedWeight final : public sdk::QuantizedWeightFacet {
 public:
  explicit CpuQuantizedWeight(CpuContext& context) : context_(context) {}

  // The SDK's table, and dequantize_block_scaled into fp32 / bf16 / fp16 ({out}).
  bool supports(sdk::QuantizedWeightOp op, std::span<const DType> dtypes) const override {
    if (op != sdk::QuantizedWeightOp::dequantize_block_scaled)
      return QuantizedWeightFacet::supports(op, dtypes);
    return dtypes.size() == 1 && is_storage_float(dtypes[0]);
  }

  void dequantize_nf4(const void* codes, TensorView absmax, std::int64_t block,
                      TensorView out) override {
    checks().dequantize_nf4(codes, absmax, block, out);
    context_.use_threads();
    decode_nf4(static_cast<const std::uint8_t*>(codes), absmax.as<const float>(), block, out);
  }

  // out is [rows, cols]; w's codes and scales tile it in w.layout's blocks.
  void dequantize_block_scaled(const sdk::BlockScaledWeight& w, TensorView out) override {
    const auto grid = checks().dequantize_block_scaled(w, out);
    const bool packed = w.layout.element == sdk::BlockElement::e2m1;
    const bool fp32_scales =
        w.layout.scale == sdk::BlockScale::fp32 || w.layout.scale == sdk::BlockScale::fp32_pow2;
    const float tensor_scale = w.layout.tensor_scale ? *w.tensor_scale.as<const float>() : 1.0f;
    context_.use_threads();
    // Every block's decode scale as fp32: the values as given, or the scale codes' (E8M0 and
    // E4M3 decode exactly), looked up in a table of the 256 codes (a decoder call a block cost
    // mxfp8's 1x32 blocks more than their lookups).
    const std::int64_t blocks = grid.rows * grid.cols;
    std::vector<float> scale(static_cast<std::size_t>(blocks));
    if (fp32_scales) {
      std::copy_n(w.scales.as<const float>(), blocks, scale.begin());
    } else {
      std::array<float, 256> code_value;
      for (int code = 0; code < 256; ++code)
        code_value[static_cast<std::size_t>(code)] =
            w.layout.scale == sdk::BlockScale::e4m3
                ? sdk::decode_fp8_e4m3(static_cast<std::uint8_t>(code))
                : sdk::decode_e8m0(static_cast<std::uint8_t>(code));
      const auto* codes = w.scales.as<const std::uint8_t>();
      for (std::int64_t b = 0; b < blocks; ++b)
        scale[static_cast<std::size_t>(b)] = code_value[codes[b]];
    }
    decode_block_scaled(w.codes.as<const std::uint8_t>(), packed,
                        block_element_values(w.layout.element), scale.data(), grid.cols,
                        w.layout.block_rows, w.layout.block_cols, !fp32_scales, tensor_scale, out);
  }

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::QuantizedWeightFacet, CpuQuantizedWeight>
    kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cpu
