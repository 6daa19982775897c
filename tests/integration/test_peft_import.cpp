// PEFT adapters in (`[model.lora] from_peft`), on a 2-layer GPT started from a Hugging Face folder:
// - An adapter folder mixtrain exported starts a new run's adapters bit for bit, r, alpha and
//   targets taken from its adapter_config.json; a bf16 adapter widens exactly. The run's resolved
//   config.toml states them, so it is read without the folder (a resume, eval), while a new run
//   from it names the missing folder.
// - What an adapter folder cannot give is refused at the key, saying what to do: an r the table
//   states otherwise, targets selecting other nodes, target_modules on a non-linear module,
//   biases, modules_to_save, weights that lack a target's tensors or hold tensors no adapter
//   takes, weights only in a pickle; an adapter folder given as a checkpoint names from_peft.
// - Where the peers venv imports peft (python_peers.h; 0.4.0): an adapter PEFT made (noise on
//   lora_B, target_modules by PEFT's suffix rule and by a regular expression) trains 5 fp32 AdamW
//   steps in mixtrain with per-step losses within 1e-5 relative of PEFT's own from the same folder,
//   and trained adapters within 1e-5.
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gpt_torch_support.h"
#include "hf_interop_support.h"
#include "python_peers.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

// A run from "hf"; [model.lora] is appended.
const char* kRun = R"(
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

class PeftImport : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    write_token_walk(dir_ / "train.bin", 2000, 5);
    write_token_walk(dir_ / "eval.bin", 16 * 6 + 1, 6);
  }

  void expect_ok(const CliResult& r) { ASSERT_EQ(r.exit_code, 0) << r.out << r.err; }

  // A config of kRun with `lora` as its [model.lora].
  std::string config(const std::string& name, const std::string& lora) {
    return write_file(name, std::string(kRun) + "[model.lora]\n" + lora).string();
  }

  // "hf" from mixtrain's own base, and "adapter": a LoRA run's trained adapters (all four
  // projections of both blocks, r = 4, alpha = 8), exported for PEFT; "trained.safetensors" holds
  // them under mixtrain's names.
  void make_adapter() {
    expect_ok(run("export " + write_file("base.toml", kTinyGptBase).string() +
                      " --initial --layout hf --out hf",
                  dir_));
    const auto lora = config("lora.toml",
                             "r = 4\nalpha = 8\ntargets = [\"h.*.attn.c_attn\", "
                             "\"h.*.attn.c_proj\", \"h.*.mlp.c_fc\", \"h.*.mlp.c_proj\"]\n");
    expect_ok(run("train " + lora + " --run-dir run", dir_));
    expect_ok(run("export run --layout peft --out adapter", dir_));
    expect_ok(run("export run --format safetensors --out trained.safetensors", dir_));
  }

  void edit_adapter_config(const std::function<void(json&)>& edit, const fs::path& folder) {
    auto c = json::parse(slurp(folder / "adapter_config.json"));
    edit(c);
    std::ofstream(folder / "adapter_config.json") << c.dump(2);
  }

  // A copy of "adapter" as `name`, its config edited.
  fs::path edited_adapter(const std::string& name, const std::function<void(json&)>& edit) {
    const fs::path copy = dir_ / name;
    fs::copy(dir_ / "adapter", copy, fs::copy_options::recursive);
    edit_adapter_config(edit, copy);
    return copy;
  }
};

