#include "sgd_optimizer.h"

#include <cstdio>

namespace mixtrain::optimizers {

namespace {
std::vector<std::string> sgd_slots(const sdk::Options& options) {
  if (options.get_double("momentum") > 0.0) return {"momentum_buffer"};
  return {};
}
}  // namespace

sdk::OptionSchema SgdOptimizer::option_schema() {
  using sdk::OptionSpec;
  return {
      // Past 10 no model trains: the first step already writes non-finite or useless weights.
      OptionSpec::number("lr", 0.01, "learning rate (the schedule's peak)")
          .greater_than(0)
          .at_most(10),
      OptionSpec::number("momentum", 0.0, "momentum factor (0 = plain SGD); must be < 1")
          .at_least(0)
          .at_most(1),
      OptionSpec::number("dampening", 0.0, "dampening of the gradient term of the momentum")
          .at_least(0)
          .at_most(1),
      OptionSpec::boolean("nesterov", false,
                          "Nesterov momentum; needs momentum > 0 and dampening = 0"),
      OptionSpec::number("weight_decay", 0.0,
                         "L2 penalty added to the gradient of the parameters the model marks for "
                         "decay (linear and convolution weights, embedding tables), never of "
                         "biases or normalisation weights")
          .at_least(0),
  };
}

SgdOptimizer::SgdOptimizer(const sdk::Options& options, const sdk::PluginContext& context)
    : BackendOptimizer("sgd", options.get_double("lr"), sgd_slots(options),
                       sdk::OptimizerOp::sgd_update, sdk::OptimizerOp::sgd_update_gated, context),
      momentum_(static_cast<float>(options.get_double("momentum"))),
      dampening_(static_cast<float>(options.get_double("dampening"))),
      weight_decay_(static_cast<float>(options.get_double("weight_decay"))),
      nesterov_(options.get_bool("nesterov")) {
  if (options.get_double("momentum") >= 1.0)
    options.fail("momentum",
                 "must be < 1, got " + sdk::option_value_to_string(options.get_double("momentum")),
                 "a momentum of 1 never forgets a gradient; 0.9 is the usual choice");
  if (nesterov_ && (momentum_ <= 0.0f || dampening_ != 0.0f))
    options.fail("nesterov", "Nesterov momentum requires momentum > 0 and dampening = 0",
                 "set momentum (e.g. 0.9) and dampening = 0, or nesterov = false");
  char line[160];
  std::snprintf(line, sizeof line,
                "sgd lr %g, momentum %g, dampening %g, nesterov %s, "
                "weight_decay %g",
                base_lr(), static_cast<double>(momentum_), static_cast<double>(dampening_),
                nesterov_ ? "true" : "false", static_cast<double>(weight_decay_));
  logger_.debug(line);
}

void SgdOptimizer::update(std::span<const sdk::ParamTensors> group, bool decayed, float lr,
                          float grad_scale, const sdk::UpdateGate* gate) {
  sdk::SgdHyper hyper;
  hyper.lr = lr;
  hyper.momentum = momentum_;
  hyper.dampening = dampening_;
  hyper.nesterov = nesterov_;
  hyper.first_step = applied_steps() == 0;
  hyper.grad_scale = grad_scale;
  hyper.weight_decay = decayed ? weight_decay_ : 0.0f;
  if (gate != nullptr)
    kernels(gate)->sgd_update_gated(hyper, group, *gate);
  else
    kernels(gate)->sgd_update(hyper, group);
}

}  // namespace mixtrain::optimizers
