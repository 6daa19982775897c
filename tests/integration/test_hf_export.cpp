// Exports the Python ecosystem loads as its own, through the `mixtrain` executable:
// - `export --layout hf`: a Hugging Face model folder of a tiny GPT. Always checked offline
//   against GPT-2's state dict as GPT2LMHeadModel.save_pretrained writes it (names and shapes
//   generated here from GPT-2's architecture) and the config.json keys; where the peers venv
//   imports transformers (python_peers.h), GPT2LMHeadModel.from_pretrained loads it with no
//   missing or unexpected keys, the head tied to wte, and computes `predict --positions all`'s
//   logits to 1e-5 of the largest (tests/integration/hf_interop.py).
// - The default safetensors export of a ResNet-18: names and shapes generated from torchvision's
//   resnet18 rules; where /usr/bin/python3 imports torchvision, resnet18(num_classes).
//   load_state_dict(strict=True) takes the file and, behind the Normalize of the file's
//   "normalization" metadata, computes `predict`'s logits.
// - What is refused with exit 2: --layout hf of an MLP or a ResNet, a non-empty folder without
//   --force, a file where the folder goes, another --format.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpt_torch_support.h"
#include "hf_interop_support.h"
#include "npy_test_support.h"
#include "python_peers.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

using Shape = std::vector<std::int64_t>;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- GPT-2 ---------------------------------------------------------------------------------

// 2 layers, 2 heads, 32 wide, 16 positions, 64 tokens: every shape of GPT-2 (c_attn 3C, c_fc 4C,
// the tied head) in a model that trains in well under a second.
const char* kGpt = R"(
[run]
name = "hf-export"
seed = 4
steps = 2
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
lr = 0.003
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
)";

constexpr std::int64_t kLayers = 2, kHeads = 2, kEmbd = 32, kPositions = 16, kVocab = 64;

// GPT2LMHeadModel's state dict as save_pretrained writes it to model.safetensors: GPT2Model's
// parameters under "transformer.", Conv1D weights [in, out], neither the tied lm_head.weight
// nor the attention-mask buffers.
std::vector<std::pair<std::string, Shape>> gpt2_state_dict(std::int64_t layers, std::int64_t c,
                                                           std::int64_t positions,
                                                           std::int64_t vocab) {
  std::vector<std::pair<std::string, Shape>> out = {{"transformer.wte.weight", {vocab, c}},
                                                    {"transformer.wpe.weight", {positions, c}}};
  auto conv1d = [&](const std::string& name, std::int64_t in, std::int64_t o) {
    out.push_back({name + ".weight", {in, o}});
    out.push_back({name + ".bias", {o}});
  };
  for (std::int64_t i = 0; i < layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    out.push_back({h + "ln_1.weight", {c}});
    out.push_back({h + "ln_1.bias", {c}});
    conv1d(h + "attn.c_attn", c, 3 * c);
    conv1d(h + "attn.c_proj", c, c);
    out.push_back({h + "ln_2.weight", {c}});
    out.push_back({h + "ln_2.bias", {c}});
    conv1d(h + "mlp.c_fc", c, 4 * c);
    conv1d(h + "mlp.c_proj", 4 * c, c);
  }
  out.push_back({"transformer.ln_f.weight", {c}});
  out.push_back({"transformer.ln_f.bias", {c}});
  return out;
}

