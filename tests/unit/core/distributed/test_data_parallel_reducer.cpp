// DataParallelReducer's fixed points against a communicator that records what it is asked: the
// gradient buckets start during backward and are waited for before the unscale, the step's
// totals go in one host all-reduce, the replay's scope communicates nothing, and the lowest
// rank's blame is everyone's.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "distributed/data_parallel_reducer.h"

namespace mixtrain::core {
namespace {

// Rank `me` (0 unless a test says) of `world`. Device collectives complete at once and leave the
// data as it is; host collectives fold in what `peer` (every other rank) holds.
class RecordingCommunicator final : public sdk::Communicator {
 public:
  struct Handle final : sdk::CommunicationHandle {
    explicit Handle(RecordingCommunicator& c) : comm(c) {}
    bool test() override { return true; }
    void wait() override { comm.calls.push_back("wait"); }
    RecordingCommunicator& comm;
  };
  std::vector<std::string> calls;
  int world = 1;
  int me = 0;                         // this rank
  std::vector<std::byte> root_bytes;  // what rank 0 broadcasts to the others (me > 0)
  std::string peer_text;  // what the other ranks hold for lowest_rank_text ("": nothing)
  double peer_value = 0.0;

  int rank() const override { return me; }
  int world_size() const override { return world; }
  std::string description() const override { return "recording"; }
  void bind(sdk::DeviceBackend&) override {}
  sdk::CommunicationHandlePtr start_all_reduce(sdk::TensorView, sdk::ReduceOp) override {
    calls.push_back("start_all_reduce");
    return std::make_unique<Handle>(*this);
  }
  sdk::CommunicationHandlePtr start_reduce_scatter(sdk::TensorView, sdk::TensorView,
                                                   sdk::ReduceOp) override {
    calls.push_back("start_reduce_scatter");
    return std::make_unique<Handle>(*this);
  }
  sdk::CommunicationHandlePtr start_all_gather(sdk::TensorView, sdk::TensorView) override {
    calls.push_back("start_all_gather");
    return std::make_unique<Handle>(*this);
  }
  void broadcast(sdk::TensorView, int) override { calls.push_back("broadcast"); }
  void barrier() override { calls.push_back("barrier"); }
  void all_reduce_host(std::span<double> values, sdk::ReduceOp op) override {
    calls.push_back("all_reduce_host " + std::to_string(values.size()));
    // lowest_rank_text's max: rank 1 claims the text when it has one.
    if (op == sdk::ReduceOp::max && values.size() == 1 && !peer_text.empty())
      values[0] = std::max(values[0], 1.0);
    if (op == sdk::ReduceOp::sum)
      for (int r = 1; r < world; ++r)
        for (double& v : values) v += peer_value;
  }
  void broadcast_host(std::vector<std::byte>& bytes, int root) override {
    calls.push_back("broadcast_host from " + std::to_string(root));
    if (root != 0) {
      bytes.resize(peer_text.size());
      std::memcpy(bytes.data(), peer_text.data(), peer_text.size());
    } else if (me != 0) {
      bytes = root_bytes;
    }
  }
};

struct ReducerFixture {
  std::shared_ptr<RecordingCommunicator> comm = std::make_shared<RecordingCommunicator>();
  std::unique_ptr<Model> model;
  std::vector<sdk::Parameter> params;
  std::vector<sdk::TensorView> grads;
  std::unique_ptr<DataParallelReducer> reducer;

