// The byte-level GPT of configs/gpt-tiny-*.toml through the real executable: it learns, it
// samples (deterministically per seed, over a KV cache), and bad models or checkpoints exit 2.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gpt_torch_support.h"
#include "safetensors_test_support.h"

namespace {

using namespace mixtrain::test;
using CliGpt = CliTest;

// A short, narrow run of the tiny config (2 layers, 64 wide, 64 tokens): enough to see learning.
const std::string kSmall =
    " --set model.gpt.n_layer=2 --set model.gpt.n_embd=64 --set data.block_size=64"
    " --set run.log_every=10";

TEST_F(CliGpt, TinyGptLearnsAndReportsNatsPerByte) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("gpt-tiny-fp32.toml") + kSmall +
               " --set run.steps=120 --set run.eval_every=120 --set run.log_every=1 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  double first = -1, eval = -1;
  for (const auto& rec : records(run_dir / "metrics.jsonl")) {
    if (rec.contains("loss") && first < 0) first = rec["loss"].get<double>();
    if (rec.contains("eval_loss")) eval = rec["eval_loss"].get<double>();
  }
  // The first step's loss is about a uniform guess over 256 bytes (ln 256 = 5.55 nats); English
  // text is far below it.
  EXPECT_GT(first, 5.0);
  ASSERT_GT(eval, 0.0);
  EXPECT_LT(eval, 3.3) << "held-out nats per byte after 120 steps";
}

TEST_F(CliGpt, SamplesTheSameTextForTheSameSeedOverAKvCache) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("gpt-tiny-fp32.toml") + kSmall +
               " --set run.steps=30 --set run.eval_every=0 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string cfg = (run_dir / "config.toml").string();
  // 100 tokens after a 10-byte prompt pass the 64-position cache: the window slides.
  const std::string args = "sample " + cfg + " --checkpoint " + run_dir.string() +
                           " --prompt 'This Licen' --tokens 100 --top-k 20 --seed ";
  auto a = run(args + "7");
  auto b = run(args + "7");
  auto c = run(args + "8");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  EXPECT_EQ(a.out.rfind("This Licen", 0), 0u) << a.out;
  EXPECT_EQ(a.out.size(), 10u + 100u + 1u);  // prompt, 100 bytes, newline
  // Greedy decoding is the argmax at every step, whatever the seed.
  auto g1 = run("sample " + cfg + " --checkpoint " + run_dir.string() +
                " --prompt 'the ' --tokens 40 --temperature 0 --seed 1");
  auto g2 = run("sample " + cfg + " --checkpoint " + run_dir.string() +
                " --prompt 'the ' --tokens 40 --temperature 0 --seed 2");
  ASSERT_EQ(g1.exit_code, 0) << g1.err;
  EXPECT_EQ(g1.out, g2.out);
  // A nucleus too small for a second token is greedy too, whatever the temperature; top-p 1 is
  // no nucleus: the draws of the plain run.
  auto nucleus = run("sample " + cfg + " --checkpoint " + run_dir.string() +
                     " --prompt 'the ' --tokens 40 --temperature 1.5 --top-p 1e-9 --seed 3");
  ASSERT_EQ(nucleus.exit_code, 0) << nucleus.err;
  EXPECT_EQ(nucleus.out, g1.out);
  auto whole = run(args + "7 --top-p 1");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  EXPECT_EQ(whole.out, a.out);
  // A stop id ends the generation right after its first occurrence, which is printed.
  const std::string generated = g1.out.substr(4, 40);
  const unsigned char stop = static_cast<unsigned char>(generated[5]);
  auto stopped =
      run("sample " + cfg + " --checkpoint " + run_dir.string() +
          " --prompt 'the ' --tokens 40 --temperature 0 --stop-ids 255," + std::to_string(stop));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(stopped.out,
            "the " + generated.substr(0, generated.find(static_cast<char>(stop)) + 1) + "\n");

  // The same prompt as ids (the bytes of "This Licen") gives the same draws, printed as ids: the
  // prompt's, then one per generated token, each the byte the text output shows.
  auto ids = run("sample " + cfg + " --checkpoint " + run_dir.string() +
                 " --prompt-ids '84,104, 105,115,32,76,105,99,101,110' --print-ids --tokens 100 "
                 "--top-k 20 --seed 7");
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  std::string expected;
  for (unsigned char c : a.out.substr(0, a.out.size() - 1))
    expected += (expected.empty() ? "" : ",") + std::to_string(c);
  EXPECT_EQ(ids.out, expected + "\n");
  // Ids read from a file written on Windows end with "\r\n": the same prompt. (The space after
  // it keeps the shell's command substitution from dropping the "\n".)
  auto crlf = run("sample " + cfg + " --checkpoint " + run_dir.string() +
                  " --prompt-ids \"$(printf '84,104, 105,115,32,76,105,99,101,110\\r\\n ')\""
                  " --print-ids --tokens 100 --top-k 20 --seed 7");
  ASSERT_EQ(crlf.exit_code, 0) << crlf.err;
  EXPECT_EQ(crlf.out, ids.out);
  // Ids printed are a prompt: the output continues from itself.
  auto more = run("sample " + cfg + " --checkpoint " + run_dir.string() + " --prompt-ids " +
                  expected + " --print-ids --tokens 5 --temperature 0");
  ASSERT_EQ(more.exit_code, 0) << more.err;
  EXPECT_EQ(more.out.rfind(expected + ",", 0), 0u) << more.out;
}