class HfExport : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    config_ = write_file("gpt.toml", kGpt).string();
    write_token_walk(dir_ / "train.bin", 2000, 5);
    write_token_walk(dir_ / "eval.bin", kPositions * 6 + 1, 6);  // six labelled windows
  }

  // Every tensor of the folder's model.safetensors is GPT-2's, in `dtype`, and config.json says
  // what transformers needs to build the model.
  void expect_gpt2_folder(const fs::path& folder, const std::string& dtype,
                          const std::string& torch_dtype) {
    ASSERT_TRUE(fs::exists(folder / "config.json"));
    ASSERT_TRUE(fs::exists(folder / "model.safetensors"));
    StFile f = read_st(folder / "model.safetensors");
    EXPECT_EQ(f.metadata.value("format", ""), "pt");  // from_pretrained requires it
    const auto expected = gpt2_state_dict(kLayers, kEmbd, kPositions, kVocab);
    EXPECT_EQ(f.tensors.size(), expected.size());
    for (const auto& [name, shape] : expected) {
      const StTensor* t = f.find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->shape, shape) << name;
      EXPECT_EQ(t->dtype, dtype) << name;
    }
    const json c = json::parse(slurp(folder / "config.json"));
    EXPECT_EQ(c["architectures"], json::array({"GPT2LMHeadModel"}));
    EXPECT_EQ(c["model_type"], "gpt2");
    EXPECT_EQ(c["n_layer"], kLayers);
    EXPECT_EQ(c["n_head"], kHeads);
    EXPECT_EQ(c["n_embd"], kEmbd);
    EXPECT_EQ(c["n_inner"], 4 * kEmbd);
    EXPECT_EQ(c["n_positions"], kPositions);
    EXPECT_EQ(c["n_ctx"], kPositions);
    EXPECT_EQ(c["vocab_size"], kVocab);
    EXPECT_EQ(c["layer_norm_epsilon"], 1e-5);
    EXPECT_EQ(c["activation_function"], "gelu_new");  // the gelu op's tanh form
    EXPECT_EQ(c["tie_word_embeddings"], true);
    for (const char* p : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) EXPECT_EQ(c[p], 0.0) << p;
    EXPECT_EQ(c["torch_dtype"], torch_dtype);
    EXPECT_TRUE(c["eos_token_id"].is_null());  // 64 tokens: no <|endoftext|>
  }

  // transformers' view of the folder, its logits of eval.bin's windows compared with predict's
  // (written to `ours`); skipped (with the reason printed) without the peer.
  void expect_transformers_agree(const fs::path& folder, const fs::path& ours) {
    if (!peers_import("transformers, torch")) {
      std::cout << peers_missing_message("transformers, torch",
                                         "from_pretrained not run; the folder was checked "
                                         "against GPT-2's state dict offline")
                << std::endl;
      return;
    }
    const auto theirs = dir_ / "theirs.npy";
    const json hf = run_hf_interop(dir_, peers_python(),
                                   "gpt2 --folder " + folder.string() + " --tokens " +
                                       (dir_ / "eval.bin").string() + " --block-size 16 " +
                                       "--logits-out " + theirs.string());
    ASSERT_TRUE(hf.is_object());
    EXPECT_EQ(hf["missing_keys"], json::array()) << hf.dump();
    EXPECT_EQ(hf["unexpected_keys"], json::array()) << hf.dump();
    EXPECT_EQ(hf["mismatched_keys"], json::array()) << hf.dump();
    EXPECT_EQ(hf["error_msgs"], json::array()) << hf.dump();
    EXPECT_TRUE(hf["tied"].get<bool>()) << "lm_head.weight is not transformer.wte.weight";
    EXPECT_EQ(hf["config"]["n_head"], kHeads);
    EXPECT_EQ(hf["config"]["activation_function"], "gelu_new");
    const double gap = relative_gap(read_npy_floats(ours), read_npy_floats(theirs));
    std::cout << "transformers vs mixtrain logits: max gap / max |logit| = " << gap << std::endl;
    EXPECT_LT(gap, 1e-5);
  }

  std::string config_;
};