TEST_F(PeftImport, AnExportedAdapterStartsANewRunBitForBit) {
  make_adapter();
  const auto from = config("from.toml", "from_peft = \"adapter\"\n");
  const auto checked = run("check " + from, dir_);
  expect_ok(checked);
  EXPECT_TRUE(has(checked.out, "r = 4\n")) << checked.out;
  EXPECT_TRUE(has(checked.out, "alpha = 8.0\n")) << checked.out;
  EXPECT_TRUE(has(checked.out, "\"h.1.mlp.c_proj\"]")) << checked.out;
  EXPECT_TRUE(has(checked.out, "(its lora_alpha)")) << checked.out;
  expect_ok(
      run("export " + from + " --initial --format safetensors --out start.safetensors", dir_));
  StFile start = read_st(dir_ / "start.safetensors");
  StFile trained = read_st(dir_ / "trained.safetensors");
  std::size_t adapters = 0;
  for (const auto& t : trained.tensors) {
    if (!has(t.name, ".lora_")) continue;
    ++adapters;
    const StTensor* s = start.find(t.name);
    ASSERT_NE(s, nullptr) << t.name;
    EXPECT_EQ(s->bytes, t.bytes) << t.name;
  }
  EXPECT_EQ(adapters, 16u);

  // bf16 adapters (a model saved in half precision) widen exactly.
  StFile narrow = read_st(dir_ / "adapter" / "adapter_model.safetensors");
  for (auto& t : narrow.tensors) {
    std::string bits;
    for (std::size_t i = 0; i < t.bytes.size(); i += 4) bits += t.bytes.substr(i + 2, 2);
    t.bytes = bits;
    t.dtype = "BF16";
  }
  fs::copy(dir_ / "adapter", dir_ / "bf16", fs::copy_options::recursive);
  write_st(dir_ / "bf16" / "adapter_model.safetensors", narrow);
  const auto from_bf16 = config("bf16.toml", "from_peft = \"bf16\"\n");
  expect_ok(
      run("export " + from_bf16 + " --initial --format safetensors --out bf16.safetensors", dir_));
  StFile widened = read_st(dir_ / "bf16.safetensors");
  const StTensor* a = widened.find("h.0.attn.c_attn.lora_A.weight");
  const StTensor* full = trained.find("h.0.attn.c_attn.lora_A.weight");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(full, nullptr);
  const auto got = st_floats(*a), fp32 = st_floats(*full);
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint32_t u;
    std::memcpy(&u, &fp32[i], 4);
    u &= 0xFFFF0000u;  // the bf16 kept the top half
    float want;
    std::memcpy(&want, &u, 4);
    ASSERT_EQ(got[i], want) << i;
  }

  // A frozen adapter keeps its values under a quantized base (QLoRA quantizes the base alone).
  const auto nf4 = write_file("nf4.toml", std::string(kRun) +
                                              "[train]\nfrozen_format = \"nf4\"\n"
                                              "frozen = [\"h.0.*\"]\n[model.lora]\n"
                                              "from_peft = \"adapter\"\n");
  expect_ok(run("export " + nf4.string() + " --initial --format safetensors --out nf4.safetensors",
                dir_));
  StFile quantized = read_st(dir_ / "nf4.safetensors");
  for (const char* name : {"h.0.attn.c_attn.lora_A.weight", "h.0.mlp.c_fc.lora_B.weight"}) {
    ASSERT_NE(quantized.find(name), nullptr) << name;
    EXPECT_EQ(quantized.find(name)->bytes, trained.find(name)->bytes) << name;
  }

  // The run's config.toml states r, alpha and targets: a resume and an evaluation read it
  // without the folder, whatever it holds now; a new run from it (and check, which forecasts
  // one) checks the folder and loads it.
  const auto one = write_file("one.toml", std::string(kRun) + "[model.lora]\nfrom_peft = \"" +
                                              (dir_ / "adapter").string() + "\"\n");
  expect_ok(run("train " + one.string() + " --set run.steps=1 --run-dir run2", dir_));
  edit_adapter_config([](json& c) { c["r"] = 8; }, dir_ / "adapter");
  expect_ok(run("train run2/config.toml --set run.steps=2 --resume run2", dir_));
  expect_ok(run("eval run2/config.toml --checkpoint run2", dir_));
  for (const std::string command :
       {"train run2/config.toml --run-dir run3", "check run2/config.toml --skip-rehearsal"}) {
    const auto again = run(command, dir_);
    EXPECT_EQ(again.exit_code, 2) << command << again.err;
    EXPECT_TRUE(has(again.err, "config.toml:")) << command << again.err;
    EXPECT_TRUE(has(again.err, "r = 4 disagrees with")) << command << again.err;
  }
  fs::remove_all(dir_ / "adapter");
  expect_ok(run("eval run2/config.toml --checkpoint run2", dir_));
  const auto gone = run("train run2/config.toml --run-dir run3", dir_);
  EXPECT_EQ(gone.exit_code, 2) << gone.err;
  EXPECT_TRUE(has(gone.err, (dir_ / "adapter").string() + " does not exist")) << gone.err;
  EXPECT_TRUE(has(gone.err, "'model.lora.from_peft'")) << gone.err;
  EXPECT_TRUE(has(gone.err, "from its own config.toml")) << gone.err;
  EXPECT_FALSE(fs::exists(dir_ / "run3" / "checkpoints"));
}

