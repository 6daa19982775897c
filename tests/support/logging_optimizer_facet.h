// An OptimizerFacet that forwards to another, writes each update call to a log ("update", "gated
// update") and, with `gated` false, denies the gated kernels (OptimizerFacet 1.1): an optimizer
// bound to it cannot gate, so the training step waits for its gradient check before updating.
// SDK headers only.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/backend_optimizer_updates.h"

namespace mixtrain::test {

class LoggingOptimizerFacet final : public sdk::OptimizerFacet {
 public:
  LoggingOptimizerFacet(sdk::OptimizerFacet* inner, std::vector<std::string>& log, bool gated)
      : in_(inner), log_(log), gated_(gated) {}
  bool supports(sdk::OptimizerOp op, std::span<const sdk::DType> d) const override {
    if (sdk::introduced_in(op) > 0 && !gated_) return false;
    return in_->supports(op, d);
  }
  void sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> p) override {
    log_.push_back("update");
    in_->sgd_update(h, p);
  }
  void adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> p) override {
    log_.push_back("update");
    in_->adamw_update(h, p);
  }
  void sgd_update_gated(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> p,
                        const sdk::UpdateGate& g) override {
    log_.push_back("gated update");
    in_->sgd_update_gated(h, p, g);
  }
  void adamw_update_gated(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> p,
                          const sdk::UpdateGate& g) override {
    log_.push_back("gated update");
    in_->adamw_update_gated(h, p, g);
  }

 private:
  sdk::OptimizerFacet* in_;
  std::vector<std::string>& log_;
  bool gated_;
};

}  // namespace mixtrain::test