TEST_F(HfExport, ATrainedGptLoadsInTransformersAndComputesMixtrainsLogits) {
  auto r = run("train " + config_ + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(
      "predict " + config_ + " --checkpoint run --input eval.bin --positions all --out ours.npy",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // No --format: a Hugging Face folder's weights are safetensors.
  r = run("export run --layout hf --out hf", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Hugging Face GPT-2 folder")) << r.out;
  expect_gpt2_folder(dir_ / "hf", "F32", "float32");
  expect_transformers_agree(dir_ / "hf", dir_ / "ours.npy");

  // mixtrain reads the folder's weights back in the gpt2 layout ("transformer." is dropped):
  // the same held-out loss, to the bit.
  const auto a = run("eval " + config_ + " --checkpoint run", dir_);
  const auto b = run("eval " + config_ + " --checkpoint hf/model.safetensors --layout gpt2", dir_);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(json::parse(a.out)["eval_loss"], json::parse(b.out)["eval_loss"]);

  // Without --out: beside the run, named after the checkpoint.
  r = run("export run --layout hf", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "run" / "step-00000002-hf" / "config.json")) << r.out;
}

TEST_F(HfExport, BiasFreeGptGetsZeroBiasesThatTransformersComputesWith) {
  auto r = run("train " + config_ + " --set model.gpt.bias=false --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("predict " + config_ +
              " --set model.gpt.bias=false --checkpoint run --input eval.bin --positions all "
              "--out ours.npy",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export run --layout hf --out hf", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 4 linears per block: 8 biases, each said.
  EXPECT_TRUE(contains(r.out, "8 zero biases added")) << r.out;
  expect_gpt2_folder(dir_ / "hf", "F32", "float32");
  StFile f = read_st(dir_ / "hf" / "model.safetensors");
  const StTensor* bias = f.find("transformer.h.1.mlp.c_fc.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->bytes, std::string(4 * 4 * kEmbd, '\0'));
  expect_transformers_agree(dir_ / "hf", dir_ / "ours.npy");
}

TEST_F(HfExport, InitialWeightsInBf16SayTheirTorchDtype) {
  auto r = run("export " + config_ + " --initial --layout hf --dtype bf16 --out init-hf", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_gpt2_folder(dir_ / "init-hf", "BF16", "bfloat16");
  // The head count comes from the config the export carries, here the initial one.
  r = run("export " + config_ + " --initial --layout hf --set model.gpt.n_head=4 --out h4", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(dir_ / "h4" / "config.json"))["n_head"], 4);
}

TEST_F(HfExport, AnExistingFolderFileOrOtherFormatExits2AndForceWritesBesideOtherFiles) {
  auto r = run("train " + config_ + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  fs::create_directories(dir_ / "hf");
  write_file("hf/tokenizer.json", "{}");
  r = run("export run --layout hf --out hf", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "hf already exists and is not empty")) << r.err;
  EXPECT_TRUE(contains(r.err, "--force")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "hf" / "config.json"));

  r = run("export run --layout hf --out hf --force", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "config.json"));
  EXPECT_EQ(slurp(dir_ / "hf" / "tokenizer.json"), "{}");  // not the export's: left alone
  // The files are staged inside the folder and renamed into place: no staging folder stays, and
  // an export that cannot be written (here past a file-size limit, as a full disk) leaves the
  // previous pair as it was.
  std::set<std::string> names;
  for (const auto& f : fs::directory_iterator(dir_ / "hf")) names.insert(f.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  const std::string config_before = slurp(dir_ / "hf" / "config.json"),
                    weights_before = slurp(dir_ / "hf" / "model.safetensors");
  const std::string limited = "cd " + dir_.string() + " && bash -c 'ulimit -f 8; exec " +
                              std::string(MIXTRAIN_EXE) +
                              " export run --layout hf --out hf --force --dtype bf16' "
                              ">/dev/null 2>/dev/null </dev/null";
  const int status = std::system(limited.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_EQ(slurp(dir_ / "hf" / "config.json"), config_before);
  EXPECT_EQ(slurp(dir_ / "hf" / "model.safetensors"), weights_before);
  names.clear();
  for (const auto& f : fs::directory_iterator(dir_ / "hf")) names.insert(f.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));

  write_file("file", "x");
  r = run("export run --layout hf --out file", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "is a file")) << r.err;
  r = run("export run --layout hf --out missing/hf", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "does not exist")) << r.err;
  r = run("export run --layout hf --format native --out other", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--format safetensors")) << r.err;
  r = run("export run --out x.safetensors", dir_);  // other layouts still need --format
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--format")) << r.err;
}

// An export killed by SIGKILL or Ctrl-C (export does not catch it) leaves its staging folder and a
// partial weights file inside --out. The next export into that folder removes it and writes as
// into an empty folder; a staging folder a live writer holds (its flock) is left alone and makes
// the folder not empty.
TEST_F(HfExport, AKilledExportsStagingFolderIsRemovedByTheNextOneAndALiveOnesIsNot) {
  fs::create_directories(dir_ / "hf" / ".mixtrain-export.tmp.999999999");
  write_file("hf/.mixtrain-export.tmp.999999999/.model.safetensors.tmp.999999999.0", "partial");
  auto r = run("export " + config_ + " --initial --layout hf --out hf", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "the staging folder of an export that was killed")) << r.err;
  std::set<std::string> names;
  for (const auto& f : fs::directory_iterator(dir_ / "hf")) names.insert(f.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors"}));

  const fs::path live = dir_ / "held" / ".mixtrain-export.tmp.1";
  fs::create_directories(live);
  const int fd = ::open(live.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  r = run("export " + config_ + " --initial --layout hf --out held", dir_);
  ::close(fd);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "already exists and is not empty")) << r.err;
  EXPECT_TRUE(fs::is_directory(live));
}

using HfExportCli = CliTest;

TEST_F(HfExportCli, AModelThatIsNotTheGptPresetExits2NamingWhatItIs) {
  auto r = run("train " + quickstart() + " --set run.steps=2 --set backend.threads=1 --run-dir run",
               dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export run --layout hf --out hf", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "gpt-preset model")) << r.err;
  EXPECT_TRUE(contains(r.err, "built from [model] layers/nodes")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "hf" / "config.json"));

  r = run("export " + config("resnet18-bf16.toml") +
              " --initial --layout hf --set data.synthetic.rows=64 --set data.batch_size=16"
              " --set data.synthetic.height=32"
              " --set data.synthetic.width=32 --out hf",
          dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "the \"resnet\" preset")) << r.err;
  EXPECT_TRUE(contains(r.err, "torchvision")) << r.err;  // the hint: the default export
}

// ---- ResNet-18 under torchvision's names ----------------------------------------------------