TEST_F(PeftImport, WhatAnAdapterCannotGiveIsRefused) {
  make_adapter();
  const auto refused = [&](const std::string& lora, const std::vector<std::string>& says) {
    const auto r = run("check " + config("refused.toml", lora) + " --skip-rehearsal", dir_);
    EXPECT_EQ(r.exit_code, 2) << lora << r.out << r.err;
    for (const auto& part : says) EXPECT_TRUE(has(r.err, part)) << lora << "\n" << r.err;
  };
  refused("from_peft = \"adapter\"\nr = 8\n",
          {"r = 8 disagrees with", "adapter_config.json's r = 4", "remove r"});
  refused("from_peft = \"adapter\"\ntargets = [\"h.*.attn.c_attn\"]\n",
          {"targets select h.0.attn.c_attn, h.1.attn.c_attn, but", "remove targets"});
  edited_adapter("wte", [](json& c) { c["target_modules"] = {"wte"}; });
  refused("from_peft = \"wte\"\n",
          {"adapts 'transformer.wte', a node of type embedding", "linear nodes only"});
  edited_adapter("none", [](json& c) { c["target_modules"] = {"q_proj"}; });
  refused("from_peft = \"none\"\n", {"adapts no module of this model", "h.0.attn.c_attn"});
  edited_adapter("bias", [](json& c) { c["bias"] = "lora_only"; });
  refused("from_peft = \"bias\"\n", {"bias", "trained biases", "merge_and_unload"});
  edited_adapter("saved", [](json& c) { c["modules_to_save"] = {"lm_head"}; });
  refused("from_peft = \"saved\"\n", {"modules_to_save", "merge_and_unload"});
  edited_adapter("lora", [](json& c) { c["peft_type"] = "IA3"; });
  refused("from_peft = \"lora\"\n", {"peft_type", "LoRA adapters"});
  fs::create_directories(dir_ / "pickle");
  fs::copy(dir_ / "adapter" / "adapter_config.json", dir_ / "pickle");
  fs::copy(dir_ / "adapter" / "adapter_model.safetensors", dir_ / "pickle" / "adapter_model.bin");
  refused("from_peft = \"pickle\"\n", {"adapter_model.bin, a Python pickle", "safe_serialization"});

  // The weights must be the config's adapters, no fewer and no more: found when a run starts.
  const auto starts = [&](const std::string& folder, const std::vector<std::string>& says) {
    const auto r = run(
        "train " + config("starts.toml", "from_peft = \"" + folder + "\"\n") + " --run-dir never",
        dir_);
    EXPECT_EQ(r.exit_code, 2) << folder << r.err;
    for (const auto& part : says) EXPECT_TRUE(has(r.err, part)) << folder << "\n" << r.err;
  };
  edited_adapter("more", [](json& c) { c["target_modules"].push_back("lm_head"); });
  starts("more", {"no tensor 'base_model.model.lm_head.lora_A.weight'", "different adapters"});
  edited_adapter("fewer", [](json& c) { c["target_modules"] = {"c_attn"}; });
  starts("fewer", {"base_model.model.transformer.h.0.attn.c_proj.lora_A.weight",
                   "match no adapter of this model", "dropped"});
  EXPECT_FALSE(fs::exists(dir_ / "never" / "checkpoints"));

  // A start whose checkpoint.init_from holds trained adapters would drop them for from_peft's.
  const auto both = run("check " +
                            write_file("both.toml", std::string(kTinyGptBase) +
                                                        "[checkpoint]\ninit_from = "
                                                        "\"trained.safetensors\"\n"
                                                        "[model.lora]\nfrom_peft = \"adapter\"\n")
                                .string() +
                            " --skip-rehearsal",
                        dir_);
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_TRUE(has(both.err, "holds trained LoRA adapters, and from_peft names others")) << both.err;

  // An adapter folder where a checkpoint belongs says how to use it.
  const auto r = run(
      "eval " + config("eval.toml", "from_peft = \"adapter\"\n") + " --checkpoint adapter", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "is a PEFT adapter folder")) << r.err;
  EXPECT_TRUE(has(r.err, "from_peft = \"adapter\"")) << r.err;

  // Adapters on a base the config does not load: allowed, and said.
  const auto seeded =
      run("check " +
              write_file("seeded.toml", std::string(kTinyGptBase) + "[model.lora]\nfrom_peft = \"" +
                                            (dir_ / "adapter").string() + "\"\n")
                  .string() +
              " --skip-rehearsal",
          dir_);
  expect_ok(seeded);
  EXPECT_TRUE(has(seeded.err, "the base model starts from its seeded initialisation"))
      << seeded.err;
}

