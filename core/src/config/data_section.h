// The [data] table: the source (synthetic, npy, idx, cifar10, tokens, text) and its options, the
// batch sizes and the eval split, and the image tables [data.normalize] and [data.augment], read
// into Experiment::data with the resolved sections. Errors are sdk::ConfigError at the key's
// file:line:col. Internal to the core.
#pragma once

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"

namespace mixtrain::core {

void read_data_config(const Config& config, Experiment& e);

}  // namespace mixtrain::core
