// mixtrain's own conformance run: every backend plugin in the build's plugin folder, checked
// against the CPU backend (a backend whose factory fails here, no device, is skipped, visibly),
// and the built-in scalers, optimizers, precision policies and checkpoint formats through the
// component kit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "mixtrain/conformance/backend_conformance.h"
#include "mixtrain/conformance/component_conformance.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"

// Backends the kit must fail (faulty_backends_fail.sh).
#include "faulty_backends.h"

// The samples a plugin author starts from (samples/), compiled in: they must pass the kit too.
#include "adaptive_loss_scaler.h"
#include "bf16_except_policy.h"
#include "lion_optimizer.h"

namespace {

using namespace mixtrain;

// Components that break the kit's contracts, registered only with MIXTRAIN_CONFORMANCE_FAULTS=1
// (faulty_components_fail.sh): the kit must fail them.
class AppliesOverflows final : public sdk::LossScaler {
 public:
  float scale() const override { return 1024.0f; }
  sdk::ScalerDecision update(bool) override { return {true, 1024.0f, 1024.0f}; }
  sdk::ComponentState save_state() const override { return {}; }
  void load_state(const sdk::ComponentState&) override {}
};

// SGD whose step leaves the working copies as they were.
class StaleWorkingCopies final : public sdk::Optimizer {
 public:
  explicit StaleWorkingCopies(std::shared_ptr<sdk::Optimizer> sgd) : sgd_(std::move(sgd)) {}
  double base_lr() const override { return sgd_->base_lr(); }
  void bind(sdk::DeviceBackend& b, std::span<const sdk::Parameter> params) override {
    sgd_->bind(b, params);
  }
  void step(sdk::DeviceBackend& b, std::span<const sdk::Parameter> params,
            const sdk::StepContext& ctx) override {
    std::vector<std::vector<std::byte>> kept;
    for (const auto& p : params) {
      kept.emplace_back(p.tensors.working.data ? p.tensors.working.bytes() : 0);
      if (p.tensors.working.data) b.copy_to_host(kept.back().data(), p.tensors.working);
    }
    sgd_->step(b, params, ctx);
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i].tensors.working.data)
        b.copy_from_host(params[i].tensors.working, kept[i].data());
  }
  std::vector<sdk::NamedTensorView> state_tensors() const override { return sgd_->state_tensors(); }
  sdk::ComponentState save_state() const override { return sgd_->save_state(); }
  void load_state(const sdk::ComponentState& s) override { sgd_->load_state(s); }

 private:
  std::shared_ptr<sdk::Optimizer> sgd_;
};

// bf16-mixed that plans fp16 for the head but says it needs no loss scaler.
class Fp16WithoutScaler final : public sdk::PrecisionPolicy {
 public:
  sdk::OpPrecision plan(const sdk::OpDescription& op) const override {
    const sdk::DType t = op.name == "head" ? sdk::DType::fp16 : sdk::DType::bf16;
    return {t, t, t, t};
  }
  bool needs_loss_scaling() const override { return false; }
};

// FP8 GEMM operands scaled by 448 / the last amax, unguarded: an amax of 0 gives an infinite scale.
class UnguardedFp8Scale final : public sdk::PrecisionPolicy {
 public:
  sdk::OpPrecision plan(const sdk::OpDescription& op) const override {
    sdk::OpPrecision p{sdk::DType::bf16, sdk::DType::bf16, sdk::DType::bf16, sdk::DType::bf16};
    if (op.has_weight_gemm()) p.gemm_input = sdk::DType::fp8_e4m3;
    return p;
  }
  bool needs_loss_scaling() const override { return false; }
  bool uses_scaled_operands() const override { return true; }
  sdk::OperandScaling operand_scaling(const sdk::OperandSlot& slot) override {
    const float amax = amax_.count(slot.name()) ? amax_[slot.name()] : 1.0f;
    return {sdk::DType::fp8_e4m3, 448.0f / amax, amax / 448.0f};
  }
  void record_amax(const sdk::OperandSlot& slot, float amax) override { amax_[slot.name()] = amax; }

