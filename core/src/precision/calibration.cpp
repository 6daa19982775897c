// calibrate: FP32 training steps with every op's tensors measured; see calibration.h.
#include "mixtrain/core/precision/calibration.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>

#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/precision/planning.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/policy_block_scaling.h"

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

// The configured block-scaled policy's own layouts per node and tensor, in place of its format's
// defaults (the other formats keep theirs: they are measured for comparison).
struct ConfiguredLayouts {
  std::size_t format = 0;  // index in kBlockFormats
  std::map<std::size_t, std::map<CalibratedTensor, sdk::BlockScaledLayout>> of_node;
};

// Copies what the executor hands over to the host and measures it, per node and tensor; one
// optimizer step's measurements (its micro-batches) are folded into one before they join the
// aggregate, so step_amax has one entry per step.
class TensorObserver final : public StepObserver {
 public:
  void after_forward(Model& model, std::size_t node, Extent e) override {
    Layer& op = *model.layers()[node];
    Executor& exec = model.executor();
    if (op.has_gemm()) {
      clear();
      for (TensorId t : model.plan().node(node).inputs) append(model, exec.activation(t, e));
      record(node, CalibratedTensor::gemm_input, false);
      record_blocks(node, CalibratedTensor::gemm_input, BlockRole::activation);
      clear();
      for (ModelParameter* p : op.used_parameters())
        if (p->value().shape.rank >= 2) append(model, p->value());
      record(node, CalibratedTensor::weight, false);
      record_blocks(node, CalibratedTensor::weight, BlockRole::weight);
    }
    const TensorView out = exec.activation(TensorId::node(node), e);
    if (out.data != nullptr) {
      clear();
      append(model, out);
      record(node, CalibratedTensor::activation, false);
    }
  }

  void after_backward(Model& model, std::size_t node, Extent e,
                      std::span<const TensorView> input_grads) override {
    clear();
    for (const TensorView& dx : input_grads)
      if (!dx.empty()) append(model, dx);
    record(node, CalibratedTensor::activation_grad, true);
    if (model.layers()[node]->has_gemm()) {
      Executor& exec = model.executor();
      clear();
      append(model, exec.gradient(TensorId::node(node), e, exec.planned_gradients()));
      record(node, CalibratedTensor::output_grad, true);
      record_blocks(node, CalibratedTensor::output_grad, BlockRole::activation);
    }
  }

