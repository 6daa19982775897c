// Model state through the Trainer, in process with the real plugins: gradient accumulation
// against the full batch (fp32, bf16-mixed with a dynamic scaler) and an overflow in one
// micro-batch; the EMA of the masters (its recurrence, a resume, evaluation with it); an op's
// buffers in checkpoints, resumes, weights-only loads and safetensors exports, and the eval mode.
// Every comparison is between runs made in the test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "built_plugins.h"
#include "graph/ops/op_registry.h"
#include "metrics_records.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/format_partial_read.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

const char* kBase = R"(
[run]
seed = 5
steps = 4
log_every = 1

[backend]
type = "cpu"

[optimizer]
type = "sgd"
lr = 0.5

[data]
source = "synthetic"
batch_size = 64

[data.synthetic]
kind = "clusters"
rows = 1024
features = 12
num_classes = 4

[model]
layers = [ { type = "linear", out = 16 }, { type = "gelu" }, { type = "linear", out = 4 } ]
)";

core::PluginRegistry& registry() {
  return test::built_plugins();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class TrainingState : public ::testing::Test {
 protected:
  fs::path dir_ =
      fs::temp_directory_path() / ("mixtrain-training-state-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  core::Experiment experiment(const std::vector<std::string>& sets,
                              const std::string& base = kBase) {
    auto config = core::Config::from_string(base, "state.toml", sets);
    return core::parse_experiment(config, registry());
  }
  core::TrainSummary train(const std::string& name, const std::vector<std::string>& sets,
                           const std::string& resume = "", const std::string& base = kBase) {
    auto e = experiment(sets, base);
    core::TrainOptions opt;
    opt.run_dir = dir_ / name;
    if (!resume.empty()) opt.resume = resume;
    return core::Trainer(e, core::create_components(e, registry()), opt).run();
  }
  // The tensors of a run's checkpoint at `step`, by name.
  std::map<std::string, std::vector<float>> tensors(const std::string& name, int step) {
    auto c = core::create_components(experiment({}), registry());
    char file[64];
    std::snprintf(file, sizeof file, "step-%08d", step);
    auto st = c.checkpoint_format->read(dir_ / name / "checkpoints" /
                                        (file + c.checkpoint_format->file_extension()));
    std::map<std::string, std::vector<float>> out;
    for (const auto& t : st.tensors) {
      if (t.dtype != sdk::DType::fp32) continue;
      std::vector<float> v(t.bytes.size() / 4);
      std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
      out[t.name] = v;
    }
    return out;
  }
  std::vector<std::string> metrics(const std::string& name) {
    std::vector<std::string> out;
    for (const auto& record : test::unmeasured_records(dir_ / name / "metrics.jsonl"))
      out.push_back(record.dump());
    return out;
  }
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// An embedding program reads the run's records as they are written (TrainOptions::on_record):
// every line of metrics.jsonl, in order, the evaluation's included.
TEST_F(TrainingState, OnRecordHandsOverEveryLineOfMetricsJsonl) {
  const auto e = experiment({"run.steps=6", "run.log_every=2", "run.eval_every=3"});
  std::vector<std::string> seen;
  core::TrainOptions opt;
  opt.run_dir = dir_ / "observed";
  opt.on_record = [&](std::string_view line) { seen.emplace_back(line); };
  core::Trainer(e, core::create_components(e, registry()), opt).run();
  std::vector<std::string> lines;
  std::ifstream in(opt.run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(seen.size(), lines.size());
  bool evaluation = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto want = nlohmann::json::parse(lines[i]), got = nlohmann::json::parse(seen[i]);
    EXPECT_EQ(got, want) << "record " << i;
    evaluation = evaluation || got.contains("eval_loss");
  }
  EXPECT_TRUE(evaluation) << "no evaluation record was handed over";
}

TEST_F(TrainingState, FourMicroBatchesEqualOneBatchOfFourTimesTheRows) {
  for (const std::string policy : {"fp32", "bf16-mixed"}) {
    const std::vector<std::string> common = {
        "precision.policy=" + policy,
        "scaler.type=" + std::string(policy == "fp32" ? "none" : "dynamic"), "checkpoint.every=1",
        "checkpoint.keep=10"};
    auto full = common, micro = common;
    full.insert(full.end(), {"data.batch_size=64", "run.accumulate=1"});
    micro.insert(micro.end(), {"data.batch_size=16", "run.accumulate=4"});
    const auto a = train("full-" + policy, full), b = train("micro-" + policy, micro);
    EXPECT_EQ(a.applied_steps, 4);
    EXPECT_EQ(b.applied_steps, 4);
    EXPECT_EQ(a.final_loss_scale, b.final_loss_scale);
    for (int step : {1, 4}) {
      const auto ta = tensors("full-" + policy, step), tb = tensors("micro-" + policy, step);
      int params = 0;
      for (const auto& [name, va] : ta) {
        if (name.rfind("param/", 0) != 0) continue;
        ++params;
        const auto& vb = tb.at(name);
        double err = 0;
        for (std::size_t i = 0; i < va.size(); ++i)
          err = std::max(err, static_cast<double>(std::abs(va[i] - vb[i])));
        EXPECT_LE(err, 1e-5 * max_abs(va)) << policy << " step " << step << " " << name;
      }
      EXPECT_EQ(params, 4);
    }
    EXPECT_NEAR(a.eval.loss, b.eval.loss, 1e-5 * std::abs(a.eval.loss)) << policy;
  }
}

TEST_F(TrainingState, AnOverflowInOneMicroBatchSkipsTheWholeStepWithOneBackoff) {
  // fp16-mixed: a feature of 1e6 is inf once cast to fp16, so only the micro-batch holding that
  // row overflows. Two steps of 4 x 8 rows cover the 64 training rows once.
  const int rows = 72, features = 6;
  std::vector<float> x(static_cast<std::size_t>(rows * features));
  std::vector<std::int64_t> y(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    y[static_cast<std::size_t>(r)] = r % 3;
    for (int f = 0; f < features; ++f)
      x[static_cast<std::size_t>(r * features + f)] = 0.1f * static_cast<float>((r * 7 + f) % 11);
  }
  const auto write_npy = [&](const fs::path& p, const std::string& descr, const void* data,
                             std::size_t bytes, const std::string& shape) {
    std::string header =
        "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream out(p, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const std::uint16_t len = static_cast<std::uint16_t>(header.size());
    out.write(reinterpret_cast<const char*>(&len), 2);
    out << header;
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  };
  fs::create_directories(dir_);
  // Every row's features once huge: which one lands in training is the split's business, so
  // poison one and check that exactly one step of the epoch is skipped.
  x[static_cast<std::size_t>(5 * features + 2)] = 1e6f;
  write_npy(dir_ / "x.npy", "<f4", x.data(), x.size() * 4,
            "(" + std::to_string(rows) + ", " + std::to_string(features) + ")");
  write_npy(dir_ / "y.npy", "<i8", y.data(), y.size() * 8, "(" + std::to_string(rows) + ",)");
  const std::string base = R"(
[run]
seed = 1
steps = 2
log_every = 1

[backend]
type = "cpu"

[precision]
policy = "fp16-mixed"

[scaler]
type = "dynamic"

[data]
source = "npy"
batch_size = 8
shuffle = false
eval_fraction = 0.1

[data.npy]
features = ")" + (dir_ / "x.npy").string() +
                           R"("
labels = ")" + (dir_ / "y.npy").string() +
                           R"("

[model]
layers = [ { type = "linear", out = 8 }, { type = "relu" }, { type = "linear", out = 3 } ]
)";
  const auto sum = train("overflow", {"run.accumulate=4"}, "", base);
  const auto eval_has_it = sum.eval.rows > 0 && !std::isfinite(sum.eval.loss);
  const auto records = metrics("overflow");
  int skipped = 0;
  for (const auto& r : records) {
    if (r.find("\"skipped\":true") == std::string::npos) continue;
    ++skipped;
    EXPECT_NE(r.find("micro-batch "), std::string::npos) << r;
    EXPECT_NE(r.find(" of 4: "), std::string::npos) << r;
    // One backoff (0.5 by default) for the whole optimizer step, not one per micro-batch.
    const auto scale = [&](const std::string& key) {
      const auto at = r.find("\"" + key + "\":");
      return std::stod(r.substr(at + key.size() + 3));
    };
    EXPECT_EQ(scale("next_loss_scale"), scale("loss_scale") * 0.5) << r;
  }
  // The poisoned row is in training (one skip) or held out for evaluation (none, and the eval
  // loss is not finite).
  EXPECT_EQ(skipped, eval_has_it ? 0 : 1);
  EXPECT_FALSE(eval_has_it)
      << "seed 1 keeps the poisoned row in training; the test checks nothing otherwise";
  EXPECT_EQ(sum.skipped_steps, skipped);
  EXPECT_EQ(sum.applied_steps + sum.skipped_steps, 2);
}

TEST_F(TrainingState, EmaFollowsTheMastersAndResumesBitIdentically) {
  const std::vector<std::string> sets = {"ema.decay=0.75", "run.steps=6", "checkpoint.every=1",
                                         "checkpoint.keep=10"};
  train("ema", sets);
  // ema_k = decay * ema_(k-1) + (1 - decay) * master_k, computed on the host from the recorded
  // masters.
  auto prev = tensors("ema", 1);
  int compared = 0;
  for (int step = 2; step <= 6; ++step) {
    auto now = tensors("ema", step);
    for (const auto& [name, master] : now) {
      if (name.rfind("param/", 0) != 0) continue;
      const auto& ema_prev = prev.at("ema/" + name.substr(6));
      const auto& ema_now = now.at("ema/" + name.substr(6));
      double err = 0;
      for (std::size_t i = 0; i < master.size(); ++i) {
        const float expect = 0.75f * ema_prev[i] + 0.25f * master[i];
        err = std::max(err, static_cast<double>(std::abs(expect - ema_now[i])));
      }
      EXPECT_LE(err, 1e-6 * max_abs(master)) << name << " step " << step;
      EXPECT_NE(ema_now, master) << name << ": the EMA lags the masters";
      ++compared;
    }
    prev = now;
  }
  EXPECT_EQ(compared, 5 * 4);

  // Steps 4..6 again from the step-3 checkpoint: the same EMA, bit for bit, and the same metrics.
  auto resumed = sets;
  train("resumed", resumed,
        (dir_ / "ema" / "checkpoints" /
         ("step-00000003" +
          core::create_components(experiment({}), registry()).checkpoint_format->file_extension()))
            .string());
  const auto a = tensors("ema", 6), b = tensors("resumed", 6);
  for (const auto& [name, v] : a) {
    if (name.rfind("ema/", 0) == 0 || name.rfind("param/", 0) == 0) {
      EXPECT_EQ(v, b.at(name)) << name;
    }
  }
  const auto ma = metrics("ema"), mb = metrics("resumed");
  ASSERT_GE(ma.size(), 4u);
  ASSERT_EQ(mb.size(), 4u);  // steps 4, 5, 6 and the final evaluation
  for (std::size_t i = 0; i < mb.size(); ++i) EXPECT_EQ(mb[i], ma[ma.size() - mb.size() + i]);
}

// The native format, with every read recorded: the names each read asked for (a whole read()
// asks for all of them).
class RecordingFormat final : public sdk::CheckpointFormat, public sdk::PartialReadFacet {
 public:
  explicit RecordingFormat(std::shared_ptr<sdk::CheckpointFormat> inner)
      : inner_(std::move(inner)),
        partial_(dynamic_cast<const sdk::PartialReadFacet*>(inner_.get())) {}
  std::vector<std::vector<std::string>> reads;

  std::string file_extension() const override { return inner_->file_extension(); }
  void write(const fs::path& path, const sdk::TrainingState& state) const override {
    inner_->write(path, state);
  }
  sdk::TrainingState read(const fs::path& path) const override {
    auto st = inner_->read(path);
    record(st);
    return st;
  }
  sdk::TrainingState read_only(const fs::path& path,
                               const std::function<bool(std::string_view)>& wanted) const override {
    auto st = partial_->read_only(path, wanted);
    record(st);
    return st;
  }

 private:
  void record(const sdk::TrainingState& st) const {
    auto& names = const_cast<RecordingFormat*>(this)->reads.emplace_back();
    for (const auto& t : st.tensors) names.push_back(t.name);
  }
  std::shared_ptr<sdk::CheckpointFormat> inner_;
  const sdk::PartialReadFacet* partial_;
};

// A resume reads the weights and the metadata first, the optimizer's slots left on disk, then
// each slot alone as the optimizer takes it: the host holds one slot at a time, not the whole file
// (two thirds of an AdamW state). The resumed run is the uninterrupted one, bit for bit.
TEST_F(TrainingState, AResumeReadsTheOptimizersSlotsOneAtATime) {
  const std::vector<std::string> sets = {"optimizer.type=adamw", "run.steps=4",
                                         "checkpoint.every=2"};
  train("whole", sets);
  const auto e = experiment(sets);
  auto c = core::create_components(e, registry());
  const auto recording = std::make_shared<RecordingFormat>(c.checkpoint_format);
  c.checkpoint_format = recording;
  core::TrainOptions opt;
  opt.run_dir = dir_ / "resumed";
  opt.resume = dir_ / "whole" / "checkpoints" / ("step-00000002" + recording->file_extension());
  core::Trainer(e, std::move(c), opt).run();

  const auto whole = tensors("whole", 2);
  std::size_t slots = 0;
  for (const auto& [name, v] : whole) slots += name.starts_with("optimizer/") ? 1 : 0;
  ASSERT_GT(slots, 0u) << "AdamW's moments are in the file";
  // The host's probe of what the format keeps (a one-tensor file of its own) is not the resume's.
  std::erase_if(recording->reads,
                [](const auto& r) { return r == std::vector<std::string>{"ema/probe"}; });
  ASSERT_EQ(recording->reads.size(), 1 + slots);
  for (const auto& name : recording->reads.front())
    EXPECT_FALSE(name.starts_with("optimizer/")) << "read with the weights: " << name;
  EXPECT_FALSE(recording->reads.front().empty());
  std::set<std::string> taken;
  for (std::size_t i = 1; i < recording->reads.size(); ++i) {
    ASSERT_EQ(recording->reads[i].size(), 1u) << "read " << i;
    EXPECT_TRUE(recording->reads[i].front().starts_with("optimizer/")) << recording->reads[i][0];
    taken.insert(recording->reads[i].front());
  }
  EXPECT_EQ(taken.size(), slots) << "each slot read once";
  const auto a = tensors("whole", 4), b = tensors("resumed", 4);
  EXPECT_EQ(a, b) << "the resumed run's step-4 state is the uninterrupted run's";
}

TEST_F(TrainingState, EvaluatingWithTheEmaEqualsEvaluatingItsWeights) {
  const auto master = train("master", {"ema.decay=0.9", "eval.weights=master"});
  const auto ema = train("ema", {"ema.decay=0.9", "eval.weights=ema"});
  EXPECT_EQ(master.final_loss, ema.final_loss) << "evaluation does not change training";
  EXPECT_NE(master.eval.loss, ema.eval.loss);

  // A checkpoint whose parameters are the EMA, loaded as initial weights and evaluated.
  auto c = core::create_components(experiment({}), registry());
  const auto ext = c.checkpoint_format->file_extension();
  auto st = c.checkpoint_format->read(dir_ / "ema" / "checkpoints" / ("step-00000004" + ext));
  sdk::TrainingState weights;
  for (const auto& t : st.tensors)
    if (t.name.rfind("ema/", 0) == 0) {
      auto w = t;
      w.name = "param/" + t.name.substr(4);
      weights.tensors.push_back(w);
    }
  ASSERT_EQ(weights.tensors.size(), 4u);
  c.checkpoint_format->write(dir_ / ("ema-weights" + ext), weights);
  auto e = experiment({"checkpoint.init_from=" + (dir_ / ("ema-weights" + ext)).string()});
  core::TrainOptions opt;
  opt.write_outputs = false;
  core::Trainer evaluator(e, core::create_components(e, registry()), opt);
  const auto r = evaluator.evaluate();
  EXPECT_EQ(r.loss, ema.eval.loss);
  EXPECT_EQ(r.accuracy, ema.eval.accuracy);
}

// A test-only op with a buffer: in training it keeps a running mean of its input's columns and
// passes the input through; in evaluation it subtracts that mean. It counts the modes it sees.
class RunningMeanLayer final : public core::Layer {
 public:
  RunningMeanLayer(std::string name, std::int64_t features)
      : Layer(std::move(name), "running_mean", features, features) {}
  static inline int train_calls = 0, eval_calls = 0;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t rows) override {
    Layer::allocate(backend, rows);
    buffers_.clear();
    buffers_.push_back(make_buffer("mean", sdk::Shape{in_}, 0.0f));
  }
  void forward(sdk::TensorView x, std::int64_t rows) override {
    ++(training() ? train_calls : eval_calls);
    std::vector<float> h(static_cast<std::size_t>(rows * in_)), mean(static_cast<std::size_t>(in_));
    backend_->copy_to_host(h.data(), x);
    backend_->copy_to_host(mean.data(), buffers_[0].value.view());
    for (std::int64_t c = 0; c < in_; ++c) {
      auto& m = mean[static_cast<std::size_t>(c)];
      if (training()) {
        double s = 0;
        for (std::int64_t r = 0; r < rows; ++r) s += h[static_cast<std::size_t>(r * in_ + c)];
        m = 0.9f * m + 0.1f * static_cast<float>(s / static_cast<double>(rows));
      } else {
        for (std::int64_t r = 0; r < rows; ++r) h[static_cast<std::size_t>(r * in_ + c)] -= m;
      }
    }
    if (training()) backend_->copy_from_host(buffers_[0].value.view(), mean.data());
    backend_->copy_from_host(output(rows), h.data());
  }
  void backward(sdk::TensorView, sdk::TensorView dy, sdk::TensorView dx, std::int64_t) override {
    if (!dx.empty()) backend_->cast(dy, dx);
  }
};

