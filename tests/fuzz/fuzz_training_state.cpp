// Fuzzes the decoding of a checkpoint's training state, the step after the native reader
// (fuzz_checkpoint_native) has accepted the file: the "mixtrain.state_version", "progress" and
// "sampler" entries and the scaler's, optimizer's and policy's states, each range-checked by the
// core (checkpoint/state.h) and then loaded into a real component of this build's plugins, as
// Trainer::load_checkpoint does on --resume.
//
// Input: one JSON object {"mixtrain.state_version": "1", "progress": {...}, "sampler": {...},
// "scaler": {...}, "optimizer": {...}, "policy": {...}}; the component states as
// component_state_to_json writes them. Each role's component is the one its "component" names
// when this build has it (else dynamic / adamw / fp8-delayed), so one corpus reaches every
// scaler, optimizer and policy. sdk::UserError and nlohmann::json::exception are expected
// rejections (the trainer turns the latter into a CheckpointError); anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/state.h"
#include "fuzz_support.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/optimizer.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/precision_policy.h"

namespace {

namespace core = mixtrain::core;
namespace sdk = mixtrain::sdk;
using json = nlohmann::json;

const core::PluginRegistry& registry() {
  static const auto* r = [] {
    auto* reg = new core::PluginRegistry();
    reg->scan({MIXTRAIN_FUZZ_PLUGIN_DIR});
    if (reg->components().empty()) __builtin_trap();  // a broken build, not a finding
    return reg;
  }();
  return *r;
}

// A fresh component of `kind`: the one `state` names if this build has it, else `fallback`.
template <class T>
std::shared_ptr<T> component_for(const json& state, sdk::ComponentKind kind,
                                 const std::string& fallback, std::string& name) {
  name = fallback;
  if (state.is_object() && state.contains("component") && state["component"].is_string()) {
    const auto wanted = state["component"].get<std::string>();
    for (const auto& c : registry().components())
      if (c.info.kind == kind && c.info.name == wanted) name = wanted;
  }
  const auto& component = registry().require(kind, name);
  const auto defaults = sdk::Options::resolve("fuzz", component.info.options, {}, {});
  return registry().create<T>(component, defaults);
}

constexpr std::int64_t kRunSteps = 1000;
constexpr std::int64_t kBatchesPerEpoch = 57;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path file = "fuzz.mxt";
  std::shared_ptr<sdk::LossScaler> scaler;
  std::shared_ptr<sdk::PrecisionPolicy> policy;
  try {
    const auto j = json::parse(mixtrain::fuzz::as_view(data, size));
    if (!j.is_object()) return 0;
    std::map<std::string, std::string> metadata;
    if (auto it = j.find("mixtrain.state_version"); it != j.end() && it->is_string())
      metadata["mixtrain.state_version"] = it->get<std::string>();
    core::check_training_state_version(metadata, file);
    const auto progress = core::read_progress(j.at("progress"), kRunSteps, file);
    (void)core::read_sampler_cursor(j.at("sampler"), progress.step, kBatchesPerEpoch, file);
    std::string name;
    auto load = [&](const char* role, auto& component) {
      auto state = core::component_state_from_json(j.at(role), role, name, file);
      core::check_component_counters(state, role, progress, file);
      component->load_state(state);
    };
    auto optimizer = component_for<sdk::Optimizer>(j.at("optimizer"), sdk::ComponentKind::optimizer,
                                                   "adamw", name);
    load("optimizer", optimizer);
    scaler =
        component_for<sdk::LossScaler>(j.at("scaler"), sdk::ComponentKind::scaler, "dynamic", name);
    load("scaler", scaler);
    policy = component_for<sdk::PrecisionPolicy>(j.at("policy"), sdk::ComponentKind::policy,
                                                 "fp8-delayed", name);
    load("policy", policy);
  } catch (const sdk::UserError&) {
    return 0;
  } catch (const json::exception&) {
    return 0;
  }
  // Accepted: the state a component saves next (the next checkpoint) must load again. A refusal
  // here escapes as an uncaught exception, a finding.
  scaler->load_state(scaler->save_state());
  policy->load_state(policy->save_state());
  return 0;
}