 private:
  std::map<std::string, float> amax_;
};

// The native format, reading an empty state where the file is damaged instead of refusing it.
class SwallowsDamage final : public sdk::CheckpointFormat {
 public:
  explicit SwallowsDamage(std::shared_ptr<sdk::CheckpointFormat> in) : in_(std::move(in)) {}
  std::string file_extension() const override { return in_->file_extension(); }
  void write(const std::filesystem::path& p, const sdk::TrainingState& s) const override {
    in_->write(p, s);
  }
  sdk::TrainingState read(const std::filesystem::path& p) const override {
    try {
      return in_->read(p);
    } catch (const sdk::CheckpointError&) {
      return {};
    }
  }

 private:
  std::shared_ptr<sdk::CheckpointFormat> in_;
};

// The native format, leaving a backup of what it overwrote beside the file.
class LeavesABackup final : public sdk::CheckpointFormat {
 public:
  explicit LeavesABackup(std::shared_ptr<sdk::CheckpointFormat> in) : in_(std::move(in)) {}
  std::string file_extension() const override { return in_->file_extension(); }
  void write(const std::filesystem::path& p, const sdk::TrainingState& s) const override {
    if (std::filesystem::exists(p)) std::filesystem::copy_file(p, p.string() + ".bak");
    in_->write(p, s);
  }
  sdk::TrainingState read(const std::filesystem::path& p) const override { return in_->read(p); }

