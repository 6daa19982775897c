// Hugging Face GPT-2 interop through the `mixtrain` executable: `export --layout gpt2`,
// `checkpoint.init_from` with `init_layout = "gpt2"` and `eval --layout gpt2`.
//
// Gpt2LayoutCli tests need no GPT: a model whose linears carry GPT-2 names reads a GPT-2-layout
// file the test writes from mixtrain's own export, and the errors name the tensor. Gpt2Torch* tests
// train the gpt preset on llm.c token files, starting from weights PyTorch wrote
// (tests/integration/gpt_reference.py, run by /usr/bin/python3 with torch; skipped without it),
// and check that PyTorch computes mixtrain's held-out loss from the exported file.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gpt_torch_support.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

// [rows, cols] F32 -> [cols, rows]
StTensor transposed(StTensor t) {
  const auto rows = static_cast<std::size_t>(t.shape.at(0)),
             cols = static_cast<std::size_t>(t.shape.at(1));
  std::string out(t.bytes.size(), '\0');
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      std::memcpy(&out[(c * rows + r) * 4], &t.bytes[(r * cols + c) * 4], 4);
  t.bytes = std::move(out);
  t.shape = {t.shape[1], t.shape[0]};
  return t;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- Without a GPT: a model whose linears have GPT-2 names -------------------------------------

// 16 features -> h.0.mlp.c_fc (64) -> gelu -> h.0.mlp.c_proj (16 classes): two Conv1D weights,
// neither square, so a missed or extra transpose cannot fit.
const char* kGptNamedMlp = R"(
[run]
name = "gpt-named"
seed = 2
steps = 2
log_every = 1
eval_every = 0
[backend]
type = "cpu"
threads = 1
[precision]
policy = "fp32"
[scaler]
type = "none"
[optimizer]
type = "adamw"
[model]
loss = "softmax_cross_entropy"
layers = [
  { type = "linear", name = "h.0.mlp.c_fc", out = 64 },
  { type = "gelu", name = "h.0.mlp.gelu" },
  { type = "linear", name = "h.0.mlp.c_proj", out = 16 },
]
[data]
source = "synthetic"
batch_size = 32
eval_fraction = 0.25
[data.synthetic]
rows = 512
features = 16
num_classes = 16
[checkpoint]
fsync = false
)";