// A byte-level model (data.source = "text") whose output layer is padded past the bytes (300
// ids) still takes and prints text, and never draws a padded id, even at a temperature that makes
// the untrained ids 256..299 likely.
TEST_F(CliGpt, SampleOfAPaddedByteLevelModelReadsAndWritesBytesOnly) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("gpt-tiny-fp32.toml") + kSmall +
               " --set data.vocab_size=300 --set run.steps=2 --set run.eval_every=0 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string base =
      "sample " + (run_dir / "config.toml").string() + " --checkpoint " + run_dir.string();
  r = run(base + " --prompt 'the ' --tokens 20 --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("the ", 0), 0u) << r.out;
  EXPECT_EQ(r.out.size(), 4u + 20u + 1u);
  r = run(base + " --prompt-ids 116,104 --print-ids --tokens 300 --temperature 20 --seed 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<int> drawn;
  for (std::size_t at = 0; at < r.out.size();) {
    const std::size_t end = r.out.find_first_of(",\n", at);
    drawn.push_back(std::stoi(r.out.substr(at, end - at)));
    at = end + 1;
  }
  ASSERT_EQ(drawn.size(), 2u + 300u) << r.out;
  EXPECT_LT(*std::max_element(drawn.begin(), drawn.end()), 256) << r.out;
  // A stop id that is no byte could never end the generation.
  r = run(base + " --prompt 'the ' --stop-ids 10,256");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--stop-ids: token id 256 (item 2) is outside")) << r.err;
}

// As Hugging Face's generate(): the model's [model.gpt] eos_token_id ends the output (said on
// stderr), unless --ignore-eos, or --stop-ids names other stops. A context shorter than the
// model's positions (data.block_size below [model.gpt] block_size) and a prompt longer than the
// context are said too, with the --set that widens it.
TEST_F(CliGpt, SampleStopsAtTheModelsEosAndSaysWhatTheContextLeavesOut) {
  write_token_walk(dir_ / "train.bin", 3000, 1);
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("gpt-tiny-fp32.toml") + kSmall +
               " --set model.gpt.block_size=64 --set model.gpt.eos_token_id=-1"
               " --set data.source=tokens --set data.train=" +
               (dir_ / "train.bin").string() +
               " --set data.vocab_size=300 --set run.steps=2 --set run.eval_every=0 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string base = "sample " + (run_dir / "config.toml").string() + " --checkpoint " +
                           run_dir.string() + " --prompt-ids 5,6,7 --print-ids --tokens 6 " +
                           "--temperature 0";
  r = run(base);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The first line's comma-separated ids.
  auto ids_of = [](const std::string& out) {
    std::vector<std::string> ids;
    std::istringstream line(out.substr(0, out.find('\n')));
    for (std::string id; std::getline(line, id, ',');) ids.push_back(id);
    return ids;
  };
  const auto all = ids_of(r.out);
  ASSERT_EQ(all.size(), 3u + 6u) << r.out;
  EXPECT_FALSE(has(r.err, "eos_token_id")) << r.err;  // -1: none
  const std::string eos = all[3];                     // the first generated id
  r = run(base + " --set model.gpt.eos_token_id=" + eos);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ids_of(r.out), std::vector<std::string>(all.begin(), all.begin() + 4)) << r.out;
  EXPECT_TRUE(has(r.err, "stopped at the model's eos_token_id " + eos + " after 1 of 6")) << r.err;
  r = run(base + " --set model.gpt.eos_token_id=" + eos + " --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ids_of(r.out), all) << r.out;
  // --stop-ids names the stops instead (299: one the walk never reaches).
  EXPECT_EQ(std::count(all.begin(), all.end(), "299"), 0) << r.out;
  r = run(base + " --set model.gpt.eos_token_id=" + eos + " --stop-ids 299");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ids_of(r.out), all) << r.out;
  EXPECT_FALSE(has(r.err, "stopped at")) << r.err;

  std::string long_prompt = "1";
  for (int i = 2; i <= 20; ++i) long_prompt += "," + std::to_string(i);
  r = run("sample " + (run_dir / "config.toml").string() + " --checkpoint " + run_dir.string() +
          " --prompt-ids " + long_prompt + " --print-ids --tokens 1 --set data.block_size=16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err,
                  "the context is data.block_size = 16 tokens, but the model has 64 "
                  "positions"))
      << r.err;
  EXPECT_TRUE(has(r.err, "--set data.block_size=64")) << r.err;
  EXPECT_TRUE(has(r.err, "the prompt's first 4 of 20 tokens are left out")) << r.err;
}

