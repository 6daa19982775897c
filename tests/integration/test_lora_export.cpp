// LoRA adapters handed back (`mixtrain export`), on a 2-layer GPT with adapters on every attention
// and MLP projection:
// - --layout peft writes adapter_config.json and adapter_model.safetensors under PEFT 0.4's
//   names; --merge-lora (--layout hf) writes the plain model with W + (alpha/r)·B·A in each
//   adapted weight; --layout hf without --merge-lora, and --merge-lora of a model without
//   adapters, exit 2 saying what to do.
// - Where the peers venv imports peft (python_peers.h; 0.4.0, which cmake/setup-debian.sh
//   installs), PEFT parity: from one random GPT-2 folder (save_pretrained) and mixtrain's initial
//   adapters, 5 fp32 AdamW steps give per-step losses within 1e-5 relative of PEFT +
//   transformers and adapters within 1e-5; PeftModel.from_pretrained on the trained export gives
//   mixtrain's logits within 1e-5; merge_and_unload() matches --merge-lora within 1e-6.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpt_torch_support.h"
#include "hf_interop_support.h"
#include "python_peers.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

// A 2-layer GPT from the folder "hf", adapters beside its four projections.
const char* kLora = R"(
[run]
name = "peft"
seed = 4
steps = 5
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
weight_decay = 0.01
[model]
from_pretrained = "hf"
[model.lora]
r = 4
alpha = 8
targets = ["h.*.attn.c_attn", "h.*.attn.c_proj", "h.*.mlp.c_fc", "h.*.mlp.c_proj"]
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
)";

class LoraExport : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    config_ = write_file("lora.toml", kLora).string();
    write_token_walk(dir_ / "train.bin", 2000, 5);
    write_token_walk(dir_ / "eval.bin", 16 * 6 + 1, 6);
  }

  void expect_ok(const CliResult& r) { ASSERT_EQ(r.exit_code, 0) << r.out << r.err; }

  std::string config_;
};

TEST_F(LoraExport, PeftFolderNamesAndMergedWeights) {
  expect_ok(run("export " + write_file("base.toml", kTinyGptBase).string() +
                    " --initial --layout hf --out hf",
                dir_));
  expect_ok(run("train " + config_ + " --run-dir run", dir_));
  expect_ok(run("export run --layout peft --out adapter", dir_));
  expect_ok(run("export run --merge-lora --layout hf --out merged", dir_));
  expect_ok(run("export run --format safetensors --out native.safetensors", dir_));

  const json config = json::parse(slurp(dir_ / "adapter" / "adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8);
  EXPECT_EQ(config["lora_dropout"], 0.0);
  EXPECT_EQ(config["fan_in_fan_out"], true);  // GPT-2's Conv1D base weights are [in, out]
  EXPECT_EQ(config["bias"], "none");
  EXPECT_EQ(config["base_model_name_or_path"], (dir_ / "hf").string());
  ASSERT_EQ(config["target_modules"].size(), 8u);
  EXPECT_EQ(config["target_modules"][0], "transformer.h.0.attn.c_attn");

  StFile adapter = read_st(dir_ / "adapter" / "adapter_model.safetensors");
  StFile native = read_st(dir_ / "native.safetensors");
  ASSERT_EQ(adapter.tensors.size(), 16u);
  // PEFT's nn.Linear adapters, [r, in] and [out, r] also beside a Conv1D: mixtrain's, untransposed.
  const StTensor* a = adapter.find("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
  const StTensor* b = adapter.find("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{4, 32}));
  EXPECT_EQ(b->shape, (std::vector<std::int64_t>{96, 4}));
  EXPECT_EQ(a->bytes, native.find("h.0.attn.c_attn.lora_A.weight")->bytes);
  EXPECT_EQ(b->bytes, native.find("h.0.attn.c_attn.lora_B.weight")->bytes);

  // The merged folder: Conv1D [in, out] = (W + 2·B·A)ᵀ; no adapter tensors left.
  StFile merged = read_st(dir_ / "merged" / "model.safetensors");
  for (const auto& t : merged.tensors) EXPECT_FALSE(has(t.name, "lora")) << t.name;
  const auto w = st_floats(*native.find("h.0.attn.c_attn.weight"));
  const auto av = st_floats(*a), bv = st_floats(*b);
  std::vector<float> want(w.size());
  double moved = 0;
  for (int o = 0; o < 96; ++o)
    for (int i = 0; i < 32; ++i) {
      double delta = 0;
      for (int k = 0; k < 4; ++k) delta += 2.0 * double(bv[o * 4 + k]) * av[k * 32 + i];
      want[i * 96 + o] = static_cast<float>(w[o * 32 + i] + delta);
      moved = std::max(moved, std::abs(delta));
    }
  EXPECT_GT(moved, 1e-4);  // the adapters trained: the merge changes something
  const StTensor* c_attn = merged.find("transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);
  EXPECT_EQ(c_attn->shape, (std::vector<std::int64_t>{32, 96}));
  EXPECT_LT(scaled_gap(st_floats(*c_attn), want), 1e-6);

  // What is refused, and what to do instead.
  auto r = run("export run --layout hf --out plain", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "holds LoRA adapters")) << r.err;
  EXPECT_TRUE(has(r.err, "--merge-lora")) << r.err;
  r = run("export run --layout peft --merge-lora --out both", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "drop one")) << r.err;
  r =
      run("export hf/model.safetensors --merge-lora --layout native --format safetensors --out "
          "x.safetensors",
          dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "holds no LoRA adapters")) << r.err;
  r = run("export hf/model.safetensors --layout peft --out y", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "holds no LoRA adapters")) << r.err;
  EXPECT_TRUE(has(r.err, "no adapters to export")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "y" / "adapter_config.json"));
}

