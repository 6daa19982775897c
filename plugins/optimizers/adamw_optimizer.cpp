#include "adamw_optimizer.h"

#include <cstdio>

namespace mixtrain::optimizers {

sdk::OptionSchema AdamWOptimizer::option_schema() {
  using sdk::OptionSpec;
  return {
      // Past 10 no model trains: the first step already writes non-finite or useless weights.
      OptionSpec::number("lr", 1e-3, "learning rate (the schedule's peak)").at_least(0).at_most(10),
      OptionSpec::number("beta1", 0.9, "decay rate of the first moment; must be < 1")
          .at_least(0)
          .at_most(1),
      OptionSpec::number("beta2", 0.999, "decay rate of the second moment; must be < 1")
          .at_least(0)
          .at_most(1),
      OptionSpec::number("eps", 1e-8, "added to the denominator for numerical stability")
          .at_least(0),
      OptionSpec::number("weight_decay", 0.01,
                         "decoupled weight decay, scaled by lr; applied to the parameters the "
                         "model marks for decay (linear and convolution weights, embedding "
                         "tables), never to biases or normalisation weights")
          .at_least(0),
  };
}

AdamWOptimizer::AdamWOptimizer(const sdk::Options& options, const sdk::PluginContext& context)
    : BackendOptimizer("adamw", options.get_double("lr"), {"exp_avg", "exp_avg_sq"},
                       sdk::OptimizerOp::adamw_update, sdk::OptimizerOp::adamw_update_gated,
                       context),
      beta1_(static_cast<float>(options.get_double("beta1"))),
      beta2_(static_cast<float>(options.get_double("beta2"))),
      eps_(static_cast<float>(options.get_double("eps"))),
      weight_decay_(static_cast<float>(options.get_double("weight_decay"))) {
  // A beta of 1 makes the bias correction 1 - beta^t zero: the update would divide by zero.
  for (const char* key : {"beta1", "beta2"})
    if (options.get_double(key) >= 1.0)
      options.fail(key, "must be < 1, got " + sdk::option_value_to_string(options.get_double(key)),
                   "PyTorch's defaults are beta1 = 0.9, beta2 = 0.999");
  char line[160];
  std::snprintf(line, sizeof line, "adamw lr %g, betas (%g, %g), eps %g, weight_decay %g",
                base_lr(), static_cast<double>(beta1_), static_cast<double>(beta2_),
                static_cast<double>(eps_), static_cast<double>(weight_decay_));
  logger_.debug(line);
}

void AdamWOptimizer::update(std::span<const sdk::ParamTensors> group, bool decayed, float lr,
                            float grad_scale, const sdk::UpdateGate* gate) {
  sdk::AdamWHyper hyper;
  hyper.lr = lr;
  hyper.beta1 = beta1_;
  hyper.beta2 = beta2_;
  hyper.eps = eps_;
  hyper.step = applied_steps() + 1;
  hyper.grad_scale = grad_scale;
  hyper.weight_decay = decayed ? weight_decay_ : 0.0f;
  if (gate != nullptr)
    kernels(gate)->adamw_update_gated(hyper, group, *gate);
  else
    kernels(gate)->adamw_update(hyper, group);
}

}  // namespace mixtrain::optimizers
