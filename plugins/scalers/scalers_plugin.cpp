// Descriptor of libmixtrain_scalers: the none, static and dynamic loss scalers.
#include "mixtrain/sdk/plugin.h"

#include "dynamic_loss_scaler.h"
#include "no_loss_scaler.h"
#include "static_loss_scaler.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> scaler_components() {
  using namespace mixtrain;
  using sdk::ComponentKind;
  return {
      {ComponentKind::scaler, "none", "no loss scaling (scale 1); skips non-finite steps",
       scalers::NoLossScaler::option_schema(), &sdk::make_component<scalers::NoLossScaler>},
      {ComponentKind::scaler, "static", "constant loss scale; skips non-finite steps",
       scalers::StaticLossScaler::option_schema(), &sdk::make_component<scalers::StaticLossScaler>},
      {ComponentKind::scaler, "dynamic",
       "PyTorch GradScaler dynamic loss scale with optional DeepSpeed-style hysteresis",
       scalers::DynamicLossScaler::option_schema(),
       &sdk::make_component<scalers::DynamicLossScaler>},
  };
}

}  // namespace

MIXTRAIN_PLUGIN("scalers", "0.1.0", scaler_components)