// torchvision.models.resnet18(num_classes)'s parameters and buffers, by its rules: a 7×7 stem,
// four stages of two BasicBlocks with widths 64..512, the first block of stages 2-4 with a
// strided 1×1 conv + BN shortcut (downsample.0/1), fc. Every BN has weight, bias, running_mean
// and running_var; num_batches_tracked is the one name left out (see the test).
std::vector<std::pair<std::string, Shape>> resnet18_state_dict(std::int64_t classes) {
  std::vector<std::pair<std::string, Shape>> out;
  auto bn = [&](const std::string& name, std::int64_t c) {
    for (const char* p : {".weight", ".bias", ".running_mean", ".running_var"})
      out.push_back({name + p, {c}});
  };
  out.push_back({"conv1.weight", {64, 3, 7, 7}});
  bn("bn1", 64);
  std::int64_t in = 64;
  const std::int64_t widths[] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < 2; ++b) {
      const std::string h = "layer" + std::to_string(s + 1) + "." + std::to_string(b) + ".";
      const std::int64_t w = widths[s];
      out.push_back({h + "conv1.weight", {w, in, 3, 3}});
      bn(h + "bn1", w);
      out.push_back({h + "conv2.weight", {w, w, 3, 3}});
      bn(h + "bn2", w);
      if (s > 0 && b == 0) {
        out.push_back({h + "downsample.0.weight", {w, in, 1, 1}});
        bn(h + "downsample.1", w);
      }
      in = w;
    }
  out.push_back({"fc.weight", {classes, 512}});
  out.push_back({"fc.bias", {classes}});
  return out;
}

bool torchvision_available() {
  return std::system(
             (std::string(kTorchPython) + " -c 'import torch, torchvision, numpy' >/dev/null 2>&1")
                 .c_str()) == 0;
}

TEST_F(HfExportCli, AResNet18ExportIsTorchvisionsStateDictWithItsNormalization) {
  // configs/resnet18-bf16.toml in fp32 on a few 32×32 images: two steps move every weight and
  // the running statistics; the normalisation is computed from the training split.
  const std::string sets =
      " --set precision.policy=fp32 --set data.synthetic.rows=64 --set data.synthetic.height=32"
      " --set data.synthetic.width=32 --set data.batch_size=16 --set data.eval_batch_size=16"
      " --set data.augment.horizontal_flip=false --set run.steps=2 --set run.eval_every=0"
      " --set checkpoint.fsync=false";
  const std::string cfg = config("resnet18-bf16.toml");
  auto r = run("train " + cfg + sets + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export run --format safetensors --out resnet18.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;

  StFile f = read_st(dir_ / "resnet18.safetensors");
  const auto expected = resnet18_state_dict(10);
  EXPECT_EQ(f.tensors.size(), expected.size());
  for (const auto& [name, shape] : expected) {
    const StTensor* t = f.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
    EXPECT_EQ(t->dtype, "F32") << name;
  }
  // The Normalize the weights were trained behind, as the run folder keeps it.
  ASSERT_TRUE(f.metadata.contains("normalization"));
  const json norm = json::parse(f.metadata["normalization"].get<std::string>());
  const json run_norm = json::parse(slurp(dir_ / "run" / "normalization.json"));
  EXPECT_EQ(norm["mean"], run_norm["mean"]);
  EXPECT_EQ(norm["std"], run_norm["std"]);
  ASSERT_EQ(norm["mean"].size(), 3u);

  if (!torchvision_available()) {
    std::cout << kTorchPython
              << " cannot import torchvision (apt install python3-torchvision); names and "
                 "shapes checked against resnet18's rules only"
              << std::endl;
    return;
  }
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> images(4 * 3 * 32 * 32);
  for (auto& v : images) v = pixel(rng);
  write_npy(dir_ / "images.npy", "<f4", {4, 3, 32, 32}, images);
  r = run("predict " + cfg + sets + " --checkpoint run --input images.npy --out ours.npy", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json tv = run_hf_interop(dir_, kTorchPython,
                                 "resnet --weights " + (dir_ / "resnet18.safetensors").string() +
                                     " --classes 10 --images " + (dir_ / "images.npy").string() +
                                     " --logits-out " + (dir_ / "theirs.npy").string());
  ASSERT_TRUE(tv.is_object());
  EXPECT_EQ(tv["state_dict"].get<std::size_t>(),
            expected.size() + tv["num_batches_tracked"].get<std::size_t>());
  const double gap =
      relative_gap(read_npy_floats(dir_ / "ours.npy"), read_npy_floats(dir_ / "theirs.npy"));
  std::cout << "torchvision vs mixtrain logits: max gap / max |logit| = " << gap << std::endl;
  EXPECT_LT(gap, 1e-5);
}

}  // namespace
}  // namespace mixtrain::test
