// Reducer: what the training step asks of the replicas that share it, at fixed points, as
// PyTorch DDP's Reducer is called (docs/architecture.md, "One training step" and "Data parallel").
// The step calls every point whether or not there are other replicas: LocalReducer (one process)
// communicates nothing, DataParallelReducer (distributed/data_parallel_reducer.h) does. Internal
// to the core.
//
// Contract, in the order a step meets the points
// - attach(model, params, grads): after every build of the model (construction, each replan).
//   It may move the gradients and replace `params` (what the optimizer is bound to) and `grads`
//   (what the step unscales and checks); it may install the model's gradient-ready hook, which
//   is the "gradient ready" point during backward. A one-process reducer changes nothing and
//   installs no hook, so the step may still be recorded as a step graph.
// - begin_step(): before the step's first micro-batch.
// - finish_gradients(): after the last backward, before the unscale. Afterwards the gradients
//   hold the SUM over world() replicas: the step folds 1 / world() into its loss seed.
// - flush_operand_amaxes(model): after the unscale, the delayed FP8 amaxes handed to the policy
//   (the element-wise max over the replicas).
// - reduce_totals(totals, read_loss): the step's host reductions. found_inf and sum_squares come
//   in as this replica's and leave as the run's; `loss` is left unread (nullopt) unless the
//   reduction needed it, then it holds the mean over the replicas (read_loss reads this one's).
// - local_only(): a scope in which the gradient-ready hook and any statistics reduction do not
//   communicate (the non-finite replay runs this replica's rows alone); restored on exit.
// - agree_on_blame(mine): after a skipped step's replay, the lowest replica's blame that found
//   something, the same on every replica.
// - after_update(model): after an applied optimizer step (sharded optimizer state: the updated
//   masters gathered into every replica).
// - Between steps: any_rank(mine) (a stop request ends every replica after the same step),
//   before_evaluation(model) (every replica evaluates with replica 0's buffers), then
//   agree_on_evaluation(result): replica 0's numbers on every replica, so early stopping and
//   the best checkpoint decide alike everywhere (each replica evaluates every row, but kernels
//   chosen per rank, autotuned ones say, can differ in the last bits and split a close call).
// - Checkpoints: optimizer_state() is the optimizer's slots as whole tensors named as a one-rank
//   run names them (unprefixed), staged (checkpoint/staged_state.h): read from the optimizer's own
//   slots as a format asks where this replica holds them whole (one process, or unsharded), and
//   gathered from every rank's shard by the call itself where they are sharded;
//   optimizer_state_for_save() is the same staging for the replica that writes a save (rank 0),
//   whose sharded slots are gathered as the format reads them (distributed/served_slots.h: one
//   bucket of one slot on the host at a time), while every other replica is in
//   serve_save_reads(), taking part in those gathers and keeping nothing, until the writer's
//   end_save_reads() (also after a failed write; a no-op where nothing was served). A writer
//   that does not write (no outputs) serves too, and ends at once;
//   load_optimizer_state() takes them back: `find(name)` gives the
//   whole tensor or nullptr (sdk::CheckpointError naming `where` and the slot), `load(tensor,
//   slot)` copies a whole tensor into a whole slot, checking it. Both are collective.
// - Reporting: announce() logs how the replicas share the work (nothing in one process);
//   report_step() adds this window's communication to a metrics record; report_run() fills the
//   summary's "distributed" entry and checks that the replicas still agree (replica_state() is
//   asked only there).
// - leads(): rank 0 writes files and the once-per-run messages.
// Every point that communicates is collective: every replica calls it, in the same order.
// Errors: sdk::CommunicationError from the communicator, sdk::CheckpointError for state that does
// not fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/staged_state.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/runs/summary.h"
#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/optimizer.h"
#include "train/skip_blame.h"

namespace mixtrain::core {

// A step's host totals (Reducer::reduce_totals).
struct StepTotals {
  bool found_inf = false;
  double sum_squares = std::numeric_limits<double>::quiet_NaN();  // Σg², when the step wants it
  std::optional<LossValues> loss;  // read by the reduction; nullopt: not read yet
};

using WholeTensorFinder = std::function<const sdk::HostTensor*(const std::string& name)>;
using WholeTensorLoader = std::function<void(const sdk::HostTensor& whole, sdk::TensorView slot)>;

class Reducer {
 public:
  virtual ~Reducer();

  virtual int rank() const = 0;
  virtual int world() const = 0;
  bool leads() const { return rank() == 0; }

  virtual void attach(Model& model, std::vector<sdk::Parameter>& params,
                      std::vector<sdk::TensorView>& grads) = 0;

  virtual void begin_step() = 0;
  virtual void finish_gradients() = 0;
  virtual void flush_operand_amaxes(Model& model) = 0;
  virtual void reduce_totals(StepTotals& totals, const std::function<LossValues()>& read_loss) = 0;
  virtual SkipBlame agree_on_blame(const SkipBlame& mine) = 0;
  virtual void after_update(Model& model) = 0;

  virtual bool any_rank(bool mine) = 0;
  virtual void before_evaluation(Model& model) = 0;
  virtual void agree_on_evaluation(EvalResult& result) = 0;

  virtual std::vector<StagedTensor> optimizer_state(const sdk::Optimizer& optimizer) = 0;
  virtual std::vector<StagedTensor> optimizer_state_for_save(const sdk::Optimizer& optimizer) = 0;
  virtual void serve_save_reads(const sdk::Optimizer& optimizer) = 0;
  virtual void end_save_reads() = 0;
  virtual void load_optimizer_state(const sdk::Optimizer& optimizer, const WholeTensorFinder& find,
                                    const WholeTensorLoader& load, const std::string& where) = 0;

  virtual void announce(sdk::Logger& log, std::int64_t global_batch) = 0;
  virtual void report_step(nlohmann::json& record) = 0;
  virtual void report_run(TrainSummary& summary, const sdk::Optimizer& optimizer,
                          const std::function<std::vector<std::byte>()>& replica_state,
                          sdk::Logger& log) = 0;

  // The scope of local_only(): communication off while it lives, as it was after.
  class LocalOnly {
   public:
    explicit LocalOnly(Reducer& r) : r_(r) { r_.set_communicating(false); }
    ~LocalOnly() { r_.set_communicating(true); }
    LocalOnly(const LocalOnly&) = delete;
    LocalOnly& operator=(const LocalOnly&) = delete;

   private:
    Reducer& r_;
  };
  [[nodiscard]] LocalOnly local_only() { return LocalOnly(*this); }

 protected:
  virtual void set_communicating(bool on) = 0;
};

}  // namespace mixtrain::core
