#include "lion_optimizer.h"

#include <cstdio>
#include <stdexcept>

#include "mixtrain/sdk/error.h"

namespace mixtrain_samples {

namespace sdk = mixtrain::sdk;

sdk::OptionSchema LionOptimizer::option_schema() {
  using sdk::OptionSpec;
  return {
      OptionSpec::number("lr", 1e-4,
                         "learning rate (the schedule's peak); Lion's is 3-10x below AdamW's")
          .at_least(0)
          .at_most(10),
      OptionSpec::number("beta1", 0.9, "weight of the momentum in the update's interpolation")
          .at_least(0)
          .at_most(1),
      OptionSpec::number("beta2", 0.99, "decay rate of the momentum").at_least(0).at_most(1),
      OptionSpec::number("weight_decay", 0.0, "decoupled weight decay, scaled by lr").at_least(0),
  };
}

LionOptimizer::LionOptimizer(const sdk::Options& options, const sdk::PluginContext& context)
    : logger_(context.logger),
      lr_(options.get_double("lr")),
      beta1_(static_cast<float>(options.get_double("beta1"))),
      beta2_(static_cast<float>(options.get_double("beta2"))),
      weight_decay_(static_cast<float>(options.get_double("weight_decay"))) {
  // At lr * weight_decay >= 1 the decay factor 1 - lr * wd is zero or flips the weights' sign.
  if (lr_ * weight_decay_ >= 1.0)
    options.fail(options.was_set("weight_decay") ? "weight_decay" : "lr",
                 "lr * weight_decay must be < 1",
                 "Lion's usual weight_decay is 0.1 to 1 at lr 1e-4");
  char line[128];
  std::snprintf(line, sizeof line, "lion lr %g, betas (%g, %g), weight_decay %g", lr_,
                static_cast<double>(beta1_), static_cast<double>(beta2_),
                static_cast<double>(weight_decay_));
  logger_.debug(line);
}

LionOptimizer::~LionOptimizer() {
  release();
}

void LionOptimizer::release() noexcept {
  if (backend_ != nullptr)
    for (auto& s : slots_) {
      backend_->deallocate(s.momentum.data);
      backend_->deallocate(s.update.data);
    }
  slots_.clear();
  momenta_.clear();
  updates_.clear();
  grads_.clear();
  masters_.clear();
  decayed_masters_.clear();
  ops_ = nullptr;
  backend_ = nullptr;
}

void LionOptimizer::bind(sdk::DeviceBackend& backend, std::span<const sdk::Parameter> params) {
  release();
  sdk::ForeachFacet* ops = sdk::facet<sdk::ForeachFacet>(backend);
  // A facet of the name at another major is not "missing": this plugin and the backend were
  // built against SDKs that disagree on it, and rebuilding one of them is the fix.
  if (ops == nullptr)
    if (const sdk::Facet* other = backend.find_facet(sdk::ForeachFacet::kName)) {
      const auto [major, minor] = other->version();
      throw sdk::BackendError(
          "optimizer 'lion' was built against foreach " +
              std::to_string(sdk::ForeachFacet::kVersion.major) + "." +
              std::to_string(sdk::ForeachFacet::kVersion.minor) + ", and backend '" +
              backend.capabilities().kind + "' offers foreach " + std::to_string(major) + "." +
              std::to_string(minor) + ": a facet of another major is not compatible",
          "rebuild this plugin against the SDK of the mixtrain that loads it");
    }
  const sdk::DType fp32[2] = {sdk::DType::fp32, sdk::DType::fp32};
  for (auto op : {sdk::ForeachOp::foreach_mul_scalar, sdk::ForeachOp::foreach_add,
                  sdk::ForeachOp::foreach_sign})
    if (ops == nullptr ||
        !ops->supports(op, std::span(fp32, op == sdk::ForeachOp::foreach_add ? 2 : 1)))
      throw sdk::BackendError("optimizer 'lion' needs foreach." + std::string(sdk::op_name(op)) +
                                  " on fp32, which backend '" + backend.capabilities().kind +
                                  "' does not provide",
                              "use a backend with a foreach facet");
  backend_ = &backend;
  ops_ = ops;
  std::size_t elements = 0;
  for (const auto& p : params) {
    const auto& master = p.tensors.master;
    if (master.dtype != sdk::DType::fp32 || p.tensors.grad.dtype != sdk::DType::fp32 ||
        master.numel() != p.tensors.grad.numel())
      throw std::logic_error("optimizer 'lion': parameter '" + p.name +
                             "' needs fp32 master and grad tensors of equal size");
    // Registered before allocating, so release() frees what exists if an allocation throws.
    auto& s = slots_.emplace_back();
    s.name = p.name;
    s.momentum = sdk::TensorView{nullptr, sdk::DType::fp32, master.shape};
    s.update = s.momentum;
    s.momentum.data = backend.allocate(s.momentum.bytes());
    s.update.data = backend.allocate(s.update.bytes());
    backend.fill(s.momentum, 0.0f);
    elements += static_cast<std::size_t>(master.numel());
    momenta_.push_back(s.momentum);
    updates_.push_back(s.update);
    grads_.push_back(p.tensors.grad);
    masters_.push_back(master);
    if (p.weight_decay) decayed_masters_.push_back(master);
  }
  logger_.debug("bound " + std::to_string(params.size()) + " parameters: " +
                std::to_string(elements * 4) + " bytes of fp32 momentum and as much scratch");
}

void LionOptimizer::step(sdk::DeviceBackend& backend, std::span<const sdk::Parameter> params,
                         const sdk::StepContext& ctx) {
  if (backend_ != &backend || params.size() != slots_.size())
    throw std::logic_error("optimizer 'lion': step() with " + std::to_string(params.size()) +
                           " parameters or another backend than bind() saw (" +
                           std::to_string(slots_.size()) + " parameters)");
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i].tensors.master.data != masters_[i].data)
      throw std::logic_error("optimizer 'lion': step() with other parameters than bind() saw");
  const float gs = ctx.grad_scale;
  // c = beta1 * m + (1 - beta1) * g, then sign(c): every parameter in one call per phase.
  for (const auto& s : slots_) backend.copy(s.update, s.momentum);
  ops_->foreach_mul_scalar(updates_, beta1_);
  ops_->foreach_add(updates_, grads_, (1.0f - beta1_) * gs);
  ops_->foreach_sign(updates_);
  // Decoupled decay, the signed step, the momentum, the working copies.
  if (weight_decay_ > 0.0f)
    ops_->foreach_mul_scalar(decayed_masters_, 1.0f - ctx.lr * weight_decay_);
  ops_->foreach_add(masters_, updates_, -ctx.lr);
  ops_->foreach_mul_scalar(momenta_, beta2_);
  ops_->foreach_add(momenta_, grads_, (1.0f - beta2_) * gs);
  for (const auto& p : params)
    if (!p.tensors.working.empty()) backend.cast(p.tensors.master, p.tensors.working);
  ++applied_steps_;
}

std::vector<sdk::NamedTensorView> LionOptimizer::state_tensors() const {
  std::vector<sdk::NamedTensorView> out;
  for (const auto& s : slots_) out.push_back({s.name + ".momentum", s.momentum});
  return out;
}

sdk::ComponentState LionOptimizer::save_state() const {
  sdk::ComponentState state;
  state.version = kStateVersion;
  state.values["step"] = applied_steps_;
  return state;
}

void LionOptimizer::load_state(const sdk::ComponentState& state) {
  if (state.version < 1 || state.version > kStateVersion)
    throw sdk::CheckpointError("optimizer 'lion' state has version " +
                                   std::to_string(state.version) + ", this build reads 1.." +
                                   std::to_string(kStateVersion),
                               "resume with the plugin version that wrote the checkpoint");
  const auto step = state.get<std::int64_t>("step");
  if (step < 0)
    throw sdk::CheckpointError(
        "optimizer 'lion' state entry 'step' = " + std::to_string(step) + " is negative",
        "the checkpoint is damaged or was written by another optimizer");
  applied_steps_ = step;
  logger_.info("lion resumes after " + std::to_string(step) + " applied steps");
}

}  // namespace mixtrain_samples