class Gpt2LayoutCli : public CliTest {
 protected:
  // Trains the GPT-named MLP two steps, exports it in the native layout and writes the same
  // weights as a GPT2LMHeadModel file (transformer. prefix, Conv1D weights, a mask buffer).
  void SetUp() override {
    CliTest::SetUp();
    config_ = write_file("gpt-named.toml", kGptNamedMlp);
    auto r = run("train " + config_.string() + " --run-dir " + (dir_ / "run").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    native_ = dir_ / "native.safetensors";
    r = run("export " + (dir_ / "run").string() + " --format safetensors --out " +
            native_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    StFile f = read_st(native_);
    for (auto& t : f.tensors) {
      if (t.name.size() > 7 && t.name.substr(t.name.size() - 7) == ".weight") t = transposed(t);
      t.name = "transformer." + t.name;
    }
    StTensor mask{"transformer.h.0.attn.bias", "F32", {1, 1, 4, 4}, std::string(64, '\0')};
    f.tensors.push_back(mask);
    f.metadata = json::object();
    gpt2_file_ = f;
    gpt2_ = dir_ / "gpt2.safetensors";
    write_st(gpt2_, f);
  }

  CliResult eval(const fs::path& weights, const std::string& layout) {
    return run("eval " + config_.string() + " --checkpoint " + weights.string() +
               (layout.empty() ? "" : " --layout " + layout));
  }

  fs::path config_, native_, gpt2_;
  StFile gpt2_file_;
};

TEST_F(Gpt2LayoutCli, AGpt2FileEvaluatesAndInitialisesExactlyLikeTheNativeOne) {
  auto a = eval(native_, "");
  auto b = eval(gpt2_, "gpt2");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(json::parse(a.out)["eval_loss"], json::parse(b.out)["eval_loss"]);

  // init_from + init_layout: the first step's loss is that of the same weights read natively.
  auto first_loss = [&](const std::string& sets, const std::string& name) {
    auto r = run("train " + config_.string() + " --set run.steps=1 " + sets + " --run-dir " +
                 (dir_ / name).string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const auto& rec : records(dir_ / name / "metrics.jsonl"))
      if (rec.contains("loss")) return rec["loss"].get<double>();
    ADD_FAILURE() << name << ": no loss logged";
    return 0.0;
  };
  const double native = first_loss("--set checkpoint.init_from=" + native_.string(), "n");
  const double gpt2 = first_loss(
      "--set checkpoint.init_from=" + gpt2_.string() + " --set checkpoint.init_layout=gpt2", "g");
  EXPECT_EQ(native, gpt2);
  // The run's resolved config keeps the layout.
  EXPECT_TRUE(contains(slurp(dir_ / "g" / "config.toml"), "init_layout = \"gpt2\""));
}

TEST_F(Gpt2LayoutCli, AFileInTheOtherLayoutExits2NamingTheTensorAndTheLayoutThatFits) {
  // The GPT-2 file read natively: its names carry the prefix.
  auto r = eval(gpt2_, "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "'h.0.mlp.c_fc.weight'")) << r.err;
  EXPECT_TRUE(contains(r.err, "gpt2 layout")) << r.err;

  // Without the prefix, read natively: the Conv1D shape is the transpose of the expected one.
  StFile bare = gpt2_file_;
  for (auto& t : bare.tensors) t.name = t.name.substr(std::string("transformer.").size());
  bare.tensors.pop_back();  // the mask buffer, which a native read would only warn about
  write_st(dir_ / "bare.safetensors", bare);
  r = eval(dir_ / "bare.safetensors", "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "'h.0.mlp.c_fc.weight' has shape [16, 64]")) << r.err;
  EXPECT_TRUE(contains(r.err, "expects [64, 16]")) << r.err;
  EXPECT_TRUE(contains(r.err, "checkpoint.init_layout = \"gpt2\"")) << r.err;

  // The native file read as GPT-2: said the other way round.
  r = run("train " + config_.string() + " --set checkpoint.init_from=" + native_.string() +
          " --set checkpoint.init_layout=gpt2 --run-dir " + (dir_ / "x").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "'h.0.mlp.c_fc.weight' has shape [64, 16]")) << r.err;
  EXPECT_TRUE(contains(r.err, "checkpoint.init_layout = \"native\"")) << r.err;
}

TEST_F(Gpt2LayoutCli, MissingExtraAndUnknownTensorsExit2NamingThem) {
  auto with = [&](const std::string& name, auto edit) {
    StFile f = gpt2_file_;
    edit(f);
    write_st(dir_ / name, f);
    return eval(dir_ / name, "gpt2");
  };
  auto r = with("missing.safetensors", [](StFile& f) {
    std::erase_if(f.tensors,
                  [](const StTensor& t) { return t.name == "transformer.h.0.mlp.c_proj.bias"; });
  });
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "no tensor for parameter 'h.0.mlp.c_proj.bias'")) << r.err;

  r = with("extra.safetensors", [](StFile& f) {
    f.tensors.push_back({"transformer.h.1.ln_1.weight", "F32", {16}, std::string(64, '\0')});
  });
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "'transformer.h.1.ln_1.weight' matches no parameter")) << r.err;

  r = with("unknown.safetensors", [](StFile& f) {
    f.tensors.push_back({"transformer.h.0.attn.rotary", "F32", {4}, std::string(16, '\0')});
  });
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "'transformer.h.0.attn.rotary'")) << r.err;

  // A head that is not wte.weight (here there is no wte at all) cannot load into a tied model.
  r = with("head.safetensors", [](StFile& f) {
    f.tensors.push_back({"lm_head.weight", "F32", {16, 4}, std::string(256, '\0')});
  });
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "lm_head.weight")) << r.err;
}

using Gpt2Cli = CliTest;

TEST_F(Gpt2Cli, InitLayoutIsValidatedAndExportRefusesANonGptModelInTheGpt2Layout) {
  auto r = run("check " + quickstart() + " --set checkpoint.init_layout=gpt2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "checkpoint.init_layout")) << r.err;
  EXPECT_TRUE(contains(r.err, "init_from")) << r.err;
  r = run("check " + quickstart() + " --set checkpoint.init_layout=conv1d");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "init_layout")) << r.err;
  r = run("check " + quickstart());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "init_layout = \"native\"")) << r.out;

  const auto run_dir = dir_ / "run";
  r = run("train " + quickstart() + " --set run.steps=2 --set backend.threads=1 --run-dir " +
          run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = dir_ / "mlp.safetensors";
  r = run("export " + run_dir.string() + " --format safetensors --layout gpt2 --out " +
          out.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "no tensor 'wte.weight'")) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // A layout that is none: refused as the command line is read, naming the layouts.
  r = run("export " + run_dir.string() + " --format safetensors --layout conv1d --out " +
          out.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--layout: conv1d not in {native,gpt2,hf,peft}")) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

// ---- A GPT trained from PyTorch's weights, checked by PyTorch -----------------------------------

// 2 layers, 2 heads, 32 wide, 16 positions, 64 tokens: small enough for a test, every shape of
// GPT-2 there (c_attn 3C, c_fc 4C, tied head).
const char* kGptConfig = R"(
[run]
name = "gpt2-interop"
seed = 3
steps = 4
log_every = 1
eval_every = 0
[backend]
type = "cpu"
threads = 1
[precision]
policy = "fp32"
[scaler]
type = "none"
[optimizer]
type = "adamw"
[optimizer.adamw]
lr = 0.001
weight_decay = 0.0
[model]
preset = "gpt"
[model.gpt]
n_layer = 2
n_head = 2
n_embd = 32
[data]
source = "tokens"
train = "train.bin"
eval = "eval.bin"
block_size = 16
vocab_size = 64
batch_size = 4
shuffle = false
[checkpoint]
fsync = false
init_from = "init.safetensors"
init_layout = "gpt2"
)";

