#include "distributed/data_parallel_reducer.h"

#include <array>
#include <cstring>

#include "mixtrain/sdk/error.h"

#include "distributed/local_reducer.h"
#include "distributed/rank_agreement.h"
#include "profiling/profile_scope.h"
#include "train/host_tensor.h"

namespace mixtrain::core {

DataParallelReducer::DataParallelReducer(std::shared_ptr<sdk::Communicator> communicator,
                                         std::shared_ptr<sdk::DeviceBackend> backend,
                                         DataParallelSettings settings)
    : comm_(communicator), backend_(backend), dp_(communicator, backend, settings) {}

void DataParallelReducer::attach(Model& model, std::vector<sdk::Parameter>& params,
                                 std::vector<sdk::TensorView>& grads) {
  dp_.attach(model, params, grads);
}

void DataParallelReducer::begin_step() {
  dp_.begin_step();
}

void DataParallelReducer::finish_gradients() {
  ProfileScope scope("gradient all-reduce");
  dp_.finish_gradients();
}

void DataParallelReducer::flush_operand_amaxes(Model& model) {
  model.flush_operand_amaxes([&](std::span<float> amaxes) { dp_.max_reduce(amaxes); });
}

void DataParallelReducer::reduce_totals(StepTotals& totals,
                                        const std::function<LossValues()>& read_loss) {
  // One host all-reduce a step: every rank skips, clips and reports the same.
  LossValues loss = read_loss();
  const auto reduced = dp_.reduce_totals(totals.found_inf, totals.sum_squares, loss.loss);
  totals.found_inf = reduced.found_inf;
  totals.sum_squares = reduced.sum_squares;
  loss.loss = static_cast<float>(reduced.loss);
  totals.loss = loss;
}

SkipBlame DataParallelReducer::agree_on_blame(const SkipBlame& mine) {
  return SkipBlame::from_text(lowest_rank_text(*comm_, mine.to_text()).text);
}

void DataParallelReducer::after_update(Model& model) {
  // Sharded: each rank updated its shard; every rank needs every master.
  if (dp_.sharded()) dp_.gather_masters(model);
}

bool DataParallelReducer::any_rank(bool mine) {
  return core::any_rank(*comm_, mine);
}

void DataParallelReducer::before_evaluation(Model& model) {
  dp_.broadcast_buffers(model);
}

void DataParallelReducer::agree_on_evaluation(EvalResult& result) {
  std::array<double, 3> numbers = {result.loss, result.accuracy, result.top_k_accuracy};
  std::vector<std::byte> bytes(sizeof numbers);
  std::memcpy(bytes.data(), numbers.data(), sizeof numbers);
  comm_->broadcast_host(bytes, 0);
  if (bytes.size() != sizeof numbers)
    throw sdk::CommunicationError("rank 0 sent " + std::to_string(bytes.size()) +
                                      " bytes of evaluation numbers, not " +
                                      std::to_string(sizeof numbers),
                                  "run the same mixtrain build on every rank");
  std::memcpy(numbers.data(), bytes.data(), sizeof numbers);
  result.loss = numbers[0];
  result.accuracy = numbers[1];
  result.top_k_accuracy = numbers[2];
}

std::vector<StagedTensor> DataParallelReducer::optimizer_state(const sdk::Optimizer& optimizer) {
  // Sharded: whole slots gathered from every rank's shard now (collective), so the file is a
  // one-rank run's and resumes on any number of ranks; unsharded, every rank holds the whole
  // state already, read as the format asks.
  if (!dp_.sharded()) return staged_optimizer_state(backend_, optimizer);
  std::vector<StagedTensor> out;
  for (auto& t : dp_.gather_optimizer_state(optimizer)) out.push_back(staged_host(std::move(t)));
  return out;
}

std::vector<StagedTensor> DataParallelReducer::optimizer_state_for_save(
    const sdk::Optimizer& optimizer) {
  if (!dp_.sharded()) return staged_optimizer_state(backend_, optimizer);
  served_ = std::make_shared<ServedSlots>(dp_, optimizer);
  return served_->staged();
}

void DataParallelReducer::serve_save_reads(const sdk::Optimizer& optimizer) {
  if (!dp_.sharded()) return;
  const auto served = std::make_shared<ServedSlots>(dp_, optimizer);
  if (dp_.rank() == 0)
    served->end();  // rank 0 without outputs: nothing is read
  else
    served->serve();
}

void DataParallelReducer::end_save_reads() {
  if (!served_) return;
  const auto served = std::move(served_);
  served_.reset();
  served->end();
}

void DataParallelReducer::load_optimizer_state(const sdk::Optimizer& optimizer,
                                               const WholeTensorFinder& find,
                                               const WholeTensorLoader& load,
                                               const std::string& where) {
  if (dp_.sharded())
    dp_.load_optimizer_state(optimizer, find, where);
  else
    load_whole_optimizer_state(optimizer, find, load, where);
}

void DataParallelReducer::announce(sdk::Logger& log, std::int64_t global_batch) {
  log.info("data parallel: " + comm_->description() + ", " +
           std::to_string(global_batch / dp_.world()) + " rows per rank of each batch of " +
           std::to_string(global_batch) + ", " + std::to_string(dp_.buckets().size()) +
           " gradient buckets" + (dp_.sharded() ? ", optimizer state sharded (ZeRO stage 1)" : "") +
           // Sync or local batch norm trains other numbers: said, so a resume that fell back to
           // the default shows.
           (dp_.statistics_layers() == 0 ? ""
            : dp_.synchronized_batch_norm()
                ? ", batch-norm statistics synchronized across ranks (batch_norm = \"sync\")"
                : ", batch-norm statistics per rank (batch_norm = \"local\")"));
}

void DataParallelReducer::report_step(nlohmann::json& record) {
  const auto t = dp_.take_timing();
  run_timing_ += t;
  record["allreduce_wait_seconds"] = t.wait_seconds;
  record["buckets_started_in_backward"] = t.started_in_backward;
  record["buckets_communicated"] = t.buckets;
  if (dp_.sharded()) record["allgather_seconds"] = t.gather_seconds;
}

void DataParallelReducer::report_run(TrainSummary& summary, const sdk::Optimizer& optimizer,
                                     const std::function<std::vector<std::byte>()>& replica_state,
                                     sdk::Logger& log) {
  run_timing_ += dp_.take_timing();  // what the last window left
  std::size_t state_bytes = 0;
  for (const auto& slot : optimizer.state_tensors()) state_bytes += slot.view.bytes();
  // The largest rank's bytes: what each machine must hold.
  double per_rank[2] = {static_cast<double>(state_bytes),
                        static_cast<double>(summary.peak_memory_bytes)};
  comm_->all_reduce_host(per_rank, sdk::ReduceOp::max);
  auto& d = summary.distributed;
  d.world_size = dp_.world();
  d.communicator = comm_->description();
  d.shard_optimizer = dp_.sharded();
  d.buckets = static_cast<std::int64_t>(dp_.buckets().size());
  d.optimizer_state_bytes = static_cast<std::size_t>(per_rank[0]);
  d.peak_memory_bytes = static_cast<std::size_t>(per_rank[1]);
  d.wait_seconds = run_timing_.wait_seconds;
  d.gather_seconds = run_timing_.gather_seconds;
  d.buckets_started_in_backward = run_timing_.started_in_backward;
  d.buckets_communicated = run_timing_.buckets;
  // Unsharded, every rank holds every optimizer slot, and they must agree too.
  std::vector<std::byte> state = replica_state();
  if (!dp_.sharded())
    for (const auto& slot : whole_optimizer_state(*backend_, optimizer))
      state.insert(state.end(), slot.bytes.begin(), slot.bytes.end());
  d.ranks_identical = dp_.ranks_agree(state);
  if (!d.ranks_identical)
    log.error(
        "the ranks' training states differ at the end of the run: the replicas went "
        "out of step (a nondeterministic op, or a bug); this rank's checkpoint is "
        "rank 0's");
}

}  // namespace mixtrain::core
