// [model] from_pretrained = "DIR" through the `mixtrain` executable: a Hugging Face GPT-2 folder
// as the gpt preset's sizes (config.json) and initial weights (model.safetensors).
// - A folder `export --layout hf` wrote starts a run from the exported weights: its initial
//   held-out loss is the original checkpoint's, bit for bit, and the run's config.toml resumes
//   with the folder gone.
// - `check` shows each size with the config.json field it came from; a size [model.gpt] also
//   gives must agree, else exit 2 naming both values and the key's file:line:col.
// - Every bad folder (missing, no or malformed config.json, a model the preset cannot build, a
//   pickle only, tensors missing, extra or foreign) and every contradicting key exits 2 naming
//   the problem, and leaves no run folder.
// - Where the peers venv imports transformers (python_peers.h), a folder GPT2LMHeadModel
//   .save_pretrained wrote gives mixtrain transformers' logits and loss.
#include <functional>
#include <string>
#include <vector>

#include "gpt_torch_support.h"
#include "hf_interop_support.h"
#include "python_peers.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

// 2 layers, 2 heads, 32 wide, 16 positions, 64 tokens: trains in well under a second.
const char* kGpt = R"(
[run]
name = "gpt"
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

// kGpt started from the folder "hf": no sizes of its own.
const char* kPretrained = R"(
[run]
name = "pretrained"
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

// "file:LINE:" of the first line of `text` that starts with `line`.
std::string line_of(const fs::path& file, const std::string& text, const std::string& line) {
  std::size_t number = 1, start = 0;
  while (text.compare(start, line.size(), line) != 0) {
    start = text.find('\n', start) + 1;
    ++number;
  }
  return file.string() + ":" + std::to_string(number) + ":";
}