// A vocabulary other than bytes (token ids of a walk over 64, the output layer 300 wide) takes and
// prints ids only; an id outside it, or a malformed list, exits 2 naming it.
TEST_F(CliGpt, SampleTakesAndPrintsIdsOfAnyVocabularyAndRefusesIdsOutsideIt) {
  write_token_walk(dir_ / "train.bin", 3000, 1);
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("gpt-tiny-fp32.toml") + kSmall +
               " --set data.source=tokens --set data.train=" + (dir_ / "train.bin").string() +
               " --set data.vocab_size=300 --set run.steps=2 --set run.eval_every=0 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string base =
      "sample " + (run_dir / "config.toml").string() + " --checkpoint " + run_dir.string();
  r = run(base + " --prompt-ids 299,0,17 --print-ids --tokens 4 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.out.rfind("299,0,17,", 0), 0u) << r.out;
  int count = 0;
  for (std::size_t at = 0; at != std::string::npos; at = r.out.find(',', at + 1)) ++count;
  EXPECT_EQ(count, 3 + 4) << r.out;

  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--prompt-ids 5,300 --print-ids",
            "--prompt-ids: token id 300 (item 2) is outside this model's vocabulary of 300 "
            "tokens (ids 0 to 299)"},
           {"--prompt 'the ' --print-ids",
            "--prompt is read as bytes, the token ids of a byte-level model (data.source = "
            "\"text\" or a vocabulary of 256), but this model's vocabulary has 300 tokens"},
           {"--prompt-ids 5,6", "add --print-ids"},
           {"--prompt-ids 5,6 --print-ids --stop-ids 7,300",
            "--stop-ids: token id 300 (item 2) is outside this model's vocabulary"},
           {"--prompt-ids 5,6 --print-ids --stop-ids 7,300",
            "HINT: give the ids of tokens the model can produce"}}) {
    r = run(base + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.out << r.err;
    EXPECT_TRUE(has(r.err, says)) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;  // nothing printed before the refusal
  }
}