// An adapter folder holds adapters alone: a run that trained more ([train] trainable) would load
// in PEFT with the base model's values for the rest. A tied node's adapters (lm_head reads wte)
// cannot be merged into a weight of its own. Both are refused, naming the way that works.
TEST_F(LoraExport, WhatAnAdapterFolderOrAMergeCannotHoldIsRefused) {
  expect_ok(run("export " + write_file("base.toml", kTinyGptBase).string() +
                    " --initial --layout hf --out hf",
                dir_));
  expect_ok(run("train " + config_ + " --set run.steps=2 --set 'train.trainable=[\"ln_f\"]'" +
                    " --run-dir extra",
                dir_));
  auto r = run("export extra --layout peft --out extra-adapter", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "trained parameters besides the adapters (ln_f.weight, ln_f.bias)"))
      << r.err;
  EXPECT_TRUE(has(r.err, "--merge-lora --layout hf")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "extra-adapter" / "adapter_config.json"));
  expect_ok(run("export extra --merge-lora --layout hf --out extra-merged", dir_));
  // The same run's weights as an exported file (no "resume" entry: its carried config says what
  // trained), and a run checkpointing in safetensors (parameters under plain names).
  expect_ok(run("export extra --format safetensors --out extra.safetensors", dir_));
  expect_ok(run("train " + config_ + " --set run.steps=2 --set 'train.trainable=[\"ln_f\"]'" +
                    " --set checkpoint.format=safetensors --run-dir extra-st",
                dir_));
  for (const std::string source : {"extra.safetensors", "extra-st"}) {
    r = run("export " + source + " --layout peft --out " + source + "-adapter", dir_);
    EXPECT_EQ(r.exit_code, 2) << source << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "trained parameters besides the adapters (ln_f.")) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / (source + "-adapter") / "adapter_config.json"));
  }

  expect_ok(run("train " + config_ +
                    " --set run.steps=2 --set 'model.lora.targets=[\"h.*.attn.c_attn\", "
                    "\"lm_head\"]' --run-dir tied",
                dir_));
  r = run("export tied --merge-lora --layout hf --out tied-merged", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "'lm_head' has adapters but no weight of its own")) << r.err;
  EXPECT_TRUE(has(r.err, "--layout peft")) << r.err;
  expect_ok(run("export tied --layout peft --out tied-adapter", dir_));
  // Adapters alone trained: the exported file passes as the checkpoint does.
  expect_ok(run("export tied --format safetensors --out tied.safetensors", dir_));
  expect_ok(run("export tied.safetensors --layout peft --out tied-file-adapter", dir_));
  // A PEFT adapter is no checkpoint: the folder, its file and the file in the gpt2 layout are
  // each refused with the two ways to use it ([model.lora] from_peft, or merged in PEFT).
  for (const std::string checkpoint : {"tied-adapter", "tied-adapter/adapter_model.safetensors",
                                       "tied-adapter/adapter_model.safetensors --layout gpt2"}) {
    r = run("eval " + config_ + " --checkpoint " + checkpoint, dir_);
    EXPECT_EQ(r.exit_code, 2) << checkpoint << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "merge_and_unload()")) << checkpoint << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "[model.lora] from_peft = \"")) << checkpoint << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "tied-adapter\"")) << checkpoint << "\n" << r.err;
  }
  EXPECT_TRUE(has(r.err, "the file is a PEFT adapter")) << r.err;

  // A run without adapters has none to export: said so, not "trained besides the adapters".
  expect_ok(run("train " + write_file("plain.toml", kTinyGptBase).string() +
                    " --set run.steps=1 --run-dir plain",
                dir_));
  r = run("export plain --layout peft --out plain-adapter", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "holds no LoRA adapters")) << r.err;
}

