// [model.lora] through the `mixtrain` executable, on a 2-layer GPT:
// - a run trains the adapters alone: the base weights leave it as they entered, B moves, and the
//   checkpoint holds optimizer state for the adapters only; `check` counts them as the trainable
//   share; the run's config.toml resumes bit for bit (losses and final tensors of a run
//   interrupted and resumed are the uninterrupted run's);
// - a run from_pretrained starts at the folder's held-out loss (B = 0: the base model's outputs);
// - bad settings exit 2 at their file:line:col: a target glob matching no linear node (listing
//   the linear nodes), r <= 0, alpha <= 0, dropout outside [0, 1); a resume with other LoRA
//   settings is refused naming both.
#include <string>
#include <vector>

#include "gpt_torch_support.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

const char* kGpt = R"(
[run]
name = "gpt"
seed = 4
steps = 4
log_every = 1
eval_every = 0
[backend]
type = "cpu"
[precision]
policy = "fp32"
[scaler]
type = "none"
[optimizer]
type = "adamw"
[optimizer.adamw]
lr = 0.01
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
every = 2
keep = 5
)";

const char* kLora = R"(
[model.lora]
r = 4
alpha = 8
targets = ["h.*.attn.c_attn", "h.*.mlp.c_fc"]
)";

class Lora : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    config_ = write_file("lora.toml", std::string(kGpt) + kLora).string();
    write_token_walk(dir_ / "train.bin", 2000, 5);
    write_token_walk(dir_ / "eval.bin", 16 * 6 + 1, 6);
  }

  // A checkpoint's tensors, as safetensors, by name.
  StFile tensors(const std::string& checkpoint, const std::string& out) {
    const auto r = run("export " + checkpoint + " --format safetensors --out " + out, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_st(dir_ / out);
  }

  std::string config_;
};

std::vector<double> losses(const std::vector<json>& records) {
  std::vector<double> out;
  for (const auto& r : records)
    if (r.contains("loss")) out.push_back(r["loss"].get<double>());
  return out;
}