// Weights that hold NaN make NaN logits: sample stops with exit 2 instead of printing the
// argmax of NaNs (id 0) as text, greedy and sampled alike.
TEST_F(CliGpt, SampleFromNonFiniteLogitsExitsTwo) {
  const auto weights = dir_ / "initial.safetensors";
  auto r = run("export " + config("gpt-tiny-fp32.toml") + kSmall +
               " --initial --out " + weights.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto st = read_st(weights);
  auto* bias = st.find("ln_f.bias");
  ASSERT_NE(bias, nullptr);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bias->bytes.data(), &nan, sizeof nan);
  write_st(dir_ / "nan.safetensors", st);
  for (const std::string how : {"--temperature 0", "--temperature 1 --seed 3"}) {
    r = run("sample " + config("gpt-tiny-fp32.toml") + kSmall + " --checkpoint " +
            (dir_ / "nan.safetensors").string() + " --prompt-ids 1,2 --print-ids --tokens 3 " +
            how);
    EXPECT_EQ(r.exit_code, 2) << how << ": " << r.out << r.err;
    EXPECT_TRUE(has(r.err, "the model's logits for generated token 1 are not finite")) << r.err;
  }
  // `eval` of the same weights reports its loss as null (JSON has no NaN), says why, and exits 3
  // as a diverged run does (0 would read as a result to a script that gates on it).
  r = run("eval " + config("gpt-tiny-fp32.toml") + kSmall + " --checkpoint " +
          (dir_ / "nan.safetensors").string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(json::parse(r.out)["eval_loss"].is_null()) << r.out;
  EXPECT_TRUE(has(r.err, "the evaluation's loss is not finite")) << r.err;
  // Said whatever the log level, as a diverged run's error is.
  r = run("--log-level off eval " + config("gpt-tiny-fp32.toml") + kSmall + " --checkpoint " +
          (dir_ / "nan.safetensors").string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(has(r.err, "error: the evaluation's loss is not finite")) << r.err;
  // So does `predict` of labelled windows, its predictions written all the same.
  r = run("predict " + config("gpt-tiny-fp32.toml") + kSmall + " --checkpoint " +
          (dir_ / "nan.safetensors").string() + " --input /usr/share/common-licenses/GPL-3 --out " +
          (dir_ / "p.npy").string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "p.npy"));
  EXPECT_TRUE(json::parse(r.out)["loss"].is_null()) << r.out;
  EXPECT_TRUE(has(r.err, "the evaluation's loss is not finite")) << r.err;
}

TEST_F(CliGpt, SampleWithAnotherModelsCheckpointExits2NamingTheMismatch) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("gpt-tiny-fp32.toml") + kSmall +
               " --set run.steps=2 --set run.eval_every=0 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The same config, one layer narrower: the checkpoint's tensors do not fit.
  r = run("sample " + config("gpt-tiny-fp32.toml") + kSmall +
          " --set model.gpt.n_embd=32 --checkpoint " + run_dir.string() +
          " --prompt 'x' --tokens 3");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("wte.weight"), std::string::npos) << r.err;
  // A model that is not a language model cannot sample: said first (not its vocabulary), with
  // nothing printed.
  r = run("sample " + quickstart() + " --checkpoint " + run_dir.string() + " --prompt-ids 1,2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("this model does not read token ids"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(CliGpt, SampleArgumentsOutOfRangeExit2BeforeAnythingLoads) {
  // The checkpoint does not exist: the arguments are refused before it is looked for.
  const std::string base = "sample " + config("gpt-tiny-fp32.toml") + " --checkpoint missing ";
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--temperature nan", "--temperature nan is not a finite number"},
           {"--temperature -1", "is not a finite number >= 0"},
           {"--tokens 10000000000", "--tokens: 10000000000 is out of range"},
           {"--tokens -3", "give a whole number from 0 to 1000000"},
           {"--top-k -1", "--top-k: -1 is out of range"},
           {"--top-p 0", "--top-p 0 is outside (0, 1]"},
           {"--top-p 1.5", "--top-p 1.5 is outside (0, 1]"},
           {"--top-p nan", "--top-p nan is outside (0, 1]"},
           {"--repetition-penalty 0", "--repetition-penalty 0 is not a finite number > 0"},
           {"--repetition-penalty inf", "--repetition-penalty inf is not a finite number > 0"},
           // A double above 0 that is 0 as the float it is applied as.
           {"--repetition-penalty 1e-320", "is not a finite number > 0 as a float"},
           {"--stop-ids 3,x", "--stop-ids: item 2 of '3,x', 'x', is not a whole number"},
           {"--prompt-ids 12,,3", "--prompt-ids: item 2 of '12,,3' is empty"},
           {"--prompt-ids 12,x7", "--prompt-ids: item 2 of '12,x7', 'x7', is not a whole number"},
           {"--prompt-ids 12,-1", "-1, is out of range: a token id is from 0 to 2147483647"},
           {"--prompt-ids 4294967296", "4294967296, is out of range"},
           {"--prompt-ids ''", "--prompt-ids: item 1 of '' is empty"}}) {
    // --prompt-ids replaces the prompt (the two exclude each other).
    auto r = run(base + (has(args, "--prompt-ids") ? "" : "--prompt x ") + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("missing"), std::string::npos) << args << ": " << r.err;
  }
  // Neither --prompt nor --prompt-ids: there is nothing to continue.
  auto r = run(base + "--tokens 3");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "sample needs a prompt to continue")) << r.err;
  EXPECT_TRUE(has(r.err, "--prompt-ids ID,ID,...")) << r.err;
  EXPECT_EQ(r.err.find("missing"), std::string::npos) << r.err;
  // An empty one neither.
  r = run(base + "--prompt ''");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "the prompt is empty")) << r.err;
  EXPECT_EQ(r.err.find("missing"), std::string::npos) << r.err;
}

