// [train] trainable / frozen through the Trainer, in process with the real plugins: a frozen
// prefix of an MLP keeps its weights bit for bit while the loss follows a reference that trains
// everything and puts the frozen layers back after every update; checkpoints keep frozen weights
// but no optimizer state for them, and `check`'s figures split them out; a GPT whose attention
// alone trains learns; patterns that match nothing or freeze everything are refused at their
// line; a resume continues bit for bit, and one with another frozen set is refused.
// Every comparison is between runs made in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "built_plugins.h"
#include "metrics_records.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/graph/model_summary.h"
#include "mixtrain/core/train/trainer.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

const char* kMlp = R"(
[run]
seed = 3
steps = 6
log_every = 1

[backend]
type = "cpu"

[optimizer]
type = "adamw"
lr = 0.01

[data]
source = "synthetic"
batch_size = 32

[data.synthetic]
kind = "clusters"
rows = 512
features = 12
num_classes = 4

[model]
layers = [
  { type = "linear", name = "fc1", out = 32 }, { type = "relu" },
  { type = "linear", name = "fc2", out = 32 }, { type = "relu" },
  { type = "linear", name = "head", out = 4 },
]

[checkpoint]
every = 2
keep = 10
)";

// Everything but the last layer frozen.
const std::vector<std::string> kHeadOnly = {"train.trainable=[\"head\"]"};

using Tensors = std::map<std::string, std::vector<float>>;

Tensors fp32_tensors(const sdk::TrainingState& st) {
  Tensors out;
  for (const auto& t : st.tensors) {
    if (t.dtype != sdk::DType::fp32) continue;
    std::vector<float> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    out[t.name] = v;
  }
  return out;
}

class Freezing : public ::testing::Test {
 protected:
  fs::path dir_ =
      fs::temp_directory_path() / ("mixtrain-freezing-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  core::Experiment experiment(const std::vector<std::string>& sets, const std::string& base) {
    return core::parse_experiment(core::Config::from_string(base, "freeze.toml", sets),
                                  test::built_plugins());
  }
  core::TrainOptions options(const std::string& name) {
    core::TrainOptions opt;
    opt.run_dir = dir_ / name;
    return opt;
  }
  core::TrainSummary train(const std::string& name, const std::vector<std::string>& sets,
                           const std::string& base = kMlp, const std::string& resume = "") {
    auto e = experiment(sets, base);
    auto opt = options(name);
    if (!resume.empty()) opt.resume = resume;
    return core::Trainer(e, core::create_components(e, test::built_plugins()), opt).run();
  }
  sdk::TrainingState checkpoint(const std::string& name, int step) {
    auto c = core::create_components(experiment({}, kMlp), test::built_plugins());
    char file[64];
    std::snprintf(file, sizeof file, "step-%08d", step);
    return c.checkpoint_format->read(dir_ / name / "checkpoints" /
                                     (file + c.checkpoint_format->file_extension()));
  }
  // Each step's record of metrics.jsonl less its measured fields, as text; `key` alone when given.
  std::vector<std::string> records(const std::string& name, const std::string& key = "") {
    std::vector<std::string> out;
    for (const auto& r : test::unmeasured_records(dir_ / name / "metrics.jsonl"))
      if (r.contains("loss")) out.push_back(key.empty() ? r.dump() : r.at(key).dump());
    return out;
  }
};

