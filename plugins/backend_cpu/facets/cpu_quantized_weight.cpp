// CpuQuantizedWeight: the CPU backend's QuantizedWeightFacet: NF4 decoded as sdk/support/nf4.h
// defines it (cpu_nf4_decode.h: a table of each block's 16 values, rounded once into out's dtype),
// and block-scaled weights as sdk/support/block_scaling.h's dequantize_block_scaled() does.
//
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

constexpr std::string_view kOp = "dequantize_nf4";
constexpr std::string_view kBlockOp = "dequantize_block_scaled";

bool byte_view(const TensorView& v, std::int64_t numel) {
  return v.data != nullptr && sdk::dtype_size(v.dtype) == 1 && v.numel() == numel;
}

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
    decode_nf4(static_cast<const std::uint8_t*>(codes), absmax.as<const float>(), block, out);
  }

  // out is [rows, cols]; w's codes and scales tile it in w.layout's blocks.
  void dequantize_block_scaled(const sdk::BlockScaledWeight& w, TensorView out) override {
    require_present(kBlockOp, "out", out);
    require_storage(kBlockOp, "out", out);
    if (out.shape.rank != 2)
      fail(kBlockOp, "out is " + describe(out) + "; a block-scaled weight is [rows, cols]");
    const std::int64_t rows = out.shape[0], cols = out.shape[1];
    sdk::BlockExtent grid{};
    try {
      grid = sdk::block_grid(w.layout, rows, cols);
    } catch (const std::invalid_argument& e) {
      fail(kBlockOp, e.what());
    }
    const bool packed = w.layout.element == sdk::BlockElement::e2m1;
    const std::int64_t code_bytes = packed ? (rows * cols + 1) / 2 : rows * cols;
    if (!byte_view(w.codes, code_bytes))
      fail(kBlockOp, "codes must be " + std::to_string(code_bytes) +
                         " bytes (1-byte storage) for " + describe(out) + " in " +
                         sdk::describe(w.layout));
    const bool fp32_scales =
        w.layout.scale == sdk::BlockScale::fp32 || w.layout.scale == sdk::BlockScale::fp32_pow2;
    const std::int64_t blocks = grid.rows * grid.cols;
    if (fp32_scales ? (w.scales.data == nullptr || w.scales.dtype != DType::fp32 ||
                       w.scales.numel() != blocks)
                    : !byte_view(w.scales, blocks))
      fail(kBlockOp, "scales must be " + std::to_string(blocks) +
                         (fp32_scales ? " fp32 values" : " 1-byte scale codes") + " for " +
                         describe(out) + " in " + sdk::describe(w.layout));
    float tensor_scale = 1.0f;
    if (w.layout.tensor_scale) {
      require_present(kBlockOp, "tensor_scale", w.tensor_scale);
      require_fp32(kBlockOp, "tensor_scale", w.tensor_scale);
      require_numel(kBlockOp, "tensor_scale", w.tensor_scale, 1);
      tensor_scale = *w.tensor_scale.as<const float>();
    }
    context_.use_threads();
    // Every block's decode scale as fp32 (E8M0 and E4M3 decode exactly).
    std::vector<float> scale(static_cast<std::size_t>(blocks));
    for (std::int64_t b = 0; b < blocks; ++b) {
      const auto at = static_cast<std::size_t>(b);
      if (fp32_scales) {
        scale[at] = w.scales.as<const float>()[b];
      } else {
        const std::uint8_t code = w.scales.as<const std::uint8_t>()[b];
        scale[at] = w.layout.scale == sdk::BlockScale::e4m3 ? sdk::decode_fp8_e4m3(code)
                                                            : sdk::decode_e8m0(code);
      }
    }
    decode_block_scaled(w.codes.as<const std::uint8_t>(), packed,
                        block_element_values(w.layout.element), scale.data(), grid.cols,
                        w.layout.block_rows, w.layout.block_cols, tensor_scale, out);
  }

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::QuantizedWeightFacet, CpuQuantizedWeight>
    kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cpu