class FromPretrained : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    gpt_ = write_file("gpt.toml", kGpt).string();
    pretrained_ = write_file("pretrained.toml", kPretrained).string();
    write_token_walk(dir_ / "train.bin", 2000, 5);
    write_token_walk(dir_ / "eval.bin", 16 * 6 + 1, 6);  // six labelled windows
  }

  // kGpt's initial weights as a Hugging Face folder, `sets` applied.
  void export_initial_folder(const std::string& folder, const std::string& sets = "") {
    const auto r = run("export " + gpt_ + " --initial --layout hf --out " + folder + sets, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  json eval(const std::string& config, const std::string& checkpoint) {
    const auto r = run("eval " + config + " --checkpoint " + checkpoint, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out, nullptr, false);
  }

  std::string gpt_, pretrained_;
};

TEST_F(FromPretrained, AnExportedRunStartsWhereItEndedAndResumesWithoutTheFolder) {
  auto r = run("train " + gpt_ + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export run --layout hf --out hf", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // The weights step 1 starts from, as `train` loads them: the trained run's, so the held-out
  // loss is the same to the bit.
  r = run("export " + pretrained_ + " --initial --format safetensors --out initial.safetensors",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, (dir_ / "hf" / "model.safetensors").string())) << r.out;
  const json trained = eval(gpt_, "run");
  ASSERT_TRUE(trained.contains("eval_loss")) << trained;
  EXPECT_EQ(eval(pretrained_, "initial.safetensors")["eval_loss"], trained["eval_loss"]);
  EXPECT_EQ(eval(gpt_, "initial.safetensors")["eval_loss"], trained["eval_loss"]);

  r = run("train " + pretrained_ + " --run-dir fine", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(
      has(r.err, "initial weights loaded from " + (dir_ / "hf" / "model.safetensors").string()))
      << r.err;
  // The run's config.toml says what from_pretrained became, so it needs no config.json.
  const std::string resolved = slurp(dir_ / "fine" / "config.toml");
  EXPECT_TRUE(has(resolved, "preset = \"gpt\"\nfrom_pretrained = \"\"\n")) << resolved;
  EXPECT_TRUE(has(resolved,
                  "[model.gpt]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = "
                  "64\nblock_size = 16\nbias = true\n"))
      << resolved;
  EXPECT_TRUE(has(resolved, "init_from = \"" + (dir_ / "hf" / "model.safetensors").string() +
                                "\"\ninit_layout = \"gpt2\"\n"))
      << resolved;

  fs::rename(dir_ / "hf", dir_ / "moved");
  r = run("train --resume fine --set run.steps=3", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "resumed from")) << r.err;
  EXPECT_TRUE(has(r.out, "done: 3 steps")) << r.out;
}

// The folder's bos/eos token ids travel with the run (its config.toml's [model.gpt]) to the
// config.json of its Hugging Face export, so generate() stops where the folder's model stops; a
// resume needs no folder for them. An id the vocabulary lacks is refused at the key.
TEST_F(FromPretrained, TheFoldersTokenIdsReachTheExportsConfigJson) {
  export_initial_folder("hf");
  json folder_config = json::parse(slurp(dir_ / "hf" / "config.json"));
  EXPECT_TRUE(folder_config["eos_token_id"].is_null());  // 64 tokens: no <|endoftext|>
  folder_config["bos_token_id"] = 3;
  folder_config["eos_token_id"] = 5;
  write_file("hf/config.json", folder_config.dump());
  auto r = run("train " + pretrained_ + " --run-dir fine", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  fs::rename(dir_ / "hf", dir_ / "moved");
  r = run("train --resume fine --set run.steps=3", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "another model")) << r.err;
  r = run("export fine --layout hf --out out", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json exported = json::parse(slurp(dir_ / "out" / "config.json"));
  EXPECT_EQ(exported["bos_token_id"], 3);
  EXPECT_EQ(exported["eos_token_id"], 5);
  fs::rename(dir_ / "moved", dir_ / "hf");
  r = run("train " + pretrained_ + " --set model.gpt.eos_token_id=64 --run-dir past", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "eos_token_id")) << r.err;
  EXPECT_TRUE(has(r.err, "is 64, not a token of the model's 64")) << r.err;
  // GPT2Config takes a list of ids too: read as none, and said, not refused.
  folder_config["eos_token_id"] = json::array({3, 4});
  write_file("hf/config.json", folder_config.dump());
  r = run("check " + pretrained_, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out + r.err, "eos_token_id = [3,4] is not one token id")) << r.out << r.err;
  // transformers' GPT2Config() keeps 50256 whatever the vocabulary: none, and said.
  folder_config["bos_token_id"] = 50256;
  write_file("hf/config.json", folder_config.dump());
  r = run("check " + pretrained_, dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out + r.err, "bos_token_id = 50256 is outside vocab_size 64"))
      << r.out << r.err;
}

// A run from a folder with a tokenizer exports a folder with that tokenizer's files, byte for
// byte, so AutoTokenizer.from_pretrained loads the fine-tuned model as it loaded the base; a
// config started otherwise (its initial weights no folder's) carries none.
TEST_F(FromPretrained, AnHfExportCarriesTheFoldersTokenizerFiles) {
  export_initial_folder("hf");
  write_file("hf/vocab.json", "{\"a\": 0, \"b\": 1}");
  write_file("hf/merges.txt", "#version: 0.2\na b\n");
  write_file("hf/tokenizer_config.json", "{\"model_max_length\": 16}");
  auto r = run("train " + pretrained_ + " --set run.steps=1 --run-dir fine", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export fine --layout hf --out out", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "vocab.json")) << r.out;
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    EXPECT_EQ(slurp(dir_ / "out" / f), slurp(dir_ / "hf" / f)) << f;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "tokenizer.json"));  // only those the folder has
  r = run("export " + pretrained_ + " --initial --layout hf --out initial", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "initial" / "merges.txt"));
  export_initial_folder("plain");
  EXPECT_FALSE(fs::exists(dir_ / "plain" / "vocab.json"));
}