// An embedding table smaller than the token data's vocabulary is refused at its node when the
// model is planned, not at the first gather of an id past it.
TEST_F(CliGpt, AnEmbeddingSmallerThanTheVocabularyExits2AtItsNode) {
  const auto cfg = write_file("small_table.toml", R"([data]
source = "text"
block_size = 16
batch_size = 4
[data.text]
path = "/usr/share/common-licenses/GPL-3"
[model]
nodes = [
  { name = "wte", type = "embedding", vocab = 200, dim = 16, inputs = ["input"] },
  { name = "head", type = "linear", out = 256, inputs = ["wte"] },
]
)");
  auto r = run("check " + cfg.string() + " --skip-rehearsal");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "small_table.toml:")) << r.err;
  EXPECT_TRUE(has(r.err,
                  "node 'wte' (embedding): vocab = 200 rows, but the token data's ids run "
                  "to 255 (its vocabulary of 256)"))
      << r.err;
  EXPECT_TRUE(has(r.err, "set vocab = 256")) << r.err;
  // A larger table is fine.
  const auto big = write_file("big_table.toml", slurp(cfg));
  std::string text = slurp(big);
  text.replace(text.find("vocab = 200"), 11, "vocab = 300");
  write_file("big_table.toml", text);
  r = run("check " + big.string() + " --skip-rehearsal");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A preset's table is made from its key: the hint names the key the user sets.
  r = run("check " + config("gpt-tiny-fp32.toml") + " --skip-rehearsal" +
          " --set model.gpt.vocab_size=100");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "set model.gpt.vocab_size = 256")) << r.err;
  r = run("check " + config("resnet20-fp32.toml") + " --skip-rehearsal" +
          " --set model.resnet.classes=7");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "set model.resnet.classes = 10")) << r.err;
}

// A held-out file that is also a training file (here the same text, once through a link) is
// said: the row-level split that keeps training rows out of evaluation does not apply to named
// held-out files.
TEST_F(CliGpt, AHeldOutFileThatIsAlsoATrainingFileIsWarnedOf) {
  fs::create_symlink("/usr/share/common-licenses/GPL-3", dir_ / "same.txt");
  const auto cfg = write_file("both.toml", R"([run]
steps = 1
[data]
source = "text"
block_size = 16
batch_size = 4
[data.text]
path = "/usr/share/common-licenses/GPL-3"
eval = "same.txt"
[model]
preset = "gpt"
[model.gpt]
n_layer = 1
n_head = 2
n_embd = 16
)");
  auto r = run("train " + cfg.string() + " --run-dir " + (dir_ / "r").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "same.txt' is also a training file")) << r.err;
  r = run("train " + cfg.string() + " --run-dir " + (dir_ / "r2").string() +
          " --set data.text.eval=/usr/share/common-licenses/GPL-2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "is also a training file")) << r.err;
}