TEST_F(Lora, TheAdaptersTrainAloneAndAResumeContinuesBitForBit) {
  auto r = run("export " + config_ + " --initial --out initial.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("train " + config_ + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StFile initial = read_st(dir_ / "initial.safetensors");
  StFile trained = tensors("run/checkpoints/step-00000004.mxt", "trained.safetensors");
  std::size_t adapters = 0;
  for (const auto& t : initial.tensors) {
    const StTensor* after = trained.find(t.name);
    ASSERT_NE(after, nullptr) << t.name;
    const bool adapter = has(t.name, ".lora_A.") || has(t.name, ".lora_B.");
    if (!adapter) {
      EXPECT_EQ(after->bytes, t.bytes) << t.name << " is frozen, yet it changed";
      continue;
    }
    ++adapters;
    EXPECT_NE(after->bytes, t.bytes) << t.name << " trains, yet it did not change";
    if (has(t.name, ".lora_B.")) {
      EXPECT_EQ(t.bytes, std::string(t.bytes.size(), '\0')) << t.name << " starts at 0";
    }
  }
  EXPECT_EQ(adapters, 8u);  // A and B beside 2 targets in each of 2 layers
  EXPECT_EQ(initial.find("h.0.attn.c_attn.lora_A.weight")->shape,
            (std::vector<std::int64_t>{4, 32}));
  EXPECT_EQ(initial.find("h.0.attn.c_attn.lora_B.weight")->shape,
            (std::vector<std::int64_t>{96, 4}));
  // check: the adapters are the trainable share, 2 · (4·32 + 96·4 + 4·32 + 128·4) parameters.
  r = run("check " + config_, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "# trainable: 2.30K parameters in 8 tensors")) << r.out;

  // Resumed from step 2 with the run's own config.toml: the same losses and tensors.
  const auto full = losses(records(dir_ / "run" / "metrics.jsonl"));
  ASSERT_EQ(full.size(), 4u);
  fs::create_directories(dir_ / "half" / "checkpoints");
  fs::copy(dir_ / "run" / "config.toml", dir_ / "half" / "config.toml");
  fs::copy(dir_ / "run" / "checkpoints" / "step-00000002.mxt",
           dir_ / "half" / "checkpoints" / "step-00000002.mxt");
  r = run("train --resume half", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto resumed = losses(records(dir_ / "half" / "metrics.jsonl"));
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed[0], full[2]);
  EXPECT_EQ(resumed[1], full[3]);
  StFile again = tensors("half/checkpoints/step-00000004.mxt", "again.safetensors");
  ASSERT_EQ(again.tensors.size(), trained.tensors.size());
  for (std::size_t i = 0; i < again.tensors.size(); ++i) {
    EXPECT_EQ(again.tensors[i].name, trained.tensors[i].name);
    EXPECT_EQ(again.tensors[i].bytes, trained.tensors[i].bytes) << again.tensors[i].name;
  }

  // Other LoRA settings: refused, naming both.
  r = run("train --resume run --set run.steps=6 --set model.lora.r=2", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "trained with LoRA r = 4, alpha = 8, dropout = 0, targets = "
                  "[\"h.*.attn.c_attn\", \"h.*.mlp.c_fc\"], this one has LoRA r = 2,"))
      << r.err;
  EXPECT_TRUE(has(r.err, "--merge-lora")) << r.err;
  // Starting a new run from the checkpoint instead: its trained adapters fit neither another rank
  // nor a model without adapters, and the run must not start from the base weights without them.
  const std::string trained_file = " --set checkpoint.init_from=run/checkpoints/step-00000004.mxt";
  r = run("train " + config_ + " --set model.lora.r=2" + trained_file + " --run-dir r2", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "another rank than [model.lora] r")) << r.err;
  r = run("train " + write_file("plain.toml", kGpt).string() + trained_file + " --run-dir plain",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "a trained LoRA adapter that this model has no place for")) << r.err;
  // The same adapters in a weights-only file (plain names, no "param/"): refused alike, not
  // warned about and dropped.
  r = run("export run/checkpoints/step-00000004.mxt --format safetensors --out adapted.safetensors",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("train " + write_file("plain.toml", kGpt).string() +
              " --set checkpoint.init_from=adapted.safetensors --run-dir plain-st",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "a trained LoRA adapter that this model has no place for")) << r.err;
  // The hints' way: fold the adapters in, then start from that file under the new rank.
  r =
      run("export run/checkpoints/step-00000004.mxt --merge-lora --format safetensors --out "
          "merged.safetensors",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("train " + config_ +
              " --set model.lora.r=2 --set checkpoint.init_from=merged.safetensors --set "
              "run.steps=1 --run-dir r2-merged",
          dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Lora, ARunFromAPretrainedFolderStartsAtTheBaseModelsLoss) {
  auto r = run("export " + write_file("base.toml", kGpt).string() +
                   " --initial --layout hf --out hf --set run.seed=9",
               dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // kGpt, its model from the folder.
  std::string pretrained = kGpt;
  const std::string model = "preset = \"gpt\"\n[model.gpt]\nn_layer = 2\nn_head = 2\nn_embd = 32\n";
  ASSERT_NE(pretrained.find(model), std::string::npos);
  pretrained.replace(pretrained.find(model), model.size(), "from_pretrained = \"hf\"\n");
  const auto base = write_file("pretrained.toml", pretrained);
  const auto adapted = write_file("pretrained-lora.toml", pretrained + kLora);
  for (const auto& [config, dir] : {std::pair{base, "plain"}, std::pair{adapted, "fine"}}) {
    r = run("train " + config.string() + " --run-dir " + dir + " --set run.steps=1", dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(has(r.err, "initial weights loaded from")) << r.err;
  }
  // Step 1's loss is measured before its update: with B = 0 the adapted model is the base model.
  const auto plain = losses(records(dir_ / "plain" / "metrics.jsonl"));
  const auto fine = losses(records(dir_ / "fine" / "metrics.jsonl"));
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(fine.size(), 1u);
  EXPECT_NEAR(fine[0], plain[0], 1e-6 * plain[0]);
  // A checkpoint run under a gpt config of other sizes: the hint names the preset's table (not
  // [model] layers, which a preset config has none of).
  r = run("eval " + write_file("sized.toml", kGpt).string() +
              " --set model.gpt.n_embd=64 --checkpoint plain",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "check the sizes in [model.gpt]")) << r.err;
  // Another rank on resume: the way to a new run is a Hugging Face folder, since init_from may
  // not join from_pretrained; the hint's commands run as written.
  r = run("train --resume fine --set model.lora.r=2", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const std::string route =
      "--merge-lora --layout hf --out start-hf), then [model] from_pretrained";
  EXPECT_TRUE(has(r.err, route)) << r.err;
  r = run("export fine/checkpoints/step-00000001.mxt --merge-lora --layout hf --out start-hf",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string restarted = pretrained + kLora;
  restarted.replace(restarted.find("from_pretrained = \"hf\""), 22,
                    "from_pretrained = \"start-hf\"");
  r = run("train " + write_file("restarted.toml", restarted).string() +
              " --set model.lora.r=2 --set run.steps=1 --run-dir restarted",
          dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Lora, CheckMeasuresTheAdaptersShareOfAFullFineTune) {
  // A block of GPT-2 small (768 wide, 12 heads) with rank-8 adapters on its four projections:
  // 8 · (768 + 2304 + 768 + 768 + 768 + 3072 + 3072 + 768) = 98,304 adapter parameters.
  std::string text = std::string(kGpt) +
                     "[model.lora]\nr = 8\nalpha = 16\n"
                     "targets = [\"h.*.attn.c_attn\", \"h.*.attn.c_proj\", \"h.*.mlp.c_fc\", "
                     "\"h.*.mlp.c_proj\"]\n";
  const std::string sizes = "n_layer = 2\nn_head = 2\nn_embd = 32\n";
  text.replace(text.find(sizes), sizes.size(), "n_layer = 1\nn_head = 12\nn_embd = 768\n");
  const auto r = run("check " + write_file("small.toml", text).string(), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto at = r.out.find("# LoRA: 98304 trainable parameters of ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const auto pct = r.out.find("MiB, ", at);
  ASSERT_NE(pct, std::string::npos) << r.out;
  const double share = std::stod(r.out.substr(pct + 5));
  EXPECT_GT(share, 0.5);
  EXPECT_LT(share, 5.0) << r.out.substr(at, 200);
}

TEST_F(Lora, BadSettingsExitTwoAtTheirLine) {
  struct Case {
    std::string lora, key_line, message;
  };
  const std::vector<Case> cases = {
      {"r = 4\ntargets = [\"h.*.attn.c_attn\", \"h.*.attn.q_proj\"]\n", "targets",
       "target 'h.*.attn.q_proj' matches no linear node of the model"},
      {"r = 0\ntargets = [\"h.*.attn.c_attn\"]\n", "r = 0", "model.lora.r"},
      {"r = -2\ntargets = [\"h.*.attn.c_attn\"]\n", "r = -2", "model.lora.r"},
      {"alpha = 0\ntargets = [\"h.*.attn.c_attn\"]\n", "alpha = 0", "model.lora.alpha"},
      {"dropout = 1.0\ntargets = [\"h.*.attn.c_attn\"]\n", "dropout = 1.0", "model.lora.dropout"},
      {"dropout = -0.1\ntargets = [\"h.*.attn.c_attn\"]\n", "dropout = -0.1", "model.lora.dropout"},
      {"r = 4\n", "[model.lora]", "LoRA needs the linear nodes to adapt"},
  };
  for (const auto& c : cases) {
    const std::string text = std::string(kGpt) + "[model.lora]\n" + c.lora;
    const auto config = write_file("bad.toml", text);
    const auto r = run("train " + config.string() + " --run-dir bad", dir_);
    EXPECT_EQ(r.exit_code, 2) << c.lora << r.err;
    std::size_t line = 1, start = 0;
    while (text.compare(start, c.key_line.size(), c.key_line) != 0) {
      start = text.find('\n', start) + 1;
      ++line;
    }
    EXPECT_TRUE(has(r.err, config.string() + ":" + std::to_string(line) + ":")) << c.lora << r.err;
    EXPECT_TRUE(has(r.err, c.message)) << c.lora << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "bad")) << c.lora;
  }
  // The unmatched glob's message lists the nodes it could have matched.
  const auto r =
      run("check " + write_file("nomatch.toml",
                                std::string(kGpt) + "[model.lora]\ntargets = [\"attn.q\"]\n")
                         .string(),
          dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err,
                  "h.0.attn.c_attn, h.0.attn.c_proj, h.0.mlp.c_fc, h.0.mlp.c_proj, "
                  "h.1.attn.c_attn"))
      << r.err;
}

}  // namespace
}  // namespace mixtrain::test
