// The component conformance kit: the GoogleTest suites a loss scaler, an optimizer, a precision
// policy or a checkpoint format must pass, whatever its algorithm. They check what the host relies
// on (sdk/loss_scaler.h, sdk/optimizer.h, sdk/precision_policy.h, sdk/checkpoint_format.h), not
// the numbers an algorithm gives.
//
// Contract
// - Before RUN_ALL_TESTS, a program calls add_scaler(), add_optimizer(), add_policy() and
//   add_checkpoint_format() once per component under test; each becomes one instantiation of
//   every test of its suite ("scaler/<name>", "optimizer/<name>", "policy/<name>",
//   "checkpoint_format/<name>"). A factory that throws (a wrong plugin folder, component name or
//   option) makes each of that component's tests fail with its message: unlike a backend's, no
//   machine lacks what these components need, so there is nothing to skip.
// - A program may register only components, no backend: it passes (exit 0) when they do.
// - The optimizer suite runs on set_reference()'s backend (backend_conformance.h), the CPU
//   backend in practice: an optimizer author calls set_reference() too.
// - The policy and checkpoint format suites train small models through the host (core::Trainer)
//   with the component under test in place of the configured one: the CPU backend, the built-in
//   policies, scalers, optimizers and native format come from set_plugin_search_path()'s folders
//   (backend_conformance.h; mixtrain's installed plugin folder, MIXTRAIN_PLUGIN_DIR in CMake).
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
// - add_*() take test names of letters, digits and '_', each once per kind (std::invalid_argument
//   otherwise). A program that forgets set_plugin_search_path() fails the policy and format
//   suites with a message that says to call it.
// - Policies (PolicyConformance): an MLP trains under the policy (its loss falls by at least half
//   of what the same run's falls in FP32), and
//   so do a small GPT and a small CNN unless the host refuses the plan with a ConfigError (a policy
//   may leave an op kind out: the test says which); plan() gives every op the host described the
//   same dtypes twice and in a new policy, all floating; a policy that plans fp16 needs a loss
//   scaler; scaled operands (FP8) get an fp8 dtype and a finite scale above 0 with scale_inv its
//   inverse, whatever amax was recorded (0, inf and NaN included), and a saved state gives a new
//   policy the same scales; a run resumed from a checkpoint repeats the uninterrupted run's
//   losses bit for bit, and two runs give the same bits.
// - Checkpoint formats (CheckpointFormatConformance): the extension is a dot and letters, digits,
//   '_' or '-', and no other format's in the plugin search path (the host refuses both); a full
//   state's round trip (every dtype, a scalar, an empty tensor, a host training state) gives back
//   every tensor and metadata entry bit for bit, unless the format marks what it reads as weights
//   only ("mixtrain.weights_only"); a run resumed from its file repeats the uninterrupted losses
//   bit for bit (full states), and a run started from its weights evaluates as the run that wrote
//   them; a write replaces the file whole and leaves no other file, and one that cannot be made (a
//   missing folder) is a CheckpointError; reading a missing file, a folder, an empty file, random
//   bytes or any truncation of a good file is a CheckpointError naming the file, and a damaged
//   byte is that or a state whose tensors' bytes fit their shapes, never a crash. A format with the
//   streamed_write facet (sdk/format_streamed_write.h) writes through it the file write() writes,
//   byte for byte, asking for each tensor at most twice with a buffer exactly its size, and
//   whether the host fills that buffer or hands out bytes it holds; an exception from the host's
//   reader comes out unchanged, with the old file whole and no other file left.
// - scaler_from_plugin(), optimizer_from_plugin(), policy_from_plugin(),
//   checkpoint_format_from_plugin(): a component of a plugin library as a config would make it: a
//   registry of their own scans `folders_or_files`, and the options are `options` over the
//   schema's defaults (sdk::ConfigError, as for a config, for a wrong one).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/optimizer.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::conformance {

using ScalerFactory = std::function<std::shared_ptr<sdk::LossScaler>()>;
using OptimizerFactory = std::function<std::shared_ptr<sdk::Optimizer>()>;
using PolicyFactory = std::function<std::shared_ptr<sdk::PrecisionPolicy>()>;
using CheckpointFormatFactory = std::function<std::shared_ptr<sdk::CheckpointFormat>()>;

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
void add_policy(std::string name, PolicyFactory make);
void add_checkpoint_format(std::string name, CheckpointFormatFactory make);
const std::vector<ComponentUnderTest<PolicyFactory>>& registered_policies();
const std::vector<ComponentUnderTest<CheckpointFormatFactory>>& registered_checkpoint_formats();

// The scaler or optimizer `name` of a plugin that the registry finds in `folders_or_files`, each
// call a new one (sdk::PluginError when no plugin there offers it).
ScalerFactory scaler_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                 std::string name,
                                 std::map<std::string, sdk::OptionValue> options = {});
OptimizerFactory optimizer_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                       std::string name,
                                       std::map<std::string, sdk::OptionValue> options = {});
PolicyFactory policy_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                 std::string name,
                                 std::map<std::string, sdk::OptionValue> options = {});
CheckpointFormatFactory checkpoint_format_from_plugin(
    std::vector<std::filesystem::path> folders_or_files, std::string name,
    std::map<std::string, sdk::OptionValue> options = {});

}  // namespace mixtrain::conformance