TEST_F(CliGpt, WidthNotDivisibleByHeadsExits2AtTheConfigLine) {
  auto r = run("check " + config("gpt-tiny-fp32.toml") + " --set model.gpt.n_head=5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("n_embd = 128 is not divisible by n_head = 5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.gpt.n_head"), std::string::npos) << r.err;
}

// [model] loss_chunk_rows: the LM head and the loss in blocks of 100 of the batch's 512 rows train
// as the whole logits do, and the run says it does. fp32: the same losses to a few ulps. bf16: each
// block's logits gradient is rounded to bf16 from a seed scaled by the block's share, so a value
// may round the other way, 2^-8 apart (measured: 1e-7 of the loss after 6 steps; bound 1e-4).
TEST_F(CliGpt, TheLossInBlocksOfRowsTrainsAsTheWholeLogits) {
  for (const std::string policy : {"fp32", "bf16"}) {
    const std::string args = "train " + config("gpt-tiny-" + policy + ".toml") + kSmall +
                             " --set run.steps=6 --set run.eval_every=6 --set run.log_every=1";
    auto whole = run(args + " --set model.loss_chunk_rows=0 --run-dir " +
                     (dir_ / (policy + "-whole")).string());
    auto blocks = run(args + " --set model.loss_chunk_rows=100 --run-dir " +
                      (dir_ / (policy + "-blocks")).string());
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    ASSERT_EQ(blocks.exit_code, 0) << blocks.err;
    EXPECT_NE((blocks.out + blocks.err).find("run 100 rows at a time"), std::string::npos)
        << blocks.err;
    EXPECT_EQ((whole.out + whole.err).find("rows at a time"), std::string::npos) << whole.err;
    auto losses = [&](const std::string& run) {
      std::vector<double> v;
      for (const auto& rec : records(dir_ / run / "metrics.jsonl")) {
        if (rec.contains("loss")) v.push_back(rec["loss"].get<double>());
        if (rec.contains("eval_loss")) v.push_back(rec["eval_loss"].get<double>());
      }
      return v;
    };
    const auto a = losses(policy + "-whole"), b = losses(policy + "-blocks");
    ASSERT_EQ(a.size(), 7u);
    ASSERT_EQ(b.size(), a.size());
    const double tolerance = policy == "fp32" ? 1e-5 : 1e-4;
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(b[i], a[i], tolerance * a[i]) << policy << ", record " << i;
  }
  auto bad = run("check " + config("gpt-tiny-fp32.toml") + " --set model.loss_chunk_rows=-1");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("model.loss_chunk_rows"), std::string::npos) << bad.err;
}

}  // namespace

// --profile times every backend op after the first step, by scope, and changes no result.
TEST_F(CliGpt, ProfileBreaksTheStepDownByOpAndChangesNothing) {
  const std::string args = "train " + config("gpt-tiny-fp32.toml") + kSmall +
                           " --set run.steps=6 --set run.eval_every=0 --set run.log_every=1";
  auto plain = run(args + " --run-dir " + (dir_ / "plain").string());
  auto profiled = run(args + " --profile --run-dir " + (dir_ / "profiled").string());
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(profiled.exit_code, 0) << profiled.err;
  std::vector<double> a, b;
  for (const auto& rec : records(dir_ / "plain" / "metrics.jsonl"))
    if (rec.contains("loss")) a.push_back(rec["loss"].get<double>());
  for (const auto& rec : records(dir_ / "profiled" / "metrics.jsonl"))
    if (rec.contains("loss")) b.push_back(rec["loss"].get<double>());
  EXPECT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b) << "profiling changed the losses";
  EXPECT_NE(profiled.out.find("profile: 5 steps"), std::string::npos) << profiled.out;
  EXPECT_EQ(plain.out.find("profile:"), std::string::npos);

  const json p = json::parse(slurp(dir_ / "profiled" / "profile.json"));
  EXPECT_EQ(p["steps"], 5);
  auto calls = [&](const std::string& scope, const std::string& op) -> std::int64_t {
    for (const auto& e : p["entries"])
      if (e["scope"] == scope && e["op"] == op) return e["calls"].get<std::int64_t>();
    return 0;
  };
  // Two layers, five steps: one flash attention forward and backward per layer and step (the
  // CPU backend offers it, so no softmax or batched GEMM of attention runs), the loss once per
  // step, AdamW over its decayed and undecayed groups every step (the gated update: queued before
  // the host reads the gradient check).
  EXPECT_EQ(calls("attention", "flash_forward"), 10);
  EXPECT_EQ(calls("attention", "flash_backward"), 10);
  EXPECT_EQ(calls("attention", "softmax_forward"), 0);
  EXPECT_EQ(calls("attention", "gemm_strided_batched"), 0);
  EXPECT_EQ(calls("classifier", "softmax_cross_entropy"), 5);
  EXPECT_EQ(calls("optimizer", "adamw_update_gated"), 10);
  EXPECT_EQ(calls("optimizer", "adamw_update"), 0);
  EXPECT_EQ(calls("embedding", "scatter_add"), 5);
  EXPECT_GT(calls("linear", "gemm"), 0);
  double in_ops = 0;
  for (const auto& e : p["entries"]) in_ops += e["seconds"].get<double>();
  EXPECT_GT(in_ops, 0.0);
  EXPECT_LE(in_ops, p["recorded_seconds"].get<double>());

  // What ran the ops (the backend's plan_report facet): the CPU backend's oneDNN matmuls, each by
  // its problem and oneDNN's kernel, printed under the table and kept in profile.json. A GPT has
  // no convolution, so no such section.
  EXPECT_NE(profiled.out.find("plans: what the backend's libraries ran"), std::string::npos)
      << profiled.out;
  ASSERT_TRUE(p["plans"].contains("oneDNN GEMM")) << p["plans"].dump();
  EXPECT_FALSE(p["plans"].contains("oneDNN convolution and pooling")) << p["plans"].dump();
  const auto& gemms = p["plans"]["oneDNN GEMM"];
  EXPECT_FALSE(gemms.empty());
  for (const auto& line : gemms) {
    const std::string text = line.get<std::string>();
    EXPECT_TRUE(text.starts_with("m=")) << text;
    EXPECT_NE(text.find(": "), std::string::npos) << text;
    EXPECT_NE(profiled.out.find("    " + text + "\n"), std::string::npos) << text;
    // Each plan ran (a probe that ran nothing is left out), and says how often.
    EXPECT_TRUE(text.ends_with(" run") || text.ends_with(" runs")) << text;
    EXPECT_FALSE(text.starts_with("m=512 n=512 k=512 ")) << "the capabilities' probe: " << text;
  }
}