  void after_step(std::int64_t /*step*/) override {
    ++steps_done_;
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
  const std::optional<BlockRangeStatistics>& blocks(std::size_t node, CalibratedTensor t) {
    return blocks_[node][static_cast<std::size_t>(t)];
  }

  // Measures the block statistics of these nodes' GEMM operands on every `stride`-th step,
  // the first included.
  void measure_blocks_of(std::set<std::size_t> nodes, std::int64_t stride,
                         std::optional<ConfiguredLayouts> configured) {
    block_nodes_ = std::move(nodes);
    block_stride_ = std::max<std::int64_t>(stride, 1);
    configured_ = std::move(configured);
  }
  std::int64_t block_steps() const { return block_steps_; }

 private:
  using Slots = std::array<std::optional<RangeStatistics>, kTensorKinds>;
  using BlockSlots = std::array<std::optional<BlockRangeStatistics>, kTensorKinds>;

  // Appends the view's values to host_, and its shape as a GEMM operand (leading dims folded).
  void append(Model& model, const TensorView& v) {
    if (v.data == nullptr || v.dtype != DType::fp32) return;
    const std::size_t at = host_.size();
    host_.resize(at + static_cast<std::size_t>(v.numel()));
    model.backend().copy_to_host(host_.data() + at, v);
    shapes_.push_back({at, v.shape.rows(), v.shape.cols()});
  }

  void clear() {
    host_.clear();
    shapes_.clear();
  }

  // Each appended view is its own tensor to the block statistics (its own per-tensor scale).
  void record_blocks(std::size_t node, CalibratedTensor t, BlockRole role) {
    if (!block_nodes_.count(node) || steps_done_ % block_stride_ != 0) return;
    if (last_block_step_ != steps_done_) {
      ++block_steps_;
      last_block_step_ = steps_done_;
    }
    auto& slot = blocks_[node][static_cast<std::size_t>(t)];
    BlockLayouts layouts = default_block_layouts(role);
    if (configured_)
      if (auto n = configured_->of_node.find(node); n != configured_->of_node.end())
        if (auto l = n->second.find(t); l != n->second.end())
          layouts[configured_->format] = l->second;
    for (const OperandShape& v : shapes_) {
      const std::span<const float> values(host_.data() + v.offset,
                                          static_cast<std::size_t>(v.rows * v.cols));
      BlockRangeStatistics measured = measure_blocks(values, v.rows, v.cols, layouts);
      if (slot)
        merge(*slot, measured);
      else
        slot = measured;
    }
  }

  struct OperandShape {
    std::size_t offset;
    std::int64_t rows, cols;
  };

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
  std::vector<OperandShape> shapes_;
  std::map<std::size_t, Slots> step_, total_;
  std::map<std::size_t, BlockSlots> blocks_;
  std::set<std::size_t> block_nodes_;
  std::optional<ConfiguredLayouts> configured_;
  std::int64_t block_stride_ = 1, steps_done_ = 0, block_steps_ = 0, last_block_step_ = -1;
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
  fp32.escalate = {};        // nothing to promote in fp32, and the plan must stay the measured one
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
std::optional<ConfiguredLayouts> plan_ops(const Experiment& experiment,
                                          const PluginRegistry& registry, Trainer& trainer,
                                          const std::shared_ptr<sdk::DeviceBackend>& backend,
                                          const sdk::Logger& log, Calibration& out) {
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
  plan_precision(planned, *policy, backend->capabilities(), experiment.overrides, log);
  out.config_overrides = experiment.overrides;
  // "auto" chose a policy for this backend; the rules judged that one's plan, and a file naming
  // "auto" could mean another policy (fp16-mixed, unchecked) on the next backend.
  if (const std::string chosen = policy->resolved_name(); !chosen.empty()) out.policy = chosen;
  out.policy_needs_loss_scaling = policy->needs_loss_scaling();
  for (const auto& [key, value] : experiment.policy_options.effective())
    if (key == "fp8_format" && std::holds_alternative<std::string>(value) &&
        std::get<std::string>(value) == "e4m3")
      out.fp8_gradient = sdk::DType::fp8_e4m3;
  const auto* facet = dynamic_cast<const sdk::BlockScalingFacet*>(policy.get());
  std::optional<ConfiguredLayouts> configured;
  if (facet != nullptr)
    for (std::size_t f = 0; f < kBlockFormats.size(); ++f)
      if (experiment.policy_name == block_format_name(kBlockFormats[f])) {
        out.block_format = kBlockFormats[f];
        configured.emplace().format = f;
      }
  std::size_t node = 0;
  for (const auto& l : planned.layers()) {
    const std::size_t i = node++;  // the trainer's model has the same nodes, in the same order
    // The operands as the measurement reads them (block_range_statistics.h): x and W as the
    // forward GEMM quantizes them, dy as the data-gradient GEMM does, all along their cols.
    if (configured && !l->is_view() && l->has_gemm()) {
      const std::string gemm = l->description().gemms.front().name;  // description() is a value
      auto layout = [&](sdk::OperandRole role, sdk::GemmPass pass) {
        return facet
            ->operand_plan(sdk::OperandSlot(l->name(), gemm, role), pass, sdk::ReductionAxis::cols)
            .layout;
      };
      auto& of = configured->of_node[i];
      of[CalibratedTensor::gemm_input] = layout(sdk::OperandRole::input, sdk::GemmPass::forward);
      of[CalibratedTensor::weight] = layout(sdk::OperandRole::weight, sdk::GemmPass::forward);
      of[CalibratedTensor::output_grad] =
          layout(sdk::OperandRole::grad_output, sdk::GemmPass::dgrad);
    }
    if (l->is_view()) continue;
    OpCalibration op;
    op.node = l->name();
    op.type = l->type();
    op.precision_sensitive = l->precision_sensitive();
    op.has_gemm = l->has_gemm();
    op.planned = l->precision();
    // The probe hands no facet (inactive); the model is this function's and goes with it.
    op.block_path =
        l->has_gemm() && l->description().has_weight_gemm() && l->set_block_scaling(nullptr);
    out.ops.push_back(std::move(op));
  }
  return configured;
}

// Each block-scaled policy's plan of the model, with its default options and the config's
// overrides, as the trainer would make it (its plan-time refusals included), or the refusal.
void plan_block_policies(const Experiment& experiment, const PluginRegistry& registry,
                         const Trainer& trainer, const std::shared_ptr<sdk::DeviceBackend>& backend,
                         Calibration& out) {
  const Model& m = trainer.model();
  InputSpec input;
  input.dtype = m.input_dtype();
  input.labels_per_sample = m.labels_per_sample();
  input.sample_shape = trainer.train_data().sample_shape;
  for (BlockFormat f : kBlockFormats) {
    const std::string name = block_format_name(f);
    if (registry.find(sdk::ComponentKind::policy, name) == nullptr) continue;
    BlockPolicyPlan plan;
    plan.format = f;
    try {
      auto policy = registry.create<sdk::PrecisionPolicy>(
          registry.require(sdk::ComponentKind::policy, name),
          default_options(registry, sdk::ComponentKind::policy, name, "precision"));
      Model planned(backend, experiment.model, m.input_features(), m.classes(), input);
      plan_precision(planned, *policy, backend->capabilities(), experiment.overrides, {});
      planned.check_backend();
      for (const auto& l : planned.layers())
        if (!l->is_view()) plan.planned.push_back(l->precision());
    } catch (const sdk::UserError& e) {
      plan.refused = e.what();
      plan.planned.clear();
    }
    out.block_policies.push_back(std::move(plan));
  }
}

// Each node's measured tensors, beside its plan.
void record_tensors(const Trainer& trainer, TensorObserver& observer, Calibration& out) {
  out.block_steps = observer.block_steps();
  const auto& layers = trainer.model().layers();
  std::size_t listed = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (layers[i]->is_view()) continue;
    OpCalibration& op = out.ops.at(listed++);
    for (std::size_t k = 0; k < kTensorKinds; ++k) {
      const auto t = static_cast<CalibratedTensor>(k);
      if (const auto& s = observer.total(i, t))
        op.tensors.push_back({t, *s, observer.blocks(i, t)});
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
  auto configured = plan_ops(experiment, registry, trainer, backend, log, out);
  bool fp8_gemm = false;
  for (const auto& op : out.ops)
    fp8_gemm = fp8_gemm || (op.has_gemm && sdk::is_fp8(op.planned.gemm_input));
  out.block_report = options.blocks || fp8_gemm;
  if (out.block_report) {
    plan_block_policies(experiment, registry, trainer, backend, out);
    std::set<std::size_t> nodes;
    const auto& layers = trainer.model().layers();
    std::size_t listed = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      if (layers[i]->is_view()) continue;
      if (out.ops.at(listed++).block_path) nodes.insert(i);
    }
    const std::int64_t steps = std::min(options.steps, experiment.run.steps);
    observer.measure_blocks_of(std::move(nodes),
                               (steps + kBlockSampleSteps - 1) / kBlockSampleSteps,
                               std::move(configured));
  }

  const TrainSummary run = trainer.run();
  out.steps = run.steps;
  // Ranges of NaN and inf say nothing about which format holds the values (their amax reads 0):
  // a recommendation from them would be a guess written as a measurement.
  const std::int64_t asked = std::min(options.steps, experiment.run.steps);
  if (run.skipped_steps > 0 || run.steps < asked)
    throw sdk::UserError(
        "the FP32 run calibration measures did not stay finite: " +
            std::to_string(run.skipped_steps) + " of its " + std::to_string(run.steps) + " step" +
            (run.steps == 1 ? "" : "s") + " had non-finite gradients" +
            (run.steps < asked ? ", and it stopped after step " + std::to_string(run.steps) +
                                     " of " + std::to_string(asked)
                               : std::string()) +
            "; no precision can be chosen from NaN and inf",
        "make the model finite in fp32 first (lower optimizer.lr, check the data and the "
        "layers' init), then calibrate again");
  record_tensors(trainer, observer, out);
  return out;
}

}  // namespace mixtrain::core
