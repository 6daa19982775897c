// DataParallel: what each rank of a data-parallel run does beyond a one-process step
// (docs/architecture.md, "Data parallel"). Internal to the core; the trainer owns one when
// [distributed] is in use.
//
// Contract
// - attach(model, params, grads) plans the gradient buckets (distributed/gradient_buckets.h)
//   over model.parameters(), allocates each bucket's flat FP32 buffer on the backend, moves every
//   parameter's gradient into its bucket (the model's ModelParameter::grad becomes a borrowed view
//   of it: backward writes where the collective reads) and installs the model's gradient-ready
//   hook. It replaces `params` (what the optimizer is bound to) and `grads` (what the step
//   unscales and checks):
//   - unsharded: the gradients in their buckets, which the all-reduce sums in place, and grads
//     are the buckets;
//   - shard_optimizer (ZeRO stage 1): the optimizer sees only this rank's pieces of every bucket
//     (master views into the model's masters, gradients in the rank's reduce-scattered shard, no
//     working copy), so it allocates 1/N of the state; grads are the shards.
//   Called again after a replan (a new model): everything is rebuilt for it. With
//   sync_batch_norm it also installs the batch-norm statistics reducer (see DataParallelSettings).
// - The step: begin_step() before the first micro-batch; the hook counts each final gradient
//   and, with `overlap`, starts the bucket's collective as soon as the bucket is complete, calling
//   progress() as backward goes on; finish_gradients() starts what is left and waits for every
//   bucket. The buckets then hold SUMS over the ranks: the caller folds 1/N into the unscale. The
//   hook (and the batch-norm statistics reducer) is off while a local_only() scope lives: the
//   non-finite replay, which runs on one rank's batch only (DataParallelReducer opens it for the
//   Reducer's own local_only(), distributed/reducer.h).
// - reduce_totals(): one host all-reduce per step of found_inf, Σg² and the loss, so every rank
//   skips, clips and logs identically.
// - gather_masters() (sharded, after an applied step): the updated masters all-gathered into
//   every rank's model, then its working copies refreshed, so evaluation, EMA and checkpoints read
//   whole masters on every rank.
// - Checkpoints hold what one rank would. Sharded (unsharded, every rank holds the whole state
//   already): gather_optimizer_state() returns the optimizer's slots as whole tensors named as a
//   one-rank run names them; a save gathers them bucket by bucket as its format reads
//   (optimizer_slots, gather_slot_bucket; distributed/served_slots.h); load_optimizer_state()
//   takes this rank's pieces from such tensors. All are collective (every rank calls them).
// - Every method that communicates is collective: all ranks call it in the same order.
//   Errors: sdk::CommunicationError from the communicator; sdk::CheckpointError for state that
//   does not fit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "distributed/gradient_buckets.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/graph/tensor.h"
#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/format_streamed_write.h"
#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/optimizer.h"

namespace mixtrain::core {

struct DataParallelSettings {
  bool shard_optimizer = false;
  std::int64_t bucket_bytes = 25ll << 20;
  bool overlap = true;
  // [distributed] batch_norm = "sync": attach() installs a statistics reducer (a host all-reduce
  // of the per-channel sums) on every layer whose traits say reduces_statistics (batch norm);
  // BackendError naming the node when the backend lacks the synchronized_needs() it asks for.
  bool sync_batch_norm = false;
};

// Where the step's communication time went, summed since the last take_timing().
struct CommunicationTiming {
  double wait_seconds = 0.0;             // finish_gradients: blocked waiting for buckets
  double gather_seconds = 0.0;           // sharded: the masters' all-gather
  std::int64_t buckets = 0;              // buckets communicated
  std::int64_t started_in_backward = 0;  // of them, started by the hook (overlapped)
  CommunicationTiming& operator+=(const CommunicationTiming& o) {
    wait_seconds += o.wait_seconds;
    gather_seconds += o.gather_seconds;
    buckets += o.buckets;
    started_in_backward += o.started_in_backward;
    return *this;
  }
};

class DataParallel {
 public:
  DataParallel(std::shared_ptr<sdk::Communicator> communicator,
               std::shared_ptr<sdk::DeviceBackend> backend, DataParallelSettings settings);

  int rank() const { return rank_; }
  int world() const { return world_; }
  bool sharded() const { return settings_.shard_optimizer; }
  bool synchronized_batch_norm() const { return settings_.sync_batch_norm; }
  // The attached model's layers that reduce batch statistics (batch norm): 0 before attach().
  std::int64_t statistics_layers() const { return statistics_layers_; }
  sdk::Communicator& communicator() { return *comm_; }
  const std::vector<GradientBucket>& buckets() const { return plan_; }

  void attach(Model& model, std::vector<sdk::Parameter>& params,
              std::vector<sdk::TensorView>& grads);