// Bad token data stops the run before training with exit 2, naming the file and the offset.
TEST_F(CliGpt, BadTokenFilesExit2NamingTheFileAndTheOffset) {
  write_token_walk(dir_ / "train.bin", 3000, 1);
  write_token_walk(dir_ / "eval.bin", 600, 2);
  const std::string base = "train " + config("gpt-tiny-fp32.toml") + kSmall +
                           " --set run.steps=1 --set data.source=tokens --set data.vocab_size=64" +
                           " --set data.eval=" + (dir_ / "eval.bin").string() + " --run-dir " +
                           (dir_ / "run").string();
  // --set data.train after the config's own text path: the tokens source reads train/eval.
  auto with_train = [&](const fs::path& train) {
    return run(base + " --set data.train=" + train.string());
  };
  // A wrong magic number.
  std::string bytes = slurp(dir_ / "train.bin");
  bytes[0] = 0x01;
  std::ofstream(dir_ / "magic.bin", std::ios::binary) << bytes;
  auto r = with_train(dir_ / "magic.bin");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("magic.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("byte offset 0"), std::string::npos) << r.err;
  // Truncated: the header promises 3000 tokens.
  std::ofstream(dir_ / "short.bin", std::ios::binary) << slurp(dir_ / "train.bin").substr(0, 2000);
  r = with_train(dir_ / "short.bin");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("short.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  // A token >= vocab_size (the walk's tokens are < 64).
  r = run(base + " --set data.train=" + (dir_ / "train.bin").string() +
          " --set data.vocab_size=32");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("vocab_size"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("byte offset"), std::string::npos) << r.err;
  // block_size longer than the held-out file.
  r = run(base + " --set data.train=" + (dir_ / "train.bin").string() +
          " --set data.block_size=1000");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("eval.bin"), std::string::npos) << r.err;
}

// Flash attention (the CPU backend's, the default) and the unfused attention
// (model.gpt.fused_attention = false) train the same model: each step's loss agrees within FP32
// summation order in fp32, and within a bf16 ulp in bf16 (the unfused path rounds P to bf16
// before P·v; flash keeps it in FP32 with FP32 tile products, and rounds it too, and dS, with the
// bf16 ones, forced here on any CPU: either way the attention outputs differ by about one bf16
// rounding). The profiles show which path each run took.
TEST_F(CliGpt, FlashAndUnfusedAttentionTrainTheSameLosses) {
  for (const std::string name : {"fp32", "bf16", "bf16-products"}) {
    const std::string policy = name == "fp32" ? "fp32" : "bf16";
    const std::string products =
        name == "bf16-products" ? " --set backend.cpu.flash_products=bf16" : "";
    const std::string args = "train " + config("gpt-tiny-" + policy + ".toml") + kSmall +
                             products +
                             " --set run.steps=5 --set run.eval_every=0 --set run.log_every=1"
                             " --profile";
    const auto flash_dir = dir_ / (name + "-flash"), unfused_dir = dir_ / (name + "-unfused");
    auto flash = run(args + " --run-dir " + flash_dir.string());
    auto unfused =
        run(args + " --set model.gpt.fused_attention=false --run-dir " + unfused_dir.string());
    ASSERT_EQ(flash.exit_code, 0) << flash.err;
    ASSERT_EQ(unfused.exit_code, 0) << unfused.err;
    auto losses = [&](const std::filesystem::path& d) {
      std::vector<double> v;
      for (const auto& rec : records(d / "metrics.jsonl"))
        if (rec.contains("loss")) v.push_back(rec["loss"].get<double>());
      return v;
    };
    const auto a = losses(flash_dir), b = losses(unfused_dir);
    ASSERT_EQ(a.size(), 5u) << name;
    ASSERT_EQ(b.size(), 5u) << name;
    const double tol = policy == "fp32" ? 1e-5 : 0x1p-7;  // relative; bf16: one of its ulps
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], b[i], tol * std::abs(b[i])) << name << " step " << i + 1;
    auto calls = [&](const std::filesystem::path& d, const std::string& op) -> std::int64_t {
      const json p = json::parse(slurp(d / "profile.json"));
      for (const auto& e : p["entries"])
        if (e["scope"] == "attention" && e["op"] == op) return e["calls"].get<std::int64_t>();
      return 0;
    };
    EXPECT_GT(calls(flash_dir, "flash_forward"), 0) << name;
    EXPECT_EQ(calls(flash_dir, "softmax_forward"), 0) << name;
    EXPECT_EQ(calls(unfused_dir, "flash_forward"), 0) << name;
    EXPECT_GT(calls(unfused_dir, "softmax_forward"), 0) << name;
    // Decoding runs the unfused method either way (a flash node's KV cache holds its own score
    // scratch): greedy samples of one checkpoint are the same text.
    const std::string sample = "sample " + (flash_dir / "config.toml").string() + " --checkpoint " +
                               flash_dir.string() +
                               " --prompt 'This Lic' --tokens 20 --temperature 0";
    auto a_text = run(sample);
    auto b_text = run(sample + " --set model.gpt.fused_attention=false");
    ASSERT_EQ(a_text.exit_code, 0) << a_text.err;
    ASSERT_EQ(b_text.exit_code, 0) << b_text.err;
    EXPECT_EQ(a_text.out, b_text.out) << name;
  }
}

