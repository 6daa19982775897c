// LocalReducer: the Reducer (distributed/reducer.h) of a run in one process. Rank 0 of 1; every
// fixed point leaves the step as it is and communicates nothing: attach() changes no binding
// and installs no hook, reduce_totals() reads no loss, agree_on_blame() returns its argument.
// The checkpoint points copy the optimizer's own slots, which are whole. Internal to the core.
#pragma once

#include <memory>

#include "distributed/reducer.h"

namespace mixtrain::core {

// The optimizer's slots, whole, as a checkpoint names them (unprefixed): what one rank holds;
// copied to the host, or staged to be read as a checkpoint format asks.
std::vector<sdk::HostTensor> whole_optimizer_state(sdk::DeviceBackend& backend,
                                                   const sdk::Optimizer& optimizer);
std::vector<StagedTensor> staged_optimizer_state(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                                 const sdk::Optimizer& optimizer);
// Each slot from the whole tensor `find` gives (sdk::CheckpointError naming `where` and the slot
// when there is none), copied in by `load`.
void load_whole_optimizer_state(const sdk::Optimizer& optimizer, const WholeTensorFinder& find,
                                const WholeTensorLoader& load, const std::string& where);

class LocalReducer final : public Reducer {
 public:
  explicit LocalReducer(std::shared_ptr<sdk::DeviceBackend> backend);

  int rank() const override { return 0; }
  int world() const override { return 1; }

  void attach(Model&, std::vector<sdk::Parameter>&, std::vector<sdk::TensorView>&) override {}
  void begin_step() override {}
  void finish_gradients() override {}
  void flush_operand_amaxes(Model& model) override { model.flush_operand_amaxes(); }
  void reduce_totals(StepTotals&, const std::function<LossValues()>&) override {}
  SkipBlame agree_on_blame(const SkipBlame& mine) override { return mine; }
  void after_update(Model&) override {}

  bool any_rank(bool mine) override { return mine; }
  void before_evaluation(Model&) override {}
  void agree_on_evaluation(EvalResult&) override {}

  std::vector<StagedTensor> optimizer_state(const sdk::Optimizer& optimizer) override;
  // Alone: the save reads the slots where they are, and nobody serves.
  std::vector<StagedTensor> optimizer_state_for_save(const sdk::Optimizer& optimizer) override {
    return optimizer_state(optimizer);
  }
  void serve_save_reads(const sdk::Optimizer&) override {}
  void end_save_reads() override {}
  void load_optimizer_state(const sdk::Optimizer& optimizer, const WholeTensorFinder& find,
                            const WholeTensorLoader& load, const std::string& where) override;

  void announce(sdk::Logger&, std::int64_t) override {}
  void report_step(nlohmann::json&) override {}
  void report_run(TrainSummary&, const sdk::Optimizer&,
                  const std::function<std::vector<std::byte>()>&, sdk::Logger&) override {}

 protected:
  void set_communicating(bool) override {}

 private:
  std::shared_ptr<sdk::DeviceBackend> backend_;
};

}  // namespace mixtrain::core