  // While it lives, the gradient-ready hook and the statistics reducer communicate nothing; they
  // are on again when it ends. Neither copied nor moved: it lives where it was opened.
  class LocalOnly {
   public:
    explicit LocalOnly(DataParallel& dp) : dp_(dp) { dp_.hook_enabled_ = false; }
    ~LocalOnly() { dp_.hook_enabled_ = true; }
    LocalOnly(const LocalOnly&) = delete;
    LocalOnly& operator=(const LocalOnly&) = delete;

   private:
    DataParallel& dp_;
  };
  [[nodiscard]] LocalOnly local_only() { return LocalOnly(*this); }

  void begin_step();
  void finish_gradients();

  struct Totals {
    bool found_inf = false;
    double sum_squares = 0.0;  // over the whole (reduced) gradient
    double loss = 0.0;         // the mean of the ranks' losses
  };
  Totals reduce_totals(bool found_inf, double sum_squares, double loss);

  void gather_masters(Model& model);
  // Element-wise max over the ranks, in place (delayed FP8 scaling's amaxes).
  void max_reduce(std::span<float> values);
  // Rank 0's buffers (batch-norm running statistics) into every rank's model.
  void broadcast_buffers(Model& model);

  // The whole slots, gathered from every rank's shard (collective).
  std::vector<sdk::HostTensor> gather_optimizer_state(const sdk::Optimizer& optimizer);
  // The pieces the gathers above are made of, for a save that gathers as its format reads
  // (distributed/served_slots.h). optimizer_slots(): the slot names ("exp_avg", ...), rank 0's,
  // which are every rank's (collective). gather_slot_bucket(): one bucket of one slot from every
  // rank's shard into the bucket's flat buffer (collective), then, with `host`, onto the host
  // (fp32 [padded]). whole_slot(): parameter `param`'s slot as both name, type and shape it in
  // the file. The parameters by model.parameters() index: themselves, their buckets and offsets.
  std::vector<std::string> optimizer_slots(const sdk::Optimizer& optimizer);
  void gather_slot_bucket(const sdk::Optimizer& optimizer, const std::string& slot,
                          std::size_t bucket, std::vector<float>* host);
  sdk::StreamedTensor whole_slot(std::size_t param, const std::string& slot) const;
  std::size_t parameter_count() const { return params_.size(); }
  const ModelParameter& parameter(std::size_t i) const { return *params_[i]; }
  std::size_t bucket_of(std::size_t param) const { return bucket_of_[param]; }
  std::int64_t offset_of(std::size_t param) const { return offset_of_[param]; }
  // `find(name)`: the whole slot tensor named as a one-rank run names it, or nullptr.
  void load_optimizer_state(const sdk::Optimizer& optimizer,
                            const std::function<const sdk::HostTensor*(const std::string&)>& find,
                            const std::string& where);

  // Whether every rank holds the same `state` (its CRC-32 compared over the ranks): the check
  // that data parallelism kept the replicas identical, run at the end of a run.
  bool ranks_agree(std::span<const std::byte> state);

  CommunicationTiming take_timing();

 private:
  std::int64_t statistics_layers_ = 0;
  struct Bucket {
    GradientBucket plan;
    Tensor flat;   // fp32 [padded]: the parameters' gradients (and, sharded, the gathered masters)
    Tensor shard;  // sharded: fp32 [padded / world]
    std::size_t ready = 0;
    bool started = false;
    sdk::CommunicationHandlePtr handle;
  };
  struct Piece {  // sharded: one optimizer parameter
    std::size_t bucket = 0;
    ShardPiece where;
  };
  void on_gradient_ready(ModelParameter& p);
  void install_batch_norm_reducers(Model& model);
  void mark_ready(std::size_t param);
  void start(Bucket& b);
  sdk::TensorView flat_view(const Bucket& b, std::int64_t offset, const sdk::Shape& shape) const;

  std::shared_ptr<sdk::Communicator> comm_;
  std::shared_ptr<sdk::DeviceBackend> backend_;
  DataParallelSettings settings_;
  int rank_ = 0, world_ = 1;
  bool hook_enabled_ = true;
  std::vector<GradientBucket> plan_;
  std::vector<Bucket> buckets_;
  std::vector<ModelParameter*> params_;  // model.parameters() order
  std::unordered_map<const ModelParameter*, std::size_t> index_;
  std::vector<std::size_t> bucket_of_;   // per parameter
  std::vector<std::int64_t> offset_of_;  // per parameter: its offset in its bucket
  std::vector<bool> ready_;              // per parameter: reported ready this step
  std::vector<Piece> pieces_;            // sharded: the optimizer's parameters, in bind order
  CommunicationTiming timing_;
};

}  // namespace mixtrain::core