// The CPU backend's flash_products takes auto, bf16 or fp32: anything else exits 2 at its line
// of the file, naming the choices; a forced choice says what runs.
TEST_F(CliGpt, FlashProductsTakesItsThreeChoicesOnly) {
  const std::string text = slurp(config("gpt-tiny-bf16.toml")) +
                           "\n[backend.cpu]\nflash_products = \"sometimes\"\n";
  const auto line = std::count(text.begin(), text.end(), '\n');
  const auto file = write_file("bad-products.toml", text);
  auto r = run("check " + file.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("'sometimes' is not a valid choice"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("one of: auto, bf16, fp32"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(file.string() + ":" + std::to_string(line) + ":"), std::string::npos)
      << r.err;
  auto forced = run("check " + config("gpt-tiny-bf16.toml") +
                    " --set backend.cpu.flash_products=fp32");
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.err.find("flash_products = fp32"), std::string::npos) << forced.err;
}

// The switch is a boolean of [model.gpt]: anything else exits 2 at its line of the file.
TEST_F(CliGpt, FusedAttentionTakesABooleanOnly) {
  std::ifstream in(config("gpt-tiny-fp32.toml"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string table = "[model.gpt]\n";
  const auto at = text.find(table);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + table.size(), "fused_attention = \"yes\"\n");
  const auto line =
      std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n') + 2;
  const auto file = write_file("bad.toml", text);
  auto r = run("check " + file.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("fused_attention"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(file.string() + ":" + std::to_string(line) + ":"), std::string::npos)
      << r.err;
}