class Gpt2Torch : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (!torch_available()) GTEST_SKIP() << torch_missing_message("GPT-2 interop");
    config_ = write_file("gpt.toml", kGptConfig);
    write_token_walk(dir_ / "train.bin", 2000, 1);
    write_token_walk(dir_ / "eval.bin", 16 * 12 + 1, 2);
    python(
        "init --n-layer 2 --n-head 2 --n-embd 32 --block-size 16 --vocab-size 64 --seed 11 "
        "--layout gpt2 --out " +
        (dir_ / "init.safetensors").string());
  }

  json python(const std::string& args) { return run_gpt_reference(dir_, args); }

  json torch_loss(const fs::path& weights) {
    return python("loss --weights " + weights.string() + " --tokens " +
                  (dir_ / "eval.bin").string() + " --block-size 16");
  }

  json mixtrain_eval(const std::string& checkpoint_and_layout) {
    auto r = run("eval " + config_.string() + " --checkpoint " + checkpoint_and_layout);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out, nullptr, false);
  }

  static void expect_close(const json& ours, const json& theirs, const std::string& what) {
    ASSERT_TRUE(ours.is_object() && theirs.is_object()) << what;
    EXPECT_EQ(ours["rows"], theirs["windows"]) << what;
    const double a = ours["eval_loss"], b = theirs["loss"];
    EXPECT_LT(std::abs(a - b) / std::abs(b), 1e-5) << what << ": mixtrain " << a << " torch " << b;
  }

  fs::path config_;
};

// No training needed: PyTorch's weights in its native layout, exported by mixtrain in the gpt2
// layout, are byte for byte the file PyTorch writes in the gpt2 layout from the same seed.
TEST_F(Gpt2Torch, ExportWritesWhatPyTorchWritesInTheGpt2Layout) {
  const auto native = dir_ / "native.safetensors", exported = dir_ / "exported.safetensors";
  python(
      "init --n-layer 2 --n-head 2 --n-embd 32 --block-size 16 --vocab-size 64 --seed 11 "
      "--layout native --out " +
      native.string());
  auto r = run("export " + native.string() + " --format safetensors --layout gpt2 --out " +
               exported.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StFile theirs = read_st(dir_ / "init.safetensors"), ours = read_st(exported);
  ASSERT_EQ(ours.tensors.size(), theirs.tensors.size());
  for (const auto& t : theirs.tensors) {
    const StTensor* u = ours.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->shape, t.shape) << t.name;
    EXPECT_TRUE(u->bytes == t.bytes) << t.name;
  }
  EXPECT_EQ(ours.metadata.value("n_head", ""), "2");  // kept from PyTorch's metadata
  EXPECT_EQ(ours.metadata.value("n_layer", ""), "2");
  // A file in the gpt2 layout already is not converted twice.
  r = run("export " + exported.string() + " --format safetensors --layout gpt2 --out " +
          (dir_ / "twice.safetensors").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "gpt2 layout already")) << r.err;
}