TEST_F(TrainingState, BuffersAreSavedResumedLoadedAndExported) {
  core::OpDefinition op;
  op.type = "running_mean";
  op.summary = "test only";
  op.build = [](const core::OpNode& n) {
    return core::BuiltOp{std::make_unique<RunningMeanLayer>(n.name, n.inputs[0].back()),
                         n.inputs[0]};
  };
  core::register_op(op);
  const std::vector<std::string> sets = {
      "model.layers=[{type=\"running_mean\", name=\"rm\"}, {type=\"linear\", out=16}, "
      "{type=\"relu\"}, {type=\"linear\", out=4}]"};
  RunningMeanLayer::train_calls = RunningMeanLayer::eval_calls = 0;
  const auto first = train("buffers", sets);
  EXPECT_EQ(RunningMeanLayer::train_calls, 4) << "one training forward per step";
  EXPECT_GT(RunningMeanLayer::eval_calls, 0) << "evaluation runs in eval mode";
  auto saved = tensors("buffers", 4);
  ASSERT_EQ(saved.count("buffer/rm.mean"), 1u);
  EXPECT_GT(max_abs(saved.at("buffer/rm.mean")), 0.0);
  EXPECT_EQ(saved.count("param/rm.mean"), 0u);

  // Weights-only: the buffer comes with the weights (evaluation subtracts it, so a missing one
  // would change the loss).
  auto c = core::create_components(experiment({}), registry());
  const auto ckpt =
      dir_ / "buffers" / "checkpoints" / ("step-00000004" + c.checkpoint_format->file_extension());
  auto e = experiment({sets[0], "checkpoint.init_from=" + ckpt.string()});
  core::TrainOptions opt;
  opt.write_outputs = false;
  core::Trainer loaded(e, core::create_components(e, registry()), opt);
  EXPECT_EQ(loaded.evaluate().loss, first.eval.loss);

  // A resume of the finished run restores it and saves it again unchanged.
  train("resumed", sets, ckpt.string());
  EXPECT_EQ(tensors("resumed", 4).at("buffer/rm.mean"), saved.at("buffer/rm.mean"));

  // Exported beside the parameters under its plain name.
  std::shared_ptr<sdk::CheckpointFormat> safetensors;
  for (const auto& comp : registry().components())
    if (comp.info.kind == sdk::ComponentKind::checkpoint_format && comp.info.name == "safetensors")
      safetensors = registry().create<sdk::CheckpointFormat>(
          comp, sdk::Options::resolve("checkpoint", comp.info.options, {}, {}));
  ASSERT_TRUE(safetensors);
  safetensors->write(dir_ / "export.safetensors", c.checkpoint_format->read(ckpt));
  const auto exported = safetensors->read(dir_ / "export.safetensors");
  std::vector<std::string> names;
  for (const auto& t : exported.tensors) names.push_back(t.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "rm.mean"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "linear1.weight"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "ema/linear1.weight"), names.end());
}