// A folder without a tokenizer (a byte-level model's export) reads bytes: it trains on the text
// source, which a folder with a tokenizer is refused (the bad-input test's text-bytes case).
TEST_F(FromPretrained, AByteLevelFolderWithoutATokenizerTrainsOnText) {
  export_initial_folder("hf256", " --set model.gpt.vocab_size=256 --set data.vocab_size=256");
  // kPretrained on the text source's bytes, from the byte-level folder.
  std::string on_text = kPretrained;
  const std::string tokens_data =
      "source = \"tokens\"\ntrain = \"train.bin\"\neval = \"eval.bin\"\nblock_size = 16\n"
      "vocab_size = 64\n";
  ASSERT_NE(on_text.find(tokens_data), std::string::npos);
  on_text.replace(on_text.find(tokens_data), tokens_data.size(),
                  "source = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\n"
                  "block_size = 16\n");
  const auto cfg = write_file("bytes.toml", on_text);
  const auto r =
      run("train " + cfg.string() + " --set model.from_pretrained=hf256 --run-dir bytes", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(FromPretrained, CheckShowsEachSizeAndTheFieldItCameFrom) {
  // Four heads, which the weights cannot tell; positions that the data (8) does not set.
  export_initial_folder("h4", " --set model.gpt.n_head=4");
  auto c = json::parse(slurp(dir_ / "h4" / "config.json"));
  c["resid_pdrop"] = 0.1;
  std::ofstream(dir_ / "h4" / "config.json") << c.dump();
  const std::string text = std::string(kPretrained) + "[model.gpt]\nn_embd = 32\n";
  const auto config = write_file("agreeing.toml", text);
  const auto r = run(
      "check " + config.string() + " --set model.from_pretrained=h4 --set data.block_size=8", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string json_file = (dir_ / "h4" / "config.json").string();
  for (const std::string& line :
       {"# sizes from " + json_file + ":\n", std::string("#   n_layer = 2 (its n_layer)\n"),
        std::string("#   n_head = 4 (its n_head)\n"),
        "#   n_embd = 32 (its n_embd), also given at " + line_of(config, text, "n_embd = 32"),
        std::string("#   vocab_size = 64 (its vocab_size)\n"),
        std::string("#   block_size = 16 (its n_positions)\n"),
        std::string("[model.gpt]\nn_layer = 2\nn_head = 4\nn_embd = 32\nvocab_size = "
                    "64\nblock_size = 16\nbias = true\n"),
        std::string("init_layout = \"gpt2\"\n")})
    EXPECT_TRUE(has(r.out, line)) << line << "\n" << r.out;
  // Dropout is noise in training, not the model's function: said, not refused.
  EXPECT_TRUE(has(r.err, json_file + ": resid_pdrop = 0.1 is not applied")) << r.err;
}

TEST_F(FromPretrained, ASizeTheConfigAlsoGivesMustAgreeNamingBothValuesAndWhere) {
  export_initial_folder("hf");
  const std::string json_file = (dir_ / "hf" / "config.json").string();
  struct Case {
    std::string table, line, message;
  };
  const std::vector<Case> cases = {
      {"[model.gpt]\nn_layer = 2\nn_embd = 64\n", "n_embd = 64",
       "'model.gpt.n_embd': n_embd = 64 disagrees with " + json_file + "'s n_embd = 32"},
      {"[model.gpt]\nblock_size = 32\n", "block_size = 32",
       "'model.gpt.block_size': block_size = 32 disagrees with " + json_file +
           "'s n_positions = 16"},
      {"[model.gpt]\nbias = false\n", "bias = false",
       "'model.gpt.bias': is false, but a GPT-2 folder's linears have biases"},
  };
  for (const auto& c : cases) {
    const std::string text = std::string(kPretrained) + c.table;
    const auto config = write_file("sized.toml", text);
    const auto r = run("train " + config.string() + " --run-dir run", dir_);
    EXPECT_EQ(r.exit_code, 2) << c.line << "\n" << r.err;
    EXPECT_TRUE(has(r.err, line_of(config, text, c.line))) << r.err;
    EXPECT_TRUE(has(r.err, c.message)) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "run")) << c.line;
  }
}

TEST_F(FromPretrained, ABadFolderOrAContradictingKeyExits2AndLeavesNoRunFolder) {
  export_initial_folder("hf");
  using Edit = std::function<void(const fs::path&)>;
  auto config_json = [](std::function<void(json&)> edit) -> Edit {
    return [edit](const fs::path& folder) {
      auto c = json::parse(slurp(folder / "config.json"));
      edit(c);
      std::ofstream(folder / "config.json") << c.dump();
    };
  };
  auto tensors = [](std::function<void(StFile&)> edit) -> Edit {
    return [edit](const fs::path& folder) {
      StFile f = read_st(folder / "model.safetensors");
      edit(f);
      write_st(folder / "model.safetensors", f);
    };
  };
  auto drop = [](const std::string& name) {
    return [name](StFile& f) {
      std::erase_if(f.tensors, [&](const StTensor& t) { return t.name == name; });
    };
  };
  auto add = [](const std::string& name, const std::string& like) {
    return [name, like](StFile& f) {
      StTensor t = *f.find(like);
      t.name = name;
      f.tensors.push_back(t);
    };
  };
  struct Case {
    std::string name;  // the folder: a copy of hf that `edit` changes
    Edit edit;
    std::vector<std::string> expected;
    std::string sets = "";
    std::string config = "";  // a config of its own instead of kPretrained
  };
  // kPretrained on the text source's bytes: its token files read as text.
  std::string on_text = kPretrained;
  const std::string tokens_data = "source = \"tokens\"\ntrain = \"train.bin\"";
  ASSERT_NE(on_text.find(tokens_data), std::string::npos);
  on_text.replace(on_text.find(tokens_data), tokens_data.size(),
                  "source = \"text\"\npath = \"train.bin\"");
  const std::vector<Case> cases = {
      {"missing", [](const fs::path& f) { fs::remove_all(f); }, {"missing does not exist"}},
      {"no-config",
       [](const fs::path& f) { fs::remove(f / "config.json"); },
       {"no-config has no config.json"}},
      {"malformed",
       [](const fs::path& f) { std::ofstream(f / "config.json") << "{\"model_type\": \"gpt2\","; },
       {"malformed/config.json: not valid JSON"}},
      {"gpt-neo",
       config_json([](json& c) { c["model_type"] = "gpt_neo"; }),
       {"gpt-neo/config.json: 'model_type': is \"gpt_neo\"", "GPT-2 folders"}},
      {"three-heads",
       config_json([](json& c) { c["n_head"] = 3; }),
       {"'n_head': n_embd = 32 is not divisible by n_head = 3"}},
      {"erf-gelu",
       config_json([](json& c) { c["activation_function"] = "gelu"; }),
       {"'activation_function': is \"gelu\"", "gelu_new"}},
      {"layer-scaled",
       config_json([](json& c) { c["scale_attn_by_inverse_layer_idx"] = true; }),
       {"'scale_attn_by_inverse_layer_idx': is true"}},
      {"narrow-mlp",
       config_json([](json& c) { c["n_inner"] = 100; }),
       {"'n_inner': is 100: the gpt preset's MLP is 4·n_embd = 128 wide"}},
      {"pickle",
       [](const fs::path& f) { fs::rename(f / "model.safetensors", f / "pytorch_model.bin"); },
       {"pickle holds its weights only in pytorch_model.bin, a Python pickle",
        "save_pretrained(\"<new folder>\", safe_serialization=True)"}},
      {"no-weights",
       [](const fs::path& f) { fs::remove(f / "model.safetensors"); },
       {"no-weights has no model.safetensors"}},
      {"missing-tensor",
       tensors(drop("transformer.h.1.mlp.c_fc.bias")),
       {"no tensor for parameter 'h.1.mlp.c_fc.bias'",
        "config.json and model.safetensors are of different models"}},
      {"extra-tensor",
       tensors(add("transformer.h.2.ln_1.weight", "transformer.h.1.ln_1.weight")),
       {"tensor 'transformer.h.2.ln_1.weight' matches no parameter",
        "config.json and model.safetensors are of different models"}},
      {"foreign-tensor",
       tensors(add("score.weight", "transformer.wte.weight")),
       {"tensor 'score.weight' is not a weight of Hugging Face GPT-2",
        "from_pretrained reads GPT2LMHeadModel's weights"}},
      {"more-layers",
       config_json([](json& c) { c["n_layer"] = 3; }),
       {"no tensor for parameter 'h.2.ln_1.weight'", "hf-more-layers/config.json"}},
      {"other-vocab",
       config_json([](json& c) { c["vocab_size"] = 100; }),
       {"vocab_size = 100 but the data's vocab_size is 64"}},
      {"text-bytes",
       [](const fs::path& f) { std::ofstream(f / "tokenizer.json") << "{}"; },
       {"data.source = \"text\" feeds the model bytes", "make_token_file.py --tokenizer"},
       " --set data.vocab_size=256",
       on_text},
      {"fewer-positions",
       config_json([](json& c) { c["n_positions"] = c["n_ctx"] = 8; }),
       {"the data's block_size = 16 is longer than", "n_positions = 8"}},
      {"init-from",
       nullptr,
       {"'checkpoint.init_from': init_from = \"w.safetensors\" and model.from_pretrained",
        "both name the initial weights"},
       " --set checkpoint.init_from=w.safetensors"},
      {"native-layout",
       nullptr,
       {"'checkpoint.init_layout': init_layout = \"native\" contradicts model.from_pretrained"},
       " --set checkpoint.init_layout=native"},
      {"resnet",
       nullptr,
       {"preset = \"resnet\" beside from_pretrained"},
       " --set model.preset=resnet"},
  };
  for (const auto& c : cases) {
    const std::string folder = c.edit ? "hf-" + c.name : "hf";
    if (c.edit) {
      fs::copy(dir_ / "hf", dir_ / folder, fs::copy_options::recursive);
      c.edit(dir_ / folder);
    }
    const std::string config =
        c.config.empty() ? pretrained_ : write_file(c.name + ".toml", c.config).string();
    const auto r = run("train " + config + " --set model.from_pretrained=" + folder + c.sets +
                           " --run-dir run-" + c.name,
                       dir_);
    EXPECT_EQ(r.exit_code, 2) << c.name << "\n" << r.err;
    for (const auto& part : c.expected) EXPECT_TRUE(has(r.err, part)) << c.name << "\n" << r.err;
    EXPECT_FALSE(fs::exists(dir_ / ("run-" + c.name))) << c.name;
  }
}

TEST_F(FromPretrained, AFolderTransformersSavedGivesTransformersLogitsAndLoss) {
  if (!peers_import("transformers, torch, safetensors"))
    GTEST_SKIP() << peers_missing_message("transformers, torch, safetensors",
                                          "no folder from save_pretrained to compare with");
  const json made = run_hf_interop(dir_, peers_python(),
                                   "make-gpt2 --out " + (dir_ / "hf").string() +
                                       " --n-layer 2 --n-head 2 --n-embd 32 --n-positions 16 "
                                       "--vocab-size 64 --seed 3");
  ASSERT_TRUE(made.is_object());
  auto r = run(
      "export " + pretrained_ + " --initial --format safetensors --out initial.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // GPT2Config's dropout (0.1) is accepted: it is not part of the function compared.
  EXPECT_TRUE(has(r.err, "attn_pdrop = 0.1 is not applied")) << r.err;
  r = run("predict " + pretrained_ +
              " --checkpoint initial.safetensors --input eval.bin --positions all --out ours.npy",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json ours = eval(pretrained_, "initial.safetensors");

  const json theirs = run_hf_interop(
      dir_, peers_python(),
      "gpt2 --folder " + (dir_ / "hf").string() + " --tokens " + (dir_ / "eval.bin").string() +
          " --block-size 16 --logits-out " + (dir_ / "theirs.npy").string());
  ASSERT_TRUE(theirs.is_object());
  EXPECT_EQ(theirs["missing_keys"], json::array()) << theirs.dump();
  const double gap =
      relative_gap(read_npy_floats(dir_ / "ours.npy"), read_npy_floats(dir_ / "theirs.npy"));
  std::cout << "transformers vs mixtrain logits: max gap / max |logit| = " << gap << "; loss "
            << theirs["loss"] << " vs " << ours["eval_loss"] << std::endl;
  EXPECT_LT(gap, 1e-5);
  EXPECT_NEAR(ours["eval_loss"].get<double>(), theirs["loss"].get<double>(),
              1e-5 * theirs["loss"].get<double>());
}

}  // namespace
}  // namespace mixtrain::test
