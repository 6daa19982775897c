// The component conformance kit: the GoogleTest suites a loss scaler or an optimizer must pass,
// whatever its algorithm. They check what the host relies on (sdk/loss_scaler.h,
// sdk/optimizer.h), not the numbers an algorithm gives.
//
// Contract
// - Before RUN_ALL_TESTS, a program calls add_scaler() and add_optimizer() once per component
//   under test; each becomes one instantiation of every test of its suite ("scaler/<name>",
//   "optimizer/<name>"). A factory that throws (a wrong plugin folder, component name or option)
//   makes each of that component's tests fail with its message: unlike a backend's, no machine
//   lacks what a scaler or optimizer needs, so there is nothing to skip.
// - A program may register only scalers and optimizers, no backend: it passes (exit 0) when they
//   do.
// - The optimizer suite runs on set_reference()'s backend (backend_conformance.h), the CPU
//   backend in practice: an optimizer author calls set_reference() too.
// - Scalers (ScalerConformance): update(true) never applies a step; the scale is a finite number
//   above 0 through long runs of overflows and of clean steps; a decision's scale_before and
//   scale_after are scale() before and after; the state saved at any step replays the same
//   decisions in a new scaler; an update() undone by load_state() leaves no trace (the gated
//   update's rule).
// - Optimizers (OptimizerConformance), on parameters with bf16 and fp16 working copies, one
//   without, and one without weight decay: after each step every working copy holds its master
//   rounded to its dtype (RNE, bit for bit) and the masters moved; the state saved after a step
//   (state_tensors(), save_state()), loaded into a new optimizer, continues bit for bit; the state
//   tensors are fp32, each name once; step() with grad_scale s equals step() with the gradients
//   multiplied by s (within fp32 rounding); two runs from the same inputs give the same bits.
// - scaler_from_plugin(), optimizer_from_plugin(): a component of a plugin library as a config
//   would make it: a registry of their own scans `folders_or_files`, and the options are `options`
//   over the schema's defaults (sdk::ConfigError, as for a config, for a wrong one).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/optimizer.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::conformance {

using ScalerFactory = std::function<std::shared_ptr<sdk::LossScaler>()>;
using OptimizerFactory = std::function<std::shared_ptr<sdk::Optimizer>()>;

template <class Factory>
struct ComponentUnderTest {
  std::string name;  // test-name suffix
  Factory make;
};
template <class Factory>
void PrintTo(const ComponentUnderTest<Factory>& c, std::ostream* os) {
  *os << c.name;
}

void add_scaler(std::string name, ScalerFactory make);
void add_optimizer(std::string name, OptimizerFactory make);
const std::vector<ComponentUnderTest<ScalerFactory>>& registered_scalers();
const std::vector<ComponentUnderTest<OptimizerFactory>>& registered_optimizers();

// The scaler or optimizer `name` of a plugin that the registry finds in `folders_or_files`, each
// call a new one (sdk::PluginError when no plugin there offers it).
ScalerFactory scaler_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                 std::string name,
                                 std::map<std::string, sdk::OptionValue> options = {});
OptimizerFactory optimizer_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                       std::string name,
                                       std::map<std::string, sdk::OptionValue> options = {});

}  // namespace mixtrain::conformance
