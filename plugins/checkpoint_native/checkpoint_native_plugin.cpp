// Plugin descriptor of libmixtrain_checkpoint_native: one component, checkpoint_format "native".
#include "mixtrain/sdk/plugin.h"
#include "native_checkpoint_format.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> checkpoint_native_components() {
  using mixtrain::checkpoint_native::NativeCheckpointFormat;
  return {{mixtrain::sdk::ComponentKind::checkpoint_format, "native",
           "full training state (.mxt): tensors + metadata, CRC-checked, written atomically",
           NativeCheckpointFormat::option_schema(),
           &mixtrain::sdk::make_component<NativeCheckpointFormat>}};
}

}  // namespace

MIXTRAIN_PLUGIN("checkpoint_native", "0.1.0", checkpoint_native_components)