TEST_F(PeftImport, APeftMadeAdapterTrainsAsInPeft) {
  if (!peers_import("transformers, torch, peft"))
    GTEST_SKIP() << peers_missing_message("peft (0.4.0)", "no PEFT to compare with");
  const std::string py = peers_python(), hf = (dir_ / "hf").string();
  ASSERT_TRUE(run_hf_interop(dir_, py,
                             "make-gpt2 --out " + hf +
                                 " --n-layer 2 --n-head 2 --n-embd 32 --n-positions 16 "
                                 "--vocab-size 64 --seed 3")
                  .is_object());
  // PEFT's suffix rule: c_proj adapts both the attention's and the MLP's projection.
  const json made =
      run_hf_interop(dir_, py,
                     "make-peft-adapter --folder " + hf + " --out " + (dir_ / "adapter").string() +
                         " --r 4 --alpha 16 --targets c_attn,c_proj --seed 5");
  ASSERT_TRUE(made.is_object());
  ASSERT_EQ(made["adapted"].size(), 6u);
  const auto from = config("from.toml", "from_peft = \"adapter\"\n");
  expect_ok(run("train " + from + " --run-dir run", dir_));
  expect_ok(run("export run --layout peft --out trained", dir_));
  const json theirs = run_hf_interop(
      dir_, py,
      "peft-train --folder " + hf + " --adapter " + (dir_ / "adapter").string() + " --tokens " +
          (dir_ / "train.bin").string() +
          " --block-size 16 --batch 4 --steps 5 --lr 0.01 --weight-decay 0.01 --save " +
          (dir_ / "theirs.safetensors").string());
  ASSERT_TRUE(theirs.is_object());
  EXPECT_EQ(theirs["adapter_loaded"], true) << theirs.dump();
  const auto ours = step_losses(dir_ / "run");
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
  ASSERT_EQ(trained.tensors.size(), 12u);
  ASSERT_EQ(peft_trained.tensors.size(), 12u);
  double worst_adapter = 0;
  for (const auto& t : peft_trained.tensors) {
    const StTensor* mine = trained.find(t.name);
    ASSERT_NE(mine, nullptr) << t.name;
    worst_adapter = std::max(worst_adapter, scaled_gap(st_floats(*mine), st_floats(t)));
  }
  EXPECT_LT(worst_adapter, 1e-5);

  // A regular expression, matched whole, as PEFT reads a string target_modules.
  ASSERT_TRUE(run_hf_interop(dir_, py,
                             "make-peft-adapter --folder " + hf + " --out " +
                                 (dir_ / "regex").string() +
                                 " --r 2 --alpha 4 --regex --targets '.*\\.mlp\\.c_fc' --seed 6")
                  .is_object());
  const auto checked = run("check " + config("regex.toml", "from_peft = \"regex\"\n"), dir_);
  expect_ok(checked);
  EXPECT_TRUE(has(checked.out, "targets = [\"h.0.mlp.c_fc\", \"h.1.mlp.c_fc\"]")) << checked.out;
  std::cout << "PEFT-made adapter: losses within " << worst_loss << " relative, adapters "
            << worst_adapter << std::endl;
}

}  // namespace
}  // namespace mixtrain::test