TEST_F(Gpt2Torch, TrainedFromTorchWeightsAndExportedPyTorchComputesMixtrainsHeldOutLoss) {
  const auto init = dir_ / "init.safetensors";
  // 0 steps: PyTorch's file read in the gpt2 layout evaluates to PyTorch's loss.
  expect_close(mixtrain_eval(init.string() + " --layout gpt2"), torch_loss(init), "initial");

  // A few steps from it (init_from + init_layout in the config).
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config_.string() + " --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The first step's loss is the initial weights' loss on the first batch: PyTorch's too.
  const auto torch_step =
      python("train --weights " + init.string() + " --tokens " + (dir_ / "train.bin").string() +
             " --block-size 16 --batch 4 --steps 1 --lr 0.001");
  double first = -1;
  for (const auto& rec : records(run_dir / "metrics.jsonl"))
    if (rec.contains("loss") && first < 0) first = rec["loss"].get<double>();
  ASSERT_TRUE(torch_step.is_object());
  const double torch_first = torch_step["losses"][0];
  EXPECT_LT(std::abs(first - torch_first) / torch_first, 1e-5)
      << "mixtrain " << first << " torch " << torch_first;

  const auto out = dir_ / "trained.safetensors";
  r = run("export " + run_dir.string() + " --format safetensors --layout gpt2 --out " +
          out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const StFile f = read_st(out);
  EXPECT_EQ(f.metadata.value("n_layer", ""), "2");
  EXPECT_EQ(f.metadata.value("n_head", ""), "2");
  EXPECT_EQ(f.metadata.value("n_embd", ""), "32");
  EXPECT_EQ(f.metadata.value("vocab_size", ""), "64");
  EXPECT_EQ(f.metadata.value("n_positions", ""), "16");
  StFile copy = f;
  ASSERT_NE(copy.find("h.1.attn.c_attn.weight"), nullptr);
  EXPECT_EQ(copy.find("h.1.attn.c_attn.weight")->shape, (std::vector<std::int64_t>{32, 96}));
  EXPECT_EQ(copy.find("h.1.mlp.c_proj.weight")->shape, (std::vector<std::int64_t>{128, 32}));
  EXPECT_EQ(copy.find("lm_head.weight"), nullptr);

  // PyTorch reads the exported file (the head count from its metadata) and agrees with eval.
  expect_close(mixtrain_eval(run_dir.string()), torch_loss(out), "after 4 steps");
}

TEST_F(Gpt2Torch, ExportThenInitFromRoundTripsBitExactly) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config_.string() + " --set run.steps=2 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto a = dir_ / "a.safetensors";
  r = run("export " + run_dir.string() + " --format safetensors --layout gpt2 --out " + a.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // Start a run from the export and take one step of learning rate 0: its checkpoint holds the
  // weights exactly as loaded; exported again, every tensor's bytes are the first export's.
  const auto again = dir_ / "again";
  r = run("train " + config_.string() + " --set run.steps=1 --set optimizer.adamw.lr=0" +
          " --set checkpoint.init_from=" + a.string() + " --run-dir " + again.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto b = dir_ / "b.safetensors";
  r = run("export " + again.string() + " --format safetensors --layout gpt2 --out " + b.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StFile fa = read_st(a), fb = read_st(b);
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  for (const auto& t : fa.tensors) {
    const StTensor* u = fb.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->shape, t.shape) << t.name;
    EXPECT_TRUE(u->bytes == t.bytes) << t.name << " differs after export -> init_from -> export";
  }
  // And the run's checkpoint and its gpt2 export evaluate identically.
  EXPECT_EQ(mixtrain_eval(run_dir.string())["eval_loss"],
            mixtrain_eval(a.string() + " --layout gpt2")["eval_loss"]);
}

TEST_F(Gpt2Torch, AGptOfOtherSizesOrANativeFileExits2NamingTheTensor) {
  // Three layers in the file, two in the model.
  const auto deeper = dir_ / "deeper.safetensors";
  python(
      "init --n-layer 3 --n-head 2 --n-embd 32 --block-size 16 --vocab-size 64 --seed 1 "
      "--layout gpt2 --out " +
      deeper.string());
  auto r = run("eval " + config_.string() + " --checkpoint " + deeper.string() + " --layout gpt2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "'h.2.")) << r.err;
  EXPECT_TRUE(contains(r.err, "matches no parameter")) << r.err;

  // PyTorch's native layout ([out, in]) read as GPT-2: c_attn does not fit, its transpose would.
  const auto native = dir_ / "native.safetensors";
  python(
      "init --n-layer 2 --n-head 2 --n-embd 32 --block-size 16 --vocab-size 64 --seed 1 "
      "--layout native --out " +
      native.string());
  r = run("train " + config_.string() + " --set checkpoint.init_from=" + native.string() +
          " --run-dir " + (dir_ / "x").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "'h.0.attn.c_attn.weight'")) << r.err;
  EXPECT_TRUE(contains(r.err, "checkpoint.init_layout = \"native\"")) << r.err;
  // ... and read natively it loads.
  EXPECT_TRUE(mixtrain_eval(native.string()).is_object());
}

}  // namespace
}  // namespace mixtrain::test