  explicit ReducerFixture(int world, bool overlap = true) {
    comm->world = world;
    ModelSpec spec;
    spec.layers = {test_support::op("linear", "fc1", {{"out", 4}}),
                   test_support::op("linear", "head", {{"out", 3}})};
    model = std::make_unique<Model>(test_support::cpu(), spec, 5, 3);
    for (auto& l : model->layers()) l->set_precision({});
    model->allocate(2);
    model->init_parameters(1);
    for (auto* p : model->parameters()) {
      sdk::Parameter sp;
      sp.name = p->name;
      sp.tensors.master = p->master.view();
      sp.tensors.grad = p->grad.view();
      params.push_back(sp);
      grads.push_back(p->grad.view());
    }
    DataParallelSettings settings;
    settings.overlap = overlap;
    settings.bucket_bytes = 16;  // one parameter a bucket: several collectives a step
    reducer = std::make_unique<DataParallelReducer>(comm, test_support::cpu(), settings);
    reducer->attach(*model, params, grads);
    const std::vector<float> x = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f, 0.9f, 1.0f};
    const std::vector<std::int32_t> y = {0, 2};
    test_support::cpu()->copy_from_host(model->input(2), x.data());
    test_support::cpu()->copy_from_host(model->labels(2), y.data());
  }