TEST_F(Freezing, AFrozenPrefixKeepsItsWeightsAndTheLossFollowsTheReference) {
  for (const std::string policy : {"fp32", "bf16-mixed"}) {
    SCOPED_TRACE(policy);
    const std::vector<std::string> precision = {"precision.policy=" + policy};
    auto sets = precision;
    sets.insert(sets.end(), kHeadOnly.begin(), kHeadOnly.end());
    // The frozen run, and its initial weights.
    auto e = experiment(sets, kMlp);
    Tensors initial;
    {
      core::Trainer t(e, core::create_components(e, test::built_plugins()),
                      options("frozen-" + policy));
      initial = fp32_tensors(t.training_state(/*weights_only=*/true));
      t.run();
    }
    // The reference trains every layer and puts fc1 and fc2 back after each update: its head
    // sees what a frozen prefix gives it, so its losses are the frozen run's bit for bit.
    auto r = experiment(precision, kMlp);
    core::Trainer* reference = nullptr;
    auto opt = options("reference-" + policy);
    opt.after_step = [&](std::int64_t) {
      auto& model = reference->model();
      for (auto* p : model.parameters())
        if (p->name.rfind("head.", 0) != 0)
          model.backend().copy_from_host(p->master.view(), initial.at("param/" + p->name).data());
      model.refresh_working_copies();
    };
    core::Trainer ref(r, core::create_components(r, test::built_plugins()), opt);
    reference = &ref;
    ref.run();

    const auto frozen_losses = records("frozen-" + policy, "loss");
    ASSERT_EQ(frozen_losses.size(), 6u);
    EXPECT_EQ(frozen_losses, records("reference-" + policy, "loss"));
    const Tensors last = fp32_tensors(checkpoint("frozen-" + policy, 6));
    const Tensors ref_last = fp32_tensors(checkpoint("reference-" + policy, 6));
    for (const std::string name : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
      EXPECT_EQ(last.at("param/" + name), initial.at("param/" + name)) << name;
    for (const std::string name : {"head.weight", "head.bias"}) {
      EXPECT_NE(last.at("param/" + name), initial.at("param/" + name)) << name;
      EXPECT_EQ(last.at("param/" + name), ref_last.at("param/" + name)) << name;
    }
  }
}

TEST_F(Freezing, FrozenParametersHaveNoMasterNoGradientAndNoOptimizerState) {
  auto sets = kHeadOnly;
  sets.push_back("precision.policy=\"bf16-mixed\"");
  sets.push_back("ema.decay=0.9");
  auto e = experiment(sets, kMlp);
  core::Trainer t(e, core::create_components(e, test::built_plugins()), options("run"));
  t.run();
  // The checkpoint: every parameter's weights in FP32, optimizer state and EMA for the head only.
  std::set<std::string> names;
  for (const auto& tensor : checkpoint("run", 6).tensors) {
    names.insert(tensor.name);
    if (tensor.name.rfind("param/", 0) == 0) {
      EXPECT_EQ(tensor.dtype, sdk::DType::fp32) << tensor.name;
    }
    const bool state = tensor.name.rfind("optimizer/", 0) == 0 || tensor.name.rfind("ema/", 0) == 0;
    if (state) {
      EXPECT_NE(tensor.name.find("head."), std::string::npos) << tensor.name;
    }
  }
  for (const std::string p :
       {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "head.weight", "head.bias"})
    EXPECT_TRUE(names.count("param/" + p)) << p;
  EXPECT_TRUE(names.count("ema/head.weight"));
  EXPECT_TRUE(names.count("optimizer/head.weight.exp_avg"));
  EXPECT_TRUE(names.count("optimizer/head.bias.exp_avg_sq"));
  // On the device: a frozen weight is its bf16 copy alone.
  for (auto* p : t.model().parameters()) {
    const bool head = p->name.rfind("head.", 0) == 0;
    EXPECT_EQ(p->frozen, !head) << p->name;
    EXPECT_EQ(p->grad.empty(), !head) << p->name;
    if (p->name == "fc1.weight" || p->name == "fc2.weight") {
      EXPECT_TRUE(p->master.empty());
      EXPECT_EQ(p->value().dtype, sdk::DType::bf16);
    }
  }
  // `check`'s figures: counts and bytes of each side.
  const auto s = core::summarize_model(t.model(), 32);
  EXPECT_EQ(s.trainable.names, (std::vector<std::string>{"head.weight", "head.bias"}));
  EXPECT_EQ(s.frozen.names,
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(s.trainable.parameters, 32 * 4 + 4);
  EXPECT_EQ(s.frozen.parameters, 12 * 32 + 32 + 32 * 32 + 32);
  // The head: FP32 master and gradient, a bf16 working copy for its weight; the frozen weights
  // in bf16 and their biases in FP32, once.
  EXPECT_EQ(s.trainable.bytes, static_cast<std::size_t>((32 * 4) * (8 + 2) + 4 * 8));
  EXPECT_EQ(s.frozen.bytes, static_cast<std::size_t>((12 * 32 + 32 * 32) * 2 + (32 + 32) * 4));
  EXPECT_EQ(s.parameter_bytes, s.trainable.bytes + s.frozen.bytes);
  // A training step runs the frozen prefix forward only, and the head's weight gradient alone
  // (nothing upstream trains, so no input gradient): the forward plus the head's forward again.
  std::int64_t head_forward = 0;
  for (const auto& n : s.nodes)
    if (n.name == "head") head_forward = n.forward_flops_per_sample;
  ASSERT_GT(head_forward, 0);
  EXPECT_EQ(s.training_flops_per_step, (s.forward_flops_per_sample + head_forward) * 32);
  const std::string text = core::render_model_summary(s);
  EXPECT_NE(text.find("# trainable: 132 parameters in 2 tensors"), std::string::npos) << text;
  EXPECT_NE(text.find("# frozen: 1.47K parameters in 4 tensors"), std::string::npos) << text;
  EXPECT_NE(text.find("fc1.weight, fc1.bias, fc2.weight, fc2.bias"), std::string::npos) << text;
}

TEST_F(Freezing, AGptWhoseAttentionAloneTrainsLearns) {
  fs::create_directories(dir_);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(dir_ / "text.txt") << text;
  const std::string gpt = R"(
[run]
seed = 1
steps = 30
log_every = 1

[backend]
type = "cpu"

[optimizer]
type = "adamw"
lr = 0.01

[model]
preset = "gpt"

[model.gpt]
n_layer = 2
n_head = 2
n_embd = 16

[data]
source = "text"
block_size = 16
batch_size = 8
eval_fraction = 0.1

[data.text]
path = "@TEXT@"

[train]
trainable = ["h.*.attn.*"]
)";
  const std::string config = gpt.substr(0, gpt.find("@TEXT@")) + (dir_ / "text.txt").string() +
                             gpt.substr(gpt.find("@TEXT@") + 6);
  auto e = experiment({}, config);
  core::Trainer t(e, core::create_components(e, test::built_plugins()), options("gpt"));
  const Tensors initial = fp32_tensors(t.training_state(true));
  t.run();
  const Tensors last = fp32_tensors(t.training_state(true));
  int trained = 0;
  for (const auto& [name, values] : initial) {
    if (name.rfind("param/", 0) != 0) continue;
    const bool attention = name.find(".attn.") != std::string::npos;
    if (attention) ++trained;
    if (attention) {
      EXPECT_NE(last.at(name), values) << name;
    } else {
      EXPECT_EQ(last.at(name), values) << name;
    }
  }
  EXPECT_EQ(trained, 2 * 4);  // c_attn and c_proj, weight and bias, per layer
  const auto losses = records("gpt", "loss");
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(std::stod(losses.back()), std::stod(losses.front()) - 0.1);
}

TEST_F(Freezing, PatternsThatMatchNothingOrFreezeEverythingAreRefusedAtTheirLine) {
  const std::string base = std::string(kMlp) + "\n[train]\nfrozen = [\"fc1\", \"fc3\"]\n";
  try {
    train("bad", {}, base);
    FAIL() << "no error";
  } catch (const sdk::ConfigError& err) {
    const std::string m = err.what();
    // The entry's own line and column in the TOML text.
    const auto entry = base.find("\"fc3\"");
    const auto line = std::count(base.begin(), base.begin() + static_cast<long>(entry), '\n') + 1;
    const auto column = entry - base.rfind('\n', entry);
    const std::string where = "freeze.toml:" + std::to_string(line) + ":" + std::to_string(column);
    EXPECT_NE(m.find(where), std::string::npos) << where << "\n" << m;
    EXPECT_NE(m.find("'fc3' matches no parameter"), std::string::npos) << m;
    EXPECT_NE(err.hint().find("the closest: fc1.weight"), std::string::npos) << err.hint();
  }
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "metrics.jsonl"));
  EXPECT_THROW(train("all", {"train.frozen=[\"*\"]"}), sdk::ConfigError);
  EXPECT_THROW(train("empty", {"train.frozen=[\"\"]"}), sdk::ConfigError);
  // Both set: frozen takes out of what trainable selects.
  auto e = experiment({"train.trainable=[\"fc*\"]", "train.frozen=[\"fc1.bias\"]"}, kMlp);
  core::Trainer t(e, core::create_components(e, test::built_plugins()), options("both"));
  std::vector<std::string> trainable;
  for (auto* p : t.model().trainable_parameters()) trainable.push_back(p->name);
  EXPECT_EQ(trainable, (std::vector<std::string>{"fc1.weight", "fc2.weight", "fc2.bias"}));
}

TEST_F(Freezing, AResumeContinuesBitForBitAndRefusesAnotherFrozenSet) {
  auto sets = kHeadOnly;
  sets.push_back("precision.policy=\"bf16-mixed\"");
  train("straight", sets);
  auto first = sets;
  first.push_back("run.steps=2");
  train("resumed", first);
  train("resumed", sets, kMlp, (dir_ / "resumed" / "checkpoints").string());
  EXPECT_EQ(records("straight"), records("resumed"));
  for (int step : {4, 6}) {
    const Tensors a = fp32_tensors(checkpoint("straight", step));
    const Tensors b = fp32_tensors(checkpoint("resumed", step));
    EXPECT_EQ(a, b) << step;
  }
  // Another frozen set: the optimizer's state no longer fits; refused, both sets named.
  try {
    train("resumed", {"precision.policy=\"bf16-mixed\"", "train.frozen=[\"fc1\"]"}, kMlp,
          (dir_ / "resumed" / "checkpoints").string());
    FAIL() << "no error";
  } catch (const sdk::CheckpointError& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("trained with frozen parameters [fc1.bias, fc1.weight, fc2.bias, "
                     "fc2.weight]"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("this one has frozen parameters [fc1.bias, fc1.weight]"), std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace mixtrain