TEST_F(LoraExport, PeftTrainsLoadsAndMergesAsMixtrain) {
  if (!peers_import("transformers, torch, peft"))
    GTEST_SKIP() << peers_missing_message("peft (0.4.0)", "no PEFT to compare with");
  const std::string py = peers_python(), hf = (dir_ / "hf").string();
  const json made = run_hf_interop(dir_, py,
                                   "make-gpt2 --out " + hf +
                                       " --n-layer 2 --n-head 2 --n-embd 32 --n-positions 16 "
                                       "--vocab-size 64 --seed 3");
  ASSERT_TRUE(made.is_object());
  // Both start from mixtrain's initial adapters (A random, B = 0), handed over as PEFT loads them.
  expect_ok(run("export " + config_ + " --initial --layout peft --out initial", dir_));
  expect_ok(run("train " + config_ + " --run-dir run", dir_));
  expect_ok(run("export run --layout peft --out trained", dir_));
  expect_ok(run("export run --merge-lora --layout hf --out merged", dir_));
  expect_ok(run("predict " + config_ +
                    " --checkpoint run --input eval.bin --positions all --out "
                    "ours.npy",
                dir_));

  const json theirs = run_hf_interop(
      dir_, py,
      "peft-train --folder " + hf + " --adapter " + (dir_ / "initial").string() + " --tokens " +
          (dir_ / "train.bin").string() +
          " --block-size 16 --batch 4 --steps 5 --lr 0.01 --weight-decay 0.01 --save " +
          (dir_ / "theirs.safetensors").string());
  ASSERT_TRUE(theirs.is_object());
  EXPECT_EQ(theirs["adapter_loaded"], true) << theirs.dump();
  EXPECT_EQ(theirs["trainable"].size(), 16u);  // the adapters alone train in PEFT too
  std::vector<double> ours;
  for (const auto& rec : records(dir_ / "run" / "metrics.jsonl"))
    if (rec.contains("loss")) ours.push_back(rec["loss"].get<double>());
  ASSERT_EQ(ours.size(), 5u);
  ASSERT_EQ(theirs["losses"].size(), 5u);
  double worst_loss = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    const double t = theirs["losses"][i].get<double>();
    worst_loss = std::max(worst_loss, std::abs(ours[i] - t) / t);
    EXPECT_NEAR(ours[i], t, 1e-5 * t) << "step " << i + 1;
  }
  StFile trained = read_st(dir_ / "trained" / "adapter_model.safetensors");
  StFile peft_trained = read_st(dir_ / "theirs.safetensors");
  ASSERT_EQ(trained.tensors.size(), peft_trained.tensors.size());
  double worst_adapter = 0;
  for (const auto& t : peft_trained.tensors) {
    const StTensor* mine = trained.find(t.name);
    ASSERT_NE(mine, nullptr) << t.name;
    worst_adapter = std::max(worst_adapter, scaled_gap(st_floats(*mine), st_floats(t)));
  }
  EXPECT_LT(worst_adapter, 1e-5);

  const json loaded =
      run_hf_interop(dir_, py,
                     "peft-logits --folder " + hf + " --adapter " + (dir_ / "trained").string() +
                         " --tokens " + (dir_ / "eval.bin").string() +
                         " --block-size 16 --logits-out " + (dir_ / "theirs.npy").string() +
                         " --merged-out " + (dir_ / "theirs-merged.safetensors").string());
  ASSERT_TRUE(loaded.is_object());
  EXPECT_EQ(loaded["adapter_loaded"], true) << loaded.dump();
  const double logits =
      relative_gap(read_npy_floats(dir_ / "ours.npy"), read_npy_floats(dir_ / "theirs.npy"));
  EXPECT_LT(logits, 1e-5);
  StFile merged = read_st(dir_ / "merged" / "model.safetensors");
  StFile peft_merged = read_st(dir_ / "theirs-merged.safetensors");
  double worst_merged = 0;
  std::size_t compared = 0;
  for (const auto& t : peft_merged.tensors) {
    const StTensor* mine = merged.find(t.name);
    if (mine == nullptr) {
      EXPECT_EQ(t.name, "lm_head.weight");  // tied to wte: the folder stores it once
      continue;
    }
    ++compared;
    worst_merged = std::max(worst_merged, scaled_gap(st_floats(*mine), st_floats(t)));
  }
  EXPECT_EQ(compared, merged.tensors.size());
  EXPECT_LT(worst_merged, 1e-6);
  std::cout << "PEFT parity: losses within " << worst_loss << " relative, adapters "
            << worst_adapter << ", logits " << logits << ", merged weights " << worst_merged
            << std::endl;
}

}  // namespace
}  // namespace mixtrain::test
