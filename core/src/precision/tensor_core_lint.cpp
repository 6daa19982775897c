#include "mixtrain/core/precision/tensor_core_lint.h"

#include <algorithm>

#include "mixtrain/sdk/support/backend_features.h"

namespace mixtrain::core {

std::vector<std::string> tensor_core_warnings(const Model& model) {
  std::vector<std::string> warnings;
  const bool realigns =
      sdk::has_feature(model.backend_ptr()->capabilities(), sdk::kFeatureGemmRealignsRows);
  const auto& layers = model.layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = *layers[i];
    const sdk::DType g = l.precision().gemm_input;
    if (!l.has_gemm() || g == sdk::DType::fp32 || g == sdk::DType::tf32) continue;
    const std::int64_t multiple = sdk::is_fp8(g) ? 16 : 8;
    const auto& inputs = model.plan().node(i).inputs;
    const bool reads_batch =
        std::find(inputs.begin(), inputs.end(), TensorId::batch()) != inputs.end();
    for (const TensorCoreDim& d : l.tensor_core_dims()) {
      if (d.size % multiple == 0) continue;
      // The chunked loss's logits node computes its blocks padded (model.loss_pad_classes): its
      // GEMMs never see the unaligned class count.
      if (d.size == l.out_features() && l.loss_chunk_rows() > 0 &&
          l.loss_block_columns() % multiple == 0)
        continue;
      std::string w = "layer '" + l.name() + "' (" + l.type() + "): " + d.what + " " +
                      std::to_string(d.size) + " is not a multiple of " + std::to_string(multiple) +
                      "; Tensor Cores run such shapes padded or not at all";
      // A GEMM dimension whose rows the backend pads itself (sdk/support/backend_features.h): the
      // lint says what the backend does about it instead of leaving it as a cost.
      // FP8 GEMMs are not realigned (an unaligned one is decoded to bf16), nor small ones.
      if (realigns && l.type() == "linear" && !sdk::is_fp8(g))
        w += " (the backend copies operands whose rows this leaves unaligned into padded scratch "
             "before its 16-bit Tensor Core kernels: a copy per large GEMM, not the slow kernels)";
      if (reads_batch && d.input_channels)
        w += " (the usual exception: the first convolution reads the image's " +
             std::to_string(d.size) +
             " channels; it is one layer, and cuDNN pads it. Pad the data to " +
             std::to_string(multiple) + " channels to silence this)";
      warnings.push_back(std::move(w));
      break;
    }
  }
  return warnings;
}

}  // namespace mixtrain::core
