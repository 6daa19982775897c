// Plugin descriptor of libmixtrain_checkpoint_safetensors: one component, checkpoint_format
// "safetensors".
#include "mixtrain/sdk/plugin.h"
#include "safetensors_format.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> checkpoint_safetensors_components() {
  using mixtrain::checkpoint_safetensors::SafetensorsFormat;
  return {{mixtrain::sdk::ComponentKind::checkpoint_format, "safetensors",
           "weights only (.safetensors, the public layout PyTorch/Hugging Face read), fp32/bf16/fp16",
           SafetensorsFormat::option_schema(),
           &mixtrain::sdk::make_component<SafetensorsFormat>}};
}

}  // namespace

MIXTRAIN_PLUGIN("checkpoint_safetensors", "0.1.0", checkpoint_safetensors_components)
