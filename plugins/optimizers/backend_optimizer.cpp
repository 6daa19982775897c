#include "backend_optimizer.h"

#include <stdexcept>

#include "mixtrain/sdk/error.h"

namespace mixtrain::optimizers {

BackendOptimizer::BackendOptimizer(std::string component, double lr,
                                   std::vector<std::string> slot_names, sdk::OptimizerOp kernel,
                                   sdk::OptimizerOp gated_kernel, const sdk::PluginContext& context)
    : logger_(context.logger),
      component_(std::move(component)),
      lr_(lr),
      slot_names_(std::move(slot_names)),
      kernel_(kernel),
      gated_kernel_(gated_kernel) {
  if (slot_names_.size() > kMaxSlots)
    throw std::logic_error("optimizer '" + component_ +
                           "' declares more state slots than "
                           "ParamTensors can carry");
}

BackendOptimizer::~BackendOptimizer() {
  release();
}

void BackendOptimizer::release() noexcept {
  if (backend_ != nullptr)
    for (auto& slots : slots_)
      for (auto& view : slots) backend_->deallocate(view.data);
  slots_.clear();
  param_names_.clear();
  backend_ = nullptr;
  kernels_ = nullptr;
  observer_ = nullptr;
  gated_ = false;
  awaits_settle_ = false;
}

void BackendOptimizer::bind(sdk::DeviceBackend& backend, std::span<const sdk::Parameter> params) {
  release();
  const std::string kernel(sdk::op_name(kernel_));
  sdk::Facet* found = backend.find_facet(sdk::OptimizerFacet::kName);
  auto refuse = [&](const std::string& why) {
    throw sdk::BackendError("optimizer '" + component_ + "' needs optimizer." + kernel +
                                ", which backend '" + backend.capabilities().kind +
                                "' does not provide: " + why,
                            "use a backend that offers it (`mixtrain plugins` lists them), or "
                            "an optimizer built from the foreach facet's ops");
  };
  const sdk::FacetVersion want{sdk::OptimizerFacet::kVersion.major, sdk::introduced_in(kernel_)};
  const std::string wanted =
      sdk::to_string(want) + " or a later " + std::to_string(want.major) + ".x";
  if (found == nullptr) refuse("it has no optimizer facet (this plugin needs " + wanted + ")");
  if (!sdk::facet_serves<sdk::OptimizerFacet>(found, want.minor))
    refuse("its optimizer facet is version " + sdk::to_string(found->version()) +
           ", this plugin needs " + wanted +
           ": rebuild the backend and this plugin against one SDK");
  auto* facet = static_cast<sdk::OptimizerFacet*>(found);
  // The gated kernel is an option: without it the host waits for the check and calls step().
  bool gated = sdk::facet_serves<sdk::OptimizerFacet>(found, sdk::introduced_in(gated_kernel_));
  for (const auto& p : params) {
    const sdk::DType dtypes[2] = {p.tensors.master.dtype, p.tensors.working.empty()
                                                              ? sdk::DType::fp32
                                                              : p.tensors.working.dtype};
    if (!facet->supports(kernel_, dtypes))
      refuse("it does not support " + kernel + " on " + std::string(sdk::dtype_name(dtypes[0])) +
             ", " + std::string(sdk::dtype_name(dtypes[1])) + " (parameter '" + p.name + "')");
    gated = gated && facet->supports(gated_kernel_, dtypes);
  }
  backend_ = &backend;
  kernels_ = facet;
  gated_ = gated;
  observer_ = sdk::facet<sdk::CallObserverFacet>(backend);
  std::size_t bytes = 0;
  for (const auto& p : params) {
    const auto& master = p.tensors.master;
    if (master.dtype != sdk::DType::fp32 || p.tensors.grad.dtype != sdk::DType::fp32 ||
        master.numel() != p.tensors.grad.numel())
      throw std::logic_error("optimizer '" + component_ + "': parameter '" + p.name +
                             "' needs fp32 master and grad tensors of equal size");
    param_names_.push_back(p.name);
    // Registered before allocating so release() frees what exists if a later call throws.
    auto& slots = slots_.emplace_back();
    for (std::size_t s = 0; s < slot_names_.size(); ++s) {
      slots[s] = sdk::TensorView{nullptr, sdk::DType::fp32, master.shape};
      slots[s].data = backend.allocate(slots[s].bytes());
      backend.fill(slots[s], 0.0f);
      bytes += slots[s].bytes();
    }
  }
  logger_.debug("bound " + std::to_string(params.size()) + " parameters, " + std::to_string(bytes) +
                " bytes of fp32 optimizer state");
}

sdk::FacetCall<sdk::OptimizerFacet> BackendOptimizer::kernels(const sdk::UpdateGate* gate) const {
  if (kernels_ == nullptr)
    throw std::logic_error("optimizer '" + component_ + "': step() before bind()");
  return {kernels_, observer_, sdk::op_name(gate != nullptr ? gated_kernel_ : kernel_)};
}

void BackendOptimizer::update_groups(std::span<const sdk::Parameter> params, float lr,
                                     float grad_scale, const sdk::UpdateGate* gate) {
  if (awaits_settle_)
    throw std::logic_error("optimizer '" + component_ +
                           "': a step before the last gated step was settled");
  const Groups groups = grouped(params);
  if (!groups.decayed.empty()) update(groups.decayed, true, lr, grad_scale, gate);
  if (!groups.undecayed.empty()) update(groups.undecayed, false, lr, grad_scale, gate);
}

void BackendOptimizer::step(sdk::DeviceBackend& /*backend: bind() kept its facet*/,
                            std::span<const sdk::Parameter> params, const sdk::StepContext& ctx) {
  update_groups(params, ctx.lr, ctx.grad_scale, nullptr);
  count_applied_step();
}

void BackendOptimizer::step_gated(sdk::DeviceBackend& /*backend: bind() kept its facet*/,
                                  std::span<const sdk::Parameter> params,
                                  const sdk::GatedStepContext& ctx) {
  if (!gated_)
    throw std::logic_error("optimizer '" + component_ +
                           "': step_gated() where can_gate() is false (or before bind())");
  const sdk::UpdateGate gate{ctx.status, ctx.max_norm};
  update_groups(params, ctx.lr, 1.0f, &gate);
  awaits_settle_ = true;
}

void BackendOptimizer::settle(bool applied) {
  if (!awaits_settle_)
    throw std::logic_error("optimizer '" + component_ + "': settle() without a gated step");
  awaits_settle_ = false;
  if (applied) count_applied_step();
}

BackendOptimizer::Groups BackendOptimizer::grouped(std::span<const sdk::Parameter> params) const {
  if (backend_ == nullptr || params.size() != param_names_.size())
    throw std::logic_error("optimizer '" + component_ + "': step() with " +
                           std::to_string(params.size()) + " parameters, bind() saw " +
                           std::to_string(param_names_.size()));
  Groups groups;
  for (std::size_t i = 0; i < params.size(); ++i) {
    sdk::ParamTensors t = params[i].tensors;
    t.state1 = slots_[i][0];
    t.state2 = slots_[i][1];
    (params[i].weight_decay ? groups.decayed : groups.undecayed).push_back(t);
  }
  return groups;
}

std::vector<sdk::NamedTensorView> BackendOptimizer::state_tensors() const {
  std::vector<sdk::NamedTensorView> out;
  for (std::size_t i = 0; i < param_names_.size(); ++i)
    for (std::size_t s = 0; s < slot_names_.size(); ++s)
      out.push_back({param_names_[i] + "." + slot_names_[s], slots_[i][s]});
  return out;
}

sdk::ComponentState BackendOptimizer::save_state() const {
  sdk::ComponentState state;
  state.version = kStateVersion;
  state.values["step"] = applied_steps_;
  return state;
}

void BackendOptimizer::load_state(const sdk::ComponentState& state) {
  if (state.version < 1 || state.version > kStateVersion)
    throw sdk::CheckpointError("optimizer '" + component_ + "' state has version " +
                                   std::to_string(state.version) + ", this build reads 1.." +
                                   std::to_string(kStateVersion),
                               "resume with the mixtrain version that wrote the checkpoint");
  const auto step = state.get<std::int64_t>("step");
  if (step < 0 || step > kMaxAppliedSteps)
    throw sdk::CheckpointError("optimizer '" + component_ +
                                   "' state entry 'step' = " + std::to_string(step) +
                                   " is outside [0, " + std::to_string(kMaxAppliedSteps) + "]",
                               "the checkpoint is damaged; resume from another checkpoint");
  applied_steps_ = step;
}

}  // namespace mixtrain::optimizers