  void forward_backward() {
    model->begin_micro_batch(0, 1, 1);
    model->forward(2);
    model->compute_loss(2, 1.0f, true);
    model->backward(2);
  }
  std::size_t count(const std::string& call) const {
    return static_cast<std::size_t>(std::count(comm->calls.begin(), comm->calls.end(), call));
  }
};

TEST(DataParallelReducer, AttachMovesTheGradientsIntoBucketsAndInstallsTheHook) {
  ReducerFixture f(1);
  EXPECT_TRUE(f.model->has_gradient_ready_hook());
  const auto params = f.model->parameters();
  ASSERT_EQ(f.params.size(), params.size());
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(f.params[i].tensors.grad.data, params[i]->grad.view().data) << params[i]->name;
  EXPECT_EQ(f.grads.size(), 4u);  // a bucket per parameter at this cap
  EXPECT_TRUE(f.comm->calls.empty());
}

TEST(DataParallelReducer, BucketsStartDuringBackwardAndAreWaitedForBeforeTheUnscale) {
  ReducerFixture f(1);
  f.reducer->begin_step();
  f.forward_backward();
  EXPECT_EQ(f.count("start_all_reduce"), f.grads.size());  // every bucket, as it completed
  EXPECT_EQ(f.count("wait"), 0u);
  f.reducer->finish_gradients();
  EXPECT_EQ(f.count("start_all_reduce"), f.grads.size());
  EXPECT_EQ(f.count("wait"), f.grads.size());
  nlohmann::json record;
  f.reducer->report_step(record);
  EXPECT_EQ(record["buckets_communicated"], static_cast<std::int64_t>(f.grads.size()));
  EXPECT_EQ(record["buckets_started_in_backward"], static_cast<std::int64_t>(f.grads.size()));
}

TEST(DataParallelReducer, WithoutOverlapEveryBucketStartsAtFinish) {
  ReducerFixture f(1, /*overlap=*/false);
  f.reducer->begin_step();
  f.forward_backward();
  EXPECT_EQ(f.count("start_all_reduce"), 0u);
  f.reducer->finish_gradients();
  EXPECT_EQ(f.count("start_all_reduce"), f.grads.size());
}

TEST(DataParallelReducer, TheReplayScopeCommunicatesNothingAndEndsWithIt) {
  ReducerFixture f(1);
  f.reducer->begin_step();
  {
    const auto alone = f.reducer->local_only();
    f.forward_backward();
  }
  EXPECT_TRUE(f.comm->calls.empty());
  f.reducer->begin_step();
  f.forward_backward();
  EXPECT_EQ(f.count("start_all_reduce"), f.grads.size());
}

TEST(DataParallelReducer, TheStepsTotalsAreOneHostAllReduceThatReadsTheLoss) {
  ReducerFixture f(2);
  f.comm->peer_value = 1.0;  // the other rank: found_inf, Σg² and loss all 1
  StepTotals totals;
  totals.found_inf = false;
  totals.sum_squares = 4.0;
  bool read = false;
  f.reducer->reduce_totals(totals, [&] {
    read = true;
    return LossValues{3.0f, 7};
  });
  EXPECT_TRUE(read);
  EXPECT_EQ(f.comm->calls, std::vector<std::string>{"all_reduce_host 3"});
  EXPECT_TRUE(totals.found_inf);             // the other rank found one
  EXPECT_EQ(totals.sum_squares, 4.0 + 1.0);  // unsharded: rank 0's Σg², plus what came in
  ASSERT_TRUE(totals.loss.has_value());
  EXPECT_EQ(totals.loss->loss, 2.0f);  // the mean of 3 and 1
  EXPECT_EQ(totals.loss->correct, 7);  // this rank's count
}

TEST(DataParallelReducer, TheLowestRankThatFoundSomethingIsBlamedOnEveryRank) {
  ReducerFixture f(2);
  const SkipBlame theirs{"backward head.weight.grad", "head"};
  f.comm->peer_text = theirs.to_text();
  EXPECT_EQ(f.reducer->agree_on_blame(SkipBlame{}), theirs);
  const SkipBlame mine{"forward fc1.output", "fc1"};
  EXPECT_EQ(f.reducer->agree_on_blame(mine), mine);  // rank 0 is the lowest
  f.comm->peer_text.clear();
  EXPECT_EQ(f.reducer->agree_on_blame(SkipBlame{}), SkipBlame{});
}

TEST(DataParallelReducer, EvaluationStartsFromRankZerosBuffersAndAStopIsEveryRanks) {
  ReducerFixture f(2);
  f.reducer->before_evaluation(*f.model);  // a model without buffers: nothing to send
  EXPECT_TRUE(f.comm->calls.empty());
  EXPECT_FALSE(f.reducer->any_rank(false));
  EXPECT_EQ(f.comm->calls, std::vector<std::string>{"all_reduce_host 1"});
  // Another rank was asked to stop (Ctrl-C lands on each at its own moment): this one stops too,
  // or it would wait alone in the next step's collective.
  f.comm->peer_text = "stop";
  EXPECT_TRUE(f.reducer->any_rank(false));
  f.comm->peer_text.clear();
  EXPECT_TRUE(f.reducer->any_rank(true));
  EXPECT_EQ(f.comm->calls.size(), 3u);
}

// Each replica evaluates alone and may differ in the last bits (kernels chosen per rank): every
// one must decide early stopping and the best checkpoint from rank 0's numbers.
TEST(DataParallelReducer, EveryRankTakesRankZerosEvaluationNumbers) {
  ReducerFixture f(2);
  EvalResult mine{0.6931471805599453, 0.5, 64, 5, 0.875};
  const EvalResult as_evaluated = mine;
  f.reducer->agree_on_evaluation(mine);  // rank 0 keeps its own
  EXPECT_EQ(f.comm->calls, std::vector<std::string>{"broadcast_host from 0"});
  EXPECT_EQ(mine.loss, as_evaluated.loss);
  EXPECT_EQ(mine.accuracy, as_evaluated.accuracy);
  EXPECT_EQ(mine.top_k_accuracy, as_evaluated.top_k_accuracy);

  f.comm->me = 1;
  const std::array<double, 3> rank0 = {0.6931471805599454, 0.5, 0.8750000000000001};
  f.comm->root_bytes.resize(sizeof rank0);
  std::memcpy(f.comm->root_bytes.data(), rank0.data(), sizeof rank0);
  f.reducer->agree_on_evaluation(mine);
  EXPECT_EQ(mine.loss, rank0[0]);
  EXPECT_EQ(mine.accuracy, rank0[1]);
  EXPECT_EQ(mine.top_k_accuracy, rank0[2]);
  EXPECT_EQ(mine.rows, 64);  // what every rank counts alike stays
  EXPECT_EQ(mine.top_k, 5);

  f.comm->root_bytes.resize(8);  // a build that sends something else: an error, not garbage
  EXPECT_THROW(f.reducer->agree_on_evaluation(mine), sdk::CommunicationError);
}

}  // namespace
}  // namespace mixtrain::core
