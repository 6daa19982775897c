// DataParallelReducer: the Reducer (distributed/reducer.h) of a data-parallel run, over this
// rank's DataParallel (distributed/data_parallel.h), which it owns. Each fixed point is the
// collective the step needs there: gradient buckets reduced during backward and before the
// unscale, found_inf, Σg² and the loss in one host all-reduce (so the loss is read every step),
// FP8 amaxes MAX-reduced, the lowest rank's blame, the sharded masters gathered after the update,
// rank 0's buffers before evaluation and its numbers after, sharded optimizer state gathered and
// scattered for checkpoints. Communication time is summed per logged window (report_step) and over
// the run (report_run), whose agreement check compares replica_state() and, unsharded, every
// optimizer slot (each rank holds them all). Internal to the core.
#pragma once

#include <memory>
#include <optional>

#include "distributed/data_parallel.h"
#include "distributed/reducer.h"
#include "distributed/served_slots.h"

namespace mixtrain::core {

class DataParallelReducer final : public Reducer {
 public:
  DataParallelReducer(std::shared_ptr<sdk::Communicator> communicator,
                      std::shared_ptr<sdk::DeviceBackend> backend, DataParallelSettings settings);

  int rank() const override { return dp_.rank(); }
  int world() const override { return dp_.world(); }

  void attach(Model& model, std::vector<sdk::Parameter>& params,
              std::vector<sdk::TensorView>& grads) override;
  void begin_step() override;
  void finish_gradients() override;
  void flush_operand_amaxes(Model& model) override;
  void reduce_totals(StepTotals& totals, const std::function<LossValues()>& read_loss) override;
  SkipBlame agree_on_blame(const SkipBlame& mine) override;
  void after_update(Model& model) override;

  bool any_rank(bool mine) override;
  void before_evaluation(Model& model) override;
  void agree_on_evaluation(EvalResult& result) override;

  std::vector<StagedTensor> optimizer_state(const sdk::Optimizer& optimizer) override;
  std::vector<StagedTensor> optimizer_state_for_save(const sdk::Optimizer& optimizer) override;
  void serve_save_reads(const sdk::Optimizer& optimizer) override;
  void end_save_reads() override;
  void load_optimizer_state(const sdk::Optimizer& optimizer, const WholeTensorFinder& find,
                            const WholeTensorLoader& load, const std::string& where) override;

  void announce(sdk::Logger& log, std::int64_t global_batch) override;
  void report_step(nlohmann::json& record) override;
  void report_run(TrainSummary& summary, const sdk::Optimizer& optimizer,
                  const std::function<std::vector<std::byte>()>& replica_state,
                  sdk::Logger& log) override;

 protected:
  void set_communicating(bool on) override {
    if (on)
      local_.reset();
    else
      local_.emplace(dp_);
  }

 private:
  std::shared_ptr<sdk::Communicator> comm_;
  std::shared_ptr<sdk::DeviceBackend> backend_;
  DataParallel dp_;
  CommunicationTiming run_timing_;  // summed over the logged windows
  std::optional<DataParallel::LocalOnly> local_;  // open inside the Reducer's local_only()
  std::shared_ptr<ServedSlots> served_;  // rank 0, between optimizer_state_for_save and the end
};

}  // namespace mixtrain::core