 private:
  std::shared_ptr<sdk::CheckpointFormat> in_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace mixtrain;
  static core::PluginRegistry registry(&core::host_log_sink());
  registry.scan({MIXTRAIN_PLUGIN_DIR});
  conformance::set_plugin_search_path({MIXTRAIN_PLUGIN_DIR});
  auto factory = [](const core::LoadedComponent& c, std::vector<sdk::RawOption> raw = {}) {
    return [&c, raw]() {
      auto options = sdk::Options::resolve("backend", c.info.options, raw, {});
      return registry.create<sdk::DeviceBackend>(c, options);
    };
  };
  const auto& cpu = registry.require(sdk::ComponentKind::backend, "cpu");
  conformance::set_reference(factory(cpu));
  for (const auto& c : registry.components())
    if (c.info.kind == sdk::ComponentKind::backend && c.info.name != "cpu")
      conformance::add_backend(c.info.name, factory(c), {"backend.type=" + c.info.name});
  // The CPU backend on one thread: another accumulation order, so the suite's tolerances are
  // exercised even on a machine with no other backend; and flash attention's bf16 tile products
  // (P and dS rounded to bf16, as a GPU's flash attention does), which the reference takes only
  // on an AMX CPU.
  conformance::add_backend(
      "cpu_one_thread",
      factory(cpu, {{"threads", std::int64_t{1}, {}}, {"flash_products", std::string("bf16"), {}}}),
      {"backend.type=cpu", "backend.threads=1", "backend.flash_products=bf16"});
  // The built-in scalers and optimizers through the component kit, each as a config would make it.
  const std::vector<std::filesystem::path> plugins = {MIXTRAIN_PLUGIN_DIR};
  conformance::add_scaler("dynamic", conformance::scaler_from_plugin(plugins, "dynamic"));
  conformance::add_scaler("dynamic_hysteresis",
                          conformance::scaler_from_plugin(plugins, "dynamic",
                                                          {{"hysteresis", std::int64_t{3}},
                                                           {"growth_interval", std::int64_t{7}},
                                                           {"min_scale", 1.0}}));
  conformance::add_scaler("static", conformance::scaler_from_plugin(plugins, "static"));
  conformance::add_scaler("none", conformance::scaler_from_plugin(plugins, "none"));
  conformance::add_optimizer("sgd", conformance::optimizer_from_plugin(plugins, "sgd"));
  conformance::add_optimizer(
      "sgd_nesterov",
      conformance::optimizer_from_plugin(
          plugins, "sgd", {{"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}));
  conformance::add_optimizer("adamw", conformance::optimizer_from_plugin(plugins, "adamw"));
  conformance::add_scaler("sample_adaptive", [] {
    return std::make_shared<mixtrain_samples::AdaptiveLossScaler>(
        sdk::Options::resolve("scaler.adaptive",
                              mixtrain_samples::AdaptiveLossScaler::option_schema(), {}, {}),
        sdk::PluginContext{});
  });
  conformance::add_optimizer("sample_lion", [] {
    return std::make_shared<mixtrain_samples::LionOptimizer>(
        sdk::Options::resolve("optimizer.lion", mixtrain_samples::LionOptimizer::option_schema(),
                              {{"weight_decay", 0.1, {}}}, {}),
        sdk::PluginContext{});
  });
  // Test names take letters, digits and '_': "fp16-mixed" registers as fp16_mixed.
  const auto test_name = [](std::string name) {
    for (char& c : name)
      if (c == '-') c = '_';
    return name;
  };
  for (const char* policy : {"fp32", "tf32", "fp16-mixed", "bf16-mixed", "auto", "fp8-delayed",
                             "fp8-current", "fp8-block", "mxfp8", "nvfp4"})
    conformance::add_policy(test_name(policy), conformance::policy_from_plugin(plugins, policy));
  conformance::add_policy("sample_bf16_except", [] {
    return std::make_shared<mixtrain_samples::Bf16ExceptPolicy>(
        sdk::Options::resolve("precision.bf16-except",
                              mixtrain_samples::Bf16ExceptPolicy::option_schema(), {}, {}),
        sdk::PluginContext{});
  });
  for (const char* format : {"native", "safetensors"})
    conformance::add_checkpoint_format(format,
                                       conformance::checkpoint_format_from_plugin(plugins, format));
  if (const char* faults = std::getenv("MIXTRAIN_CONFORMANCE_FAULTS");
      faults != nullptr && std::strcmp(faults, "1") == 0) {
    conformance::add_scaler("faulty_applies_overflows",
                            [] { return std::make_shared<AppliesOverflows>(); });
    const auto sgd = conformance::optimizer_from_plugin(plugins, "sgd");
    conformance::add_optimizer("faulty_stale_working_copies",
                               [sgd] { return std::make_shared<StaleWorkingCopies>(sgd()); });
    // Factories that throw, as a typo makes them: their tests must fail, never skip.
    conformance::add_scaler("faulty_unknown_name",
                            conformance::scaler_from_plugin(plugins, "no_such_scaler"));
    conformance::add_optimizer(
        "faulty_unknown_option",
        conformance::optimizer_from_plugin(plugins, "sgd", {{"no_such_option", 1.0}}));
    conformance::add_policy("faulty_fp16_without_scaler",
                            [] { return std::make_shared<Fp16WithoutScaler>(); });
    conformance::add_policy("faulty_unguarded_fp8_scale",
                            [] { return std::make_shared<UnguardedFp8Scale>(); });
    const auto native = conformance::checkpoint_format_from_plugin(plugins, "native");
    conformance::add_checkpoint_format(
        "faulty_swallows_damage", [native] { return std::make_shared<SwallowsDamage>(native()); });
    conformance::add_checkpoint_format(
        "faulty_leaves_a_backup", [native] { return std::make_shared<LeavesABackup>(native()); });
    conformance::add_policy("faulty_unknown_policy",
                            conformance::policy_from_plugin(plugins, "no_such_policy"));
    for (auto& [name, make] : conformance::faults::faulty_backends(factory(cpu)))
      conformance::add_backend(name, std::move(make));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
