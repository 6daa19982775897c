// calibrate: FP32 training steps with every op's tensors measured; see calibration.h.
#include "mixtrain/core/precision/calibration.h"

#include <array>
#include <map>
#include <optional>

#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/precision/planning.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::TensorView;

const char* calibrated_tensor_name(CalibratedTensor t) {
  switch (t) {
    case CalibratedTensor::gemm_input:
      return "gemm_input";
    case CalibratedTensor::weight:
      return "weight";
    case CalibratedTensor::activation:
      return "activation";
    case CalibratedTensor::activation_grad:
      return "activation_grad";
    case CalibratedTensor::output_grad:
      return "output_grad";
  }
  return "?";
}

bool is_gradient(CalibratedTensor t) {
  return t == CalibratedTensor::activation_grad || t == CalibratedTensor::output_grad;
}

const TensorCalibration* OpCalibration::find(CalibratedTensor t) const {
  for (const auto& c : tensors)
    if (c.tensor == t) return &c;
  return nullptr;
}

namespace {

constexpr std::size_t kTensorKinds = 5;

// The component's options with every default, as if its table were empty.
sdk::Options default_options(const PluginRegistry& registry, sdk::ComponentKind kind,
                             const std::string& name, const std::string& table) {
  return sdk::Options::resolve(table, registry.require(kind, name).info.options, {}, {});
}

// Copies what the executor hands over to the host and measures it, per node and tensor; one
// optimizer step's measurements (its micro-batches) are folded into one before they join the
// aggregate, so step_amax has one entry per step.
class TensorObserver final : public StepObserver {
 public:
  void after_forward(Model& model, std::size_t node, Extent e) override {
    Layer& op = *model.layers()[node];
    Executor& exec = model.executor();
    if (op.has_gemm()) {
      host_.clear();
      for (TensorId t : model.plan().node(node).inputs) append(model, exec.activation(t, e));
      record(node, CalibratedTensor::gemm_input, false);
      host_.clear();
      for (ModelParameter* p : op.used_parameters())
        if (p->value().shape.rank >= 2) append(model, p->value());
      record(node, CalibratedTensor::weight, false);
    }
    const TensorView out = exec.activation(TensorId::node(node), e);
    if (out.data != nullptr) {
      host_.clear();
      append(model, out);
      record(node, CalibratedTensor::activation, false);
    }
  }

  void after_backward(Model& model, std::size_t node, Extent e,
                      std::span<const TensorView> input_grads) override {
    host_.clear();
    for (const TensorView& dx : input_grads)
      if (!dx.empty()) append(model, dx);
    record(node, CalibratedTensor::activation_grad, true);
    if (model.layers()[node]->has_gemm()) {
      Executor& exec = model.executor();
      host_.clear();
      append(model, exec.gradient(TensorId::node(node), e, exec.planned_gradients()));
      record(node, CalibratedTensor::output_grad, true);
    }
  }

  void after_step(std::int64_t /*step*/) override {
    for (auto& [node, slots] : step_)
      for (std::size_t k = 0; k < kTensorKinds; ++k) {
        auto& s = slots[k];
        if (!s) continue;
        s->step_amax.assign(1, s->amax);
        auto& total = total_[node][k];
        if (total)
          merge(*total, *s);
        else
          total = std::move(s);
        s.reset();
      }
  }

  const std::optional<RangeStatistics>& total(std::size_t node, CalibratedTensor t) {
    return total_[node][static_cast<std::size_t>(t)];
  }

 private:
  using Slots = std::array<std::optional<RangeStatistics>, kTensorKinds>;

  void append(Model& model, const TensorView& v) {
    if (v.data == nullptr || v.dtype != DType::fp32) return;
    const std::size_t at = host_.size();
    host_.resize(at + static_cast<std::size_t>(v.numel()));
    model.backend().copy_to_host(host_.data() + at, v);
  }

  void record(std::size_t node, CalibratedTensor t, bool loss_scales) {
    if (host_.empty()) return;
    RangeStatistics measured = measure_range(host_, loss_scales);
    auto& slot = step_[node][static_cast<std::size_t>(t)];
    if (slot)
      merge(*slot, measured);
    else
      slot = std::move(measured);
  }

  std::vector<float> host_;
  std::map<std::size_t, Slots> step_, total_;
};

}  // namespace