// A stop asked for while a step runs (Ctrl-C) makes that step the last: its record is written
// with its own loss (the plan had not asked for it: steps are logged every 1000 here), its
// checkpoint is the run's final one, and no further step trains. One asked for while the step's
// periodic checkpoint is written stops there too, and that checkpoint is the final one. With
// checkpoint.final = false, the stopped step keeps its periodic checkpoint. Each run's weights and
// last loss are an uninterrupted run's at the same step.
TEST_F(TrainingState, AStopAskedForDuringAStepEndsTheRunAfterThatStep) {
  train("whole", {"run.steps=10", "checkpoint.every=1", "checkpoint.keep=10"});
  std::map<std::int64_t, double> whole_loss;
  for (const auto& r : test::unmeasured_records(dir_ / "whole" / "metrics.jsonl"))
    if (r.contains("loss")) whole_loss[r["step"].get<std::int64_t>()] = r["loss"].get<double>();
  struct Case {
    std::string name;
    std::int64_t stop_at;
    bool during_checkpoint;  // else during the step
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases = {
      {"in-step", 3, false, {"checkpoint.every=4"}},
      {"in-checkpoint", 4, true, {"checkpoint.every=4"}},
      {"no-final", 3, false, {"checkpoint.every=3", "checkpoint.final=false"}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto sets = c.sets;
    sets.insert(sets.end(), {"run.steps=10", "run.log_every=1000", "checkpoint.keep=10"});
    const auto e = experiment(sets);
    core::TrainOptions opt;
    opt.run_dir = dir_ / c.name;
    char own[32];
    std::snprintf(own, sizeof own, "step-%08lld.mxt", static_cast<long long>(c.stop_at));
    const auto checkpoints = opt.run_dir / "checkpoints";
    bool asked = false;
    opt.after_step = [&](std::int64_t step) {
      asked = asked || (!c.during_checkpoint && step == c.stop_at);
    };
    opt.stop_requested = [&] {
      return asked || (c.during_checkpoint && fs::exists(checkpoints / own));
    };
    const auto summary = core::Trainer(e, core::create_components(e, registry()), opt).run();
    EXPECT_TRUE(summary.interrupted);
    EXPECT_EQ(summary.steps, c.stop_at);
    EXPECT_EQ(summary.final_loss, whole_loss.at(c.stop_at));
    std::vector<std::string> written;
    for (const auto& f : fs::directory_iterator(checkpoints))
      written.push_back(f.path().filename().string());
    EXPECT_EQ(written, std::vector<std::string>{own});
    const auto records = test::unmeasured_records(opt.run_dir / "metrics.jsonl");
    ASSERT_FALSE(records.empty());
    EXPECT_EQ(records.back()["step"].get<std::int64_t>(), c.stop_at);
    EXPECT_EQ(records.back()["loss"].get<double>(), whole_loss.at(c.stop_at));
    EXPECT_EQ(tensors(c.name, static_cast<int>(c.stop_at)),
              tensors("whole", static_cast<int>(c.stop_at)));
  }
}

// Counts what a StepObserver is shown; reads every tensor it is handed, as calibration does.
// An error after a step's update (here an embedding program's hook) writes that step's state
// before it ends the run: its checkpoint resumes to the uninterrupted run bit for bit, EMA and
// SGD's momentum included. With an escalation on, the step's end waits for its escalation: an
// error before it writes nothing (train/settled_state.h). The CLI's case, a damaged image drawn
// between two steps, is CliImageFolders.AnErrorBetweenStepsSavesTheLastStep.
TEST_F(TrainingState, AnErrorAfterAStepsUpdateSavesThatStep) {
  const std::vector<std::string> sets = {"run.steps=6", "checkpoint.every=0", "ema.decay=0.75",
                                         "optimizer.sgd.momentum=0.9"};
  train("whole", sets);
  const auto stopped_at = [&](const std::string& name, std::vector<std::string> with) {
    auto e = experiment(with);
    core::TrainOptions opt;
    opt.run_dir = dir_ / name;
    opt.after_step = [](std::int64_t step) {
      if (step == 3) throw std::runtime_error("the embedding program's hook failed");
    };
    core::Trainer trainer(e, core::create_components(e, registry()), opt);
    EXPECT_THROW(trainer.run(), std::runtime_error);
  };
  stopped_at("stopped", sets);
  const fs::path saved = dir_ / "stopped" / "checkpoints" / "step-00000003.mxt";
  ASSERT_TRUE(fs::exists(saved));
  EXPECT_EQ(std::distance(fs::directory_iterator(saved.parent_path()), fs::directory_iterator()),
            1);
  train("resumed", sets, saved.string());
  EXPECT_EQ(tensors("resumed", 6), tensors("whole", 6));

  auto escalating = sets;
  escalating.push_back("precision.policy=bf16-mixed");
  escalating.push_back("precision.escalate.after=3");
  stopped_at("escalating", escalating);
  EXPECT_FALSE(fs::exists(dir_ / "escalating" / "checkpoints" / "step-00000003.mxt"));
}

class CountingObserver final : public core::StepObserver {
 public:
  void after_forward(core::Model& model, std::size_t node, core::Extent e) override {
    ++forwards;
    read(model, model.executor().activation(core::TensorId::node(node), e));
  }
  void after_backward(core::Model& model, std::size_t, core::Extent,
                      std::span<const sdk::TensorView> input_grads) override {
    ++backwards;
    for (const auto& g : input_grads)
      if (!g.empty()) read(model, g);
  }
  void after_step(std::int64_t step) override { steps.push_back(step); }
  int forwards = 0, backwards = 0;
  std::vector<std::int64_t> steps;

 private:
  void read(core::Model& model, const sdk::TensorView& v) {
    if (v.data == nullptr) return;
    std::vector<float> host(static_cast<std::size_t>(v.numel()));
    model.backend().copy_to_host(host.data(), v);
  }
};

// The embedding API's misuse is a clear exception, never a second pass over a finished run's
// files or a read past a Dataset's vectors.
TEST_F(TrainingState, ASecondRunAndPredictionInputsOfAnotherFormThrow) {
  const auto e = experiment({"run.steps=2"});
  core::TrainOptions opt;
  opt.run_dir = dir_ / "once";
  core::Trainer t(e, core::create_components(e, registry()), opt);
  t.run();
  const std::string summary = slurp(dir_ / "once" / "summary.json");
  EXPECT_THROW(t.run(), std::logic_error);
  EXPECT_EQ(slurp(dir_ / "once" / "summary.json"), summary);  // untouched

  const core::Dataset& good = t.eval_data().rows > 0 ? t.eval_data() : t.train_data();
  EXPECT_NO_THROW(t.predict(good, good.rows, nullptr));
  core::Dataset short_x = good;
  short_x.x.resize(10);
  EXPECT_THROW(t.predict(short_x, 0, nullptr), std::invalid_argument);
  core::Dataset narrow = good;
  narrow.features = good.features / 2;
  narrow.x.resize(static_cast<std::size_t>(narrow.rows * narrow.features));
  EXPECT_THROW(t.predict(narrow, 0, nullptr), std::invalid_argument);
  // The batch gather reads a label per row: rows without any are refused, even unlabelled ones
  // (a label of any class does for those).
  core::Dataset unlabelled = good;
  unlabelled.y.clear();
  EXPECT_THROW(t.predict(unlabelled, good.rows, nullptr), std::invalid_argument);
  EXPECT_THROW(t.predict(unlabelled, 0, nullptr), std::invalid_argument);
  unlabelled.y.assign(static_cast<std::size_t>(good.rows), 0);
  EXPECT_NO_THROW(t.predict(unlabelled, 0, nullptr));
  // Fewer rows than the vectors hold (the first N of a split) are fine.
  core::Dataset first = good;
  first.rows = std::min<std::int64_t>(good.rows, 10);
  EXPECT_NO_THROW(t.predict(first, first.rows, nullptr));
}

TEST_F(TrainingState, AnObservedStepLimitedRunTrainsAsAPlainOne) {
  // Two micro-batches per step: the observer sees both, and after_step once per step.
  const auto e = experiment({"run.accumulate=2", "data.batch_size=32"});
  core::TrainOptions plain;
  plain.write_outputs = false;
  plain.step_limit = 3;
  core::Trainer a(e, core::create_components(e, registry()), plain);
  const auto sa = a.run();
  CountingObserver observer;
  core::TrainOptions observed = plain;
  observed.observer = &observer;
  core::Trainer b(e, core::create_components(e, registry()), observed);
  const auto sb = b.run();

  // step_limit: 3 of the configured 4 steps, no final evaluation.
  EXPECT_EQ(sa.steps, 3);
  EXPECT_FALSE(sa.evaluated);
  EXPECT_EQ(sb.steps, 3);
  EXPECT_EQ(observer.steps, (std::vector<std::int64_t>{1, 2, 3}));
  const int nodes = static_cast<int>(b.model().layers().size());
  EXPECT_EQ(observer.forwards, 3 * 2 * nodes);
  EXPECT_EQ(observer.backwards, 3 * 2 * nodes);
  // The same weights, bit for bit.
  const auto ta = a.training_state(true), tb = b.training_state(true);
  ASSERT_EQ(ta.tensors.size(), tb.tensors.size());
  for (std::size_t i = 0; i < ta.tensors.size(); ++i) {
    EXPECT_EQ(ta.tensors[i].name, tb.tensors[i].name);
    EXPECT_EQ(ta.tensors[i].bytes, tb.tensors[i].bytes) << ta.tensors[i].name;
  }
  EXPECT_EQ(sa.final_loss, sb.final_loss);
}

}  // namespace
}  // namespace mixtrain
