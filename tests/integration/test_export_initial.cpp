// `mixtrain export CONFIG --initial` writes the weights step 1 of `train` starts from, bit for bit:
// each file the executable writes is compared with the masters and buffers of a Trainer built in
// this process from the same config, as `mixtrain train` builds it, before its first update. An
// MLP under bf16-mixed (working copies exist; the FP32 masters are exported), a CNN with batch
// norm's running statistics, and a config whose checkpoint.init_from holds a trained run's export.
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "built_plugins.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/trainer.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

const char* kMlp = R"(
[run]
name = "mlp"
seed = 7
steps = 2
log_every = 1
eval_every = 0
[backend]
type = "cpu"
threads = 1
[precision]
policy = "bf16-mixed"
[scaler]
type = "dynamic"
[optimizer]
type = "sgd"
lr = 0.1
[model]
layers = [ { type = "linear", name = "fc1", out = 16 }, { type = "gelu" },
           { type = "linear", name = "head", out = 4 } ]
[data]
source = "synthetic"
batch_size = 32
[data.synthetic]
kind = "clusters"
rows = 256
features = 12
num_classes = 4
[checkpoint]
fsync = false
)";

// configs/cnn-small.toml (conv, batch norm, pooling, a linear head) on a few small batches.
const char* kSmallCnn =
    " --set data.synthetic.rows=256 --set data.batch_size=32 --set data.eval_batch_size=64"
    " --set backend.threads=1 --set run.eval_every=0";

core::PluginRegistry& registry() {
  return test::built_plugins();
}

struct Weight {
  std::vector<std::int64_t> shape;
  std::string bytes;  // FP32
  bool operator==(const Weight&) const = default;
};
using Weights = std::map<std::string, Weight>;

// " --set a=b --set c=d" as the list Config takes.
std::vector<std::string> set_lines(const std::string& args) {
  std::vector<std::string> sets;
  std::istringstream in(args);
  for (std::string word; in >> word;)
    if (word != "--set") sets.push_back(word);
  return sets;
}

class ExportInitial : public CliTest {
 protected:
  // The masters and buffers of a Trainer built from `config` as `mixtrain train` builds it (its
  // run folder written), read from the device before run(): before its first update.
  Weights before_first_update(const std::string& config, const std::string& sets) {
    const auto experiment =
        core::parse_experiment(core::Config::from_file(config, set_lines(sets)), registry());
    auto components = core::create_components(experiment, registry());
    const auto backend = components.backend;
    core::TrainOptions options;
    options.run_dir = dir_ / ("in-process-" + std::to_string(++trainers_));
    core::Trainer trainer(experiment, std::move(components), options);
    Weights out;
    auto copy = [&](const std::string& name, sdk::TensorView v) {
      EXPECT_EQ(v.dtype, sdk::DType::fp32) << name;
      Weight w{v.shape.to_vector(), std::string(v.bytes(), '\0')};
      backend->copy_to_host(w.bytes.data(), v);
      EXPECT_TRUE(out.emplace(name, std::move(w)).second) << name;
    };
    for (auto* p : trainer.model().parameters()) copy(p->name, p->master.view());
    for (auto* b : trainer.model().buffers()) copy(b->name, b->value.view());
    return out;
  }

  // `mixtrain export CONFIG --initial` into `name`.safetensors: its tensors (all F32) and metadata.
  std::pair<Weights, json> exported(const std::string& config, const std::string& sets,
                                    const std::string& name) {
    const auto out = dir_ / (name + ".safetensors");
    const auto r =
        run("export " + config + " --initial --format safetensors --out " + out.string() + sets);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_weights(out);
  }

  static std::pair<Weights, json> read_weights(const fs::path& file) {
    const auto f = read_st(file);
    Weights w;
    for (const auto& t : f.tensors) {
      EXPECT_EQ(t.dtype, "F32") << t.name;
      w[t.name] = {t.shape, t.bytes};
    }
    return {w, f.metadata};
  }

  // Bit for bit, name by name, and nothing more or less.
  static void expect_same(const Weights& file, const Weights& trainer) {
    for (const auto& [name, w] : trainer) {
      const auto it = file.find(name);
      ASSERT_NE(it, file.end()) << "the export lacks '" << name << "'";
      EXPECT_EQ(it->second.shape, w.shape) << name;
      EXPECT_TRUE(it->second.bytes == w.bytes) << name << " differs from the trainer's";
    }
    for (const auto& [name, w] : file)
      EXPECT_TRUE(trainer.count(name)) << "the export holds '" << name << "', not the trainer";
  }

  int trainers_ = 0;
};

TEST_F(ExportInitial, MlpIsTheTrainersMastersBeforeItsFirstUpdate) {
  const auto config = write_file("mlp.toml", kMlp).string();
  const auto [file, meta] = exported(config, "", "mlp");
  const auto trainer = before_first_update(config, "");
  ASSERT_EQ(trainer.size(), 4u);  // fc1 and head, weight and bias
  expect_same(file, trainer);
  EXPECT_EQ(meta.value("step", ""), "0");
  EXPECT_EQ(meta.value("policy", ""), "bf16-mixed");
  EXPECT_NE(meta.value("mixtrain.config", "").find("seed = 7"), std::string::npos) << meta.dump();

  // --set applies: another seed, other weights, and still the trainer's.
  const auto [reseeded, meta2] = exported(config, " --set run.seed=8", "mlp-seed-8");
  expect_same(reseeded, before_first_update(config, " --set run.seed=8"));
  EXPECT_NE(reseeded.at("fc1.weight"), file.at("fc1.weight"));
}

TEST_F(ExportInitial, CnnHoldsTheMastersAndTheBatchNormBuffers) {
  const auto config = CliTest::config("cnn-small.toml");
  const auto [file, meta] = exported(config, kSmallCnn, "cnn");
  const auto trainer = before_first_update(config, kSmallCnn);
  expect_same(file, trainer);
  for (const char* buffer : {"bn1.running_mean", "bn1.running_var", "bn2.running_mean"})
    EXPECT_TRUE(file.count(buffer)) << buffer;
}

// The export of a trained CNN run (trained batch-norm statistics) as checkpoint.init_from: the
// initial weights are that file's tensors, under its names, and the trainer's.
TEST_F(ExportInitial, InitFromIsLoadedAfterTheSeededInitialisation) {
  const auto config = CliTest::config("cnn-small.toml");
  auto r = run("train " + config + kSmallCnn + " --set run.steps=2 --run-dir " +
               (dir_ / "trained").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto trained = dir_ / "trained.safetensors";
  r = run("export " + (dir_ / "trained").string() + " --format safetensors --out " +
          trained.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const std::string sets =
      std::string(kSmallCnn) + " --set checkpoint.init_from=" + trained.string();
  const auto [file, meta] = exported(config, sets, "initial");
  expect_same(file, before_first_update(config, sets));
  const auto [from_run, run_meta] = read_weights(trained);
  EXPECT_EQ(file, from_run) << "the same names, shapes and bits as the trained run's export";
  EXPECT_EQ(meta.value("step", ""), "0");
  EXPECT_EQ(run_meta.value("step", ""), "2");

  // Without init_from, the seeded initialisation: the trained statistics are not there.
  const auto [seeded, seeded_meta] = exported(config, kSmallCnn, "seeded");
  EXPECT_NE(seeded.at("bn1.running_mean"), file.at("bn1.running_mean"));
  EXPECT_NE(seeded.at("conv1.weight"), file.at("conv1.weight"));
}

}  // namespace
}  // namespace mixtrain::test