namespace {

// The run calibration measures: the config in FP32, unscaled, with nothing promoted, evaluated,
// checkpointed or stopped early.
Experiment fp32_experiment(const Experiment& experiment, const PluginRegistry& registry) {
  Experiment fp32 = experiment;
  fp32.policy_name = "fp32";
  fp32.policy_options = default_options(registry, sdk::ComponentKind::policy, "fp32", "precision");
  fp32.scaler_type = "none";
  fp32.scaler_options = default_options(registry, sdk::ComponentKind::scaler, "none", "scaler");
  fp32.overrides.clear();
  fp32.escalate = {};  // nothing to promote in fp32, and the plan must stay the measured one
  fp32.unused_keys.clear();  // said once, by the config's own run
  fp32.config_warnings.clear();
  fp32.run.eval_every = 0;
  fp32.run.underflow_every = 0;
  fp32.run.early_stopping_patience = 0;
  fp32.checkpoint.every = 0;
  fp32.checkpoint.keep_best.clear();
  return fp32;
}

// What the config's own policy plans for each node, asked as the trainer asks it.
void plan_ops(const Experiment& experiment, const PluginRegistry& registry, Trainer& trainer,
              const std::shared_ptr<sdk::DeviceBackend>& backend, const sdk::Logger& log,
              Calibration& out) {
  out.policy = experiment.policy_name;
  const Model& m = trainer.model();
  InputSpec input;
  input.dtype = m.input_dtype();
  input.labels_per_sample = m.labels_per_sample();
  input.sample_shape = trainer.train_data().sample_shape;
  // The policy outlives the model: an FP8 plan leaves it as the layers' operand scaler.
  auto policy = registry.create<sdk::PrecisionPolicy>(
      registry.require(sdk::ComponentKind::policy, experiment.policy_name),
      experiment.policy_options);
  Model planned(backend, experiment.model, m.input_features(), m.classes(), input);
  plan_precision(planned, *policy, backend->capabilities(), {}, log);
  out.policy_needs_loss_scaling = policy->needs_loss_scaling();
  for (const auto& l : planned.layers()) {
    if (l->is_view()) continue;
    OpCalibration op;
    op.node = l->name();
    op.type = l->type();
    op.precision_sensitive = l->precision_sensitive();
    op.has_gemm = l->has_gemm();
    op.planned = l->precision();
    out.ops.push_back(std::move(op));
  }
}

// Each node's measured tensors, beside its plan.
void record_tensors(const Trainer& trainer, TensorObserver& observer, Calibration& out) {
  const auto& layers = trainer.model().layers();
  std::size_t listed = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (layers[i]->is_view()) continue;
    OpCalibration& op = out.ops.at(listed++);
    for (std::size_t k = 0; k < kTensorKinds; ++k) {
      const auto t = static_cast<CalibratedTensor>(k);
      if (const auto& s = observer.total(i, t)) op.tensors.push_back({t, *s});
    }
  }
}

}  // namespace

Calibration calibrate(const Experiment& experiment, const PluginRegistry& registry,
                      const CalibrationOptions& options) {
  if (options.steps < 1)
    throw sdk::UserError(
        "calibration needs at least one step; --steps is " + std::to_string(options.steps),
        "give --steps N with N >= 1 (the default is 50)");
  const sdk::Logger log = core_logger("calibrate");
  Experiment fp32 = fp32_experiment(experiment, registry);
  Components components = create_components(fp32, registry);
  const auto backend = components.backend;

  TensorObserver observer;
  TrainOptions train_options;
  train_options.write_outputs = false;
  train_options.observer = &observer;
  train_options.step_limit = options.steps;
  // Builds the model in FP32 on the configured backend: a node the backend cannot run stops here,
  // and the message says that FP32 is what calibration asked for (its hint may offer a policy
  // change, which does not apply to the calibration run itself).
  std::optional<Trainer> built;
  try {
    built.emplace(fp32, std::move(components), train_options);
  } catch (const sdk::ConfigError& e) {
    throw sdk::UserError(std::string("calibration runs the model in FP32 on backend '") +
                             experiment.backend_type + "', which fails: " + e.what(),
                         e.hint().empty() ? "use a backend that runs every node in fp32"
                                          : e.hint() + " (calibration itself always runs fp32)");
  }
  Trainer& trainer = *built;
  if (options.steps > experiment.run.steps)
    log.info("calibrating " + std::to_string(experiment.run.steps) +
             " steps: the config's run.steps, fewer than --steps " + std::to_string(options.steps));

  Calibration out;
  plan_ops(experiment, registry, trainer, backend, log, out);

  out.steps = trainer.run().steps;
  record_tensors(trainer, observer, out);
  return out;
}

}  // namespace mixtrain::core
