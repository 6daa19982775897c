// The README's fine-tuning walk ("Fine-tuning a GPT-2 with LoRA, end to end") runs as written:
// every ```sh block of that section, in order, as one /bin/sh -e script each, in a folder laid out
// as the repository's root (samples/ linked, configs/gpt2-tiny-lora.toml copied so its relative
// paths land in the folder), with the built `mixtrain` first on PATH and the peers venv where the
// README names ~/.cache/mixtrain/peers. Then what the walk claims is checked on what it wrote: a
// tokenizer folder transformers loads offline, adapters that trained, PEFT's logits within 1e-4 of
// mixtrain's (compare_with_peft.py's line), and sampled ids that decode to text beginning with the
// prompt, and a run started from the exported adapters (from_peft) beginning below the first
// run's first loss. Skipped, saying so, where the peers venv lacks transformers, torch or peft.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_support.h"
#include "python_peers.h"
#include "readme_python_steps.h"

namespace mixtrain::test {
namespace {

constexpr const char* kHeading = "### Fine-tuning a GPT-2 with LoRA, end to end";

// The ```sh blocks of the section under kHeading, up to the next heading: each block's lines.
std::vector<std::string> walk_blocks(const std::string& readme) {
  std::istringstream in(readme);
  std::vector<std::string> blocks;
  bool inside = false, fenced = false;
  for (std::string line; std::getline(in, line);) {
    if (!fenced && line.rfind("#", 0) == 0 && line.find("# ") != std::string::npos) {
      if (inside) break;  // the next heading ends the walk
      inside = line == kHeading;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("```", 0) == 0) {
      fenced = !fenced;
      if (fenced) blocks.emplace_back(line == "```sh" ? "" : "#not-sh");
      continue;
    }
    if (fenced) blocks.back() += line + "\n";
  }
  std::vector<std::string> sh;
  for (auto& b : blocks)
    if (b.rfind("#not-sh", 0) != 0) sh.push_back(b);
  return sh;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

class FinetuneWalk : public CliTest {};

TEST_F(FinetuneWalk, TheReadmeWalkRunsAsWrittenAndPeftAgrees) {
  const fs::path source(MIXTRAIN_SOURCE_DIR);
  const auto blocks = walk_blocks(slurp(source / "README.md"));
  // Folder and tokens; train and export; predict and PEFT; sample through the tokenizer; a new
  // run from the exported adapters.
  ASSERT_EQ(blocks.size(), 5u) << "the README's walk under \"" << kHeading << "\" has moved";
  if (!peers_import("transformers, torch, peft"))
    GTEST_SKIP() << peers_missing_message("transformers, torch and peft",
                                          "the walk's Python steps cannot run");

  const fs::path work = dir_ / "root";
  fs::create_directories(work / "configs");
  fs::create_directory_symlink(source / "samples", work / "samples");
  fs::copy_file(source / "configs" / "gpt2-tiny-lora.toml",
                work / "configs" / "gpt2-tiny-lora.toml");
  const std::string path =
      fs::path(MIXTRAIN_EXE).parent_path().string() + ":" + std::getenv("PATH");
  std::vector<CliResult> results;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto script = dir_ / ("block-" + std::to_string(i + 1) + ".sh");
    std::ofstream(script) << replace_all(blocks[i], std::string(readme::kPeersPrefix),
                                         peers_venv().string());
    const auto out = dir_ / "block.out", err = dir_ / "block.err";
    const int status =
        std::system(("cd '" + work.string() + "' && PATH='" + path + "' /bin/sh -e " +
                     script.string() + " >" + out.string() + " 2>" + err.string() + " </dev/null")
                        .c_str());
    CliResult r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
    ASSERT_EQ(r.exit_code, 0) << "walk block " << i + 1 << ":\n" << blocks[i] << r.out << r.err;
    results.push_back(r);
  }

  // The folder holds a tokenizer as save_pretrained writes it, and the token files its ids.
  for (const auto* f : {"config.json", "model.safetensors", "tokenizer.json", "vocab.json",
                        "merges.txt", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(work / "data" / "tiny-gpt2" / f)) << f;
  const json config = json::parse(slurp(work / "data" / "tiny-gpt2" / "config.json"));
  EXPECT_EQ(config["vocab_size"], 512);
  EXPECT_EQ(config["n_layer"], 2);

  // The adapters trained: the held-out loss fell below a uniform guess over 512 tokens.
  double eval_loss = 0;
  for (const auto& rec : records(work / "runs" / "gpt2-tiny-lora" / "metrics.jsonl"))
    if (rec.contains("eval_loss")) eval_loss = rec["eval_loss"].get<double>();
  EXPECT_GT(eval_loss, 0.0);
  EXPECT_LT(eval_loss, std::log(512.0));

  // compare_with_peft.py's line: PEFT loaded every adapter tensor, its logits are mixtrain's, and
  // the adapters changed them (so the agreement is not the base model's alone).
  const auto& peft = results[2].out;
  const auto at = peft.find("{\"rows\"");
  ASSERT_NE(at, std::string::npos) << peft;
  const json compared = json::parse(peft.substr(at, peft.find('\n', at) - at));
  EXPECT_EQ(compared["all_loaded"], true);
  EXPECT_EQ(compared["adapter_tensors"], 16);
  EXPECT_LT(compared["max_relative_gap"].get<double>(), 1e-4);
  EXPECT_GT(compared["adapter_effect"].get<double>(),
            1e3 * compared["max_relative_gap"].get<double>());
  std::cout << "PEFT against mixtrain: " << compared.dump() << std::endl;

  // The sample, decoded by the folder's tokenizer, continues the prompt.
  EXPECT_EQ(results[3].out.rfind("This License", 0), 0u) << results[3].out;
  EXPECT_GT(results[3].out.size(), std::string("This License\n").size()) << results[3].out;

  // The run from the adapter folder starts where the first one ended: over the same first
  // batches (same seed, same sampler) its first logged loss is below the first run's, which
  // began at B = 0.
  EXPECT_TRUE(has(results[4].err, "LoRA adapters loaded from")) << results[4].err;
  const auto first = step_losses(work / "runs" / "gpt2-tiny-lora");
  const auto more = step_losses(work / "runs" / "gpt2-tiny-lora-more");
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(more.empty());
  EXPECT_LT(more.front(), first.front());
}

// make_token_file.py --tokenizer with a folder that is not there: exit 2 naming it, before
// transformers could take the name for one on the Hugging Face Hub (so no peers are needed).
TEST_F(FinetuneWalk, TokenFileWithAMissingTokenizerFolderExits2NamingIt) {
  const std::string script =
      (fs::path(MIXTRAIN_SOURCE_DIR) / "samples" / "data_tools" / "make_token_file.py").string();
  write_file("text.txt", "some text\n");
  const int status = std::system(("cd '" + dir_.string() + "' && /usr/bin/python3 " + script +
                                  " text.txt --tokenizer no-such-folder --out t.bin >out.txt "
                                  "2>err.txt </dev/null")
                                     .c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 2);
  const auto err = slurp(dir_ / "err.txt");
  EXPECT_TRUE(has(err, "--tokenizer no-such-folder: no such folder")) << err;
  EXPECT_FALSE(fs::exists(dir_ / "t.bin"));
}

// make_token_file.py --tokenizer reads a folder holding only tokenizer.json, or only vocab.json and
// merges.txt (what the docs say suffices; AutoTokenizer alone would ask for config.json), to the
// same ids as the whole model folder, a <|endoftext|> in the text its id on every path (the bare
// vocab.json + merges.txt tokenizer split it into pieces); each file is encoded on its own, with
// --eot-id before each; a corrupt tokenizer.json exits 2 naming the folder.
TEST_F(FinetuneWalk, TokenFileReadsATokenizerFolderWithoutTheModelsConfig) {
  if (!peers_import("transformers, torch"))
    GTEST_SKIP() << peers_missing_message("transformers and torch", "tokenizer folders");
  const fs::path source(MIXTRAIN_SOURCE_DIR);
  const std::string python = peers_python();
  const std::string tool = (source / "samples" / "data_tools" / "make_token_file.py").string();
  const std::string text = "/usr/share/common-licenses/MPL-2.0";
  auto sh = [&](const std::string& command) {
    const int status = std::system(
        ("cd '" + dir_.string() + "' && " + command + " >>out.txt 2>err.txt </dev/null").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  ASSERT_EQ(
      sh(python + " " + (source / "samples" / "finetune_gpt2" / "make_tiny_gpt2.py").string() +
         " " + text + " --out whole"),
      0)
      << slurp(dir_ / "err.txt");
  fs::create_directories(dir_ / "json-only");
  fs::copy_file(dir_ / "whole" / "tokenizer.json", dir_ / "json-only" / "tokenizer.json");
  fs::create_directories(dir_ / "bpe-only");
  fs::copy_file(dir_ / "whole" / "vocab.json", dir_ / "bpe-only" / "vocab.json");
  fs::copy_file(dir_ / "whole" / "merges.txt", dir_ / "bpe-only" / "merges.txt");
  write_file("text.txt", slurp(text) + "<|endoftext|>Exhibit");
  write_file("tail.txt", "s of the License\n");
  for (const std::string folder : {"whole", "json-only", "bpe-only"})
    ASSERT_EQ(
        sh(python + " " + tool + " text.txt --tokenizer " + folder + " --out " + folder + ".bin"),
        0)
        << folder << ": " << slurp(dir_ / "err.txt");
  const std::string whole = slurp(dir_ / "whole.bin");
  ASSERT_GT(whole.size(), 1024u + 2 * 1000u);
  EXPECT_EQ(slurp(dir_ / "json-only.bin"), whole);
  EXPECT_EQ(slurp(dir_ / "bpe-only.bin"), whole);
  // The ids of a token file: uint16, little-endian, after the 1024-byte header.
  auto ids = [&](const std::string& name) {
    const std::string bytes = slurp(dir_ / name);
    std::vector<int> out;
    for (std::size_t at = 1024; at + 1 < bytes.size(); at += 2)
      out.push_back(static_cast<unsigned char>(bytes[at]) |
                    static_cast<unsigned char>(bytes[at + 1]) << 8);
    return out;
  };
  const auto text_ids = ids("whole.bin");
  EXPECT_EQ(std::count(text_ids.begin(), text_ids.end(), 0), 1);  // make_tiny_gpt2's <|endoftext|>

  ASSERT_EQ(sh(python + " " + tool + " tail.txt --tokenizer whole --out tail.bin"), 0)
      << slurp(dir_ / "err.txt");
  ASSERT_EQ(sh(python + " " + tool + " text.txt tail.txt --tokenizer bpe-only --eot-id 0 --out " +
               "two.bin"),
            0)
      << slurp(dir_ / "err.txt");
  std::vector<int> expected{0};
  expected.insert(expected.end(), text_ids.begin(), text_ids.end());
  expected.push_back(0);
  const auto tail_ids = ids("tail.bin");
  expected.insert(expected.end(), tail_ids.begin(), tail_ids.end());
  EXPECT_EQ(ids("two.bin"), expected);

  fs::create_directories(dir_ / "corrupt");
  write_file("corrupt/tokenizer.json", "{\"model\": ");
  EXPECT_EQ(sh(python + " " + tool + " text.txt --tokenizer corrupt --out corrupt.bin"), 2);
  const auto err = slurp(dir_ / "err.txt");
  EXPECT_TRUE(has(err, "--tokenizer corrupt: ")) << err;
  EXPECT_FALSE(has(err, "Traceback")) << err;
  EXPECT_FALSE(fs::exists(dir_ / "corrupt.bin"));
}

}  // namespace
}  // namespace mixtrain::test
